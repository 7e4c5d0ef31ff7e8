// config.hpp — the core's resolved options, as the core's objects read them (the table is
// runtime_option_table() in ferry/options.hpp, resolved in options.cpp).
#pragma once

#include <cstddef>
#include <string_view>

#include "ferry/options.hpp"

namespace ferry::detail {

using Config = RuntimeSettings;

// "4096", "8k", "64KiB", "1M", "2g" -> bytes. `what` names the setting in the error message.
std::size_t parse_size(std::string_view what, std::string_view text);

}  // namespace ferry::detail
