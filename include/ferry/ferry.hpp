// ferry/ferry.hpp — everything an application needs.
#pragma once

#include "ferry/coll.hpp"
#include "ferry/completion.hpp"
#include "ferry/datatype.hpp"
#include "ferry/error.hpp"
#include "ferry/options.hpp"
#include "ferry/runtime.hpp"
#include "ferry/status.hpp"
