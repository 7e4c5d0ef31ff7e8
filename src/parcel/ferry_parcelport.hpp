// ferry_parcelport.hpp — the parcel transport over ferry's core.
#pragma once

#include <memory>

#include "ferry/parcel.hpp"

namespace ferry::parcel::detail {

std::unique_ptr<Transport> make_ferry_transport(const TransportOptions& options, Upcalls& upcalls);

}  // namespace ferry::parcel::detail
