// ferry_parcelport.hpp — the parcel layer over ferry's core.
#pragma once

#include <memory>

#include "ferry/parcel.hpp"

namespace ferry::parcel::detail {

std::unique_ptr<Parcelport> make_ferry_parcelport(const ParcelportOptions& options, Upcalls& upcalls);

}  // namespace ferry::parcel::detail
