// check_parcel.hpp — what every parcelport checks of a parcel the application hands to send(),
// before any byte of it is read: each chunk with a size has data.
#pragma once

#include <string>

#include "ferry/error.hpp"
#include "ferry/parcel.hpp"

namespace ferry::parcel::detail {

inline void check_parcel_chunks(const std::string& call, const Parcel& parcel) {
  if (parcel.nzc.data == nullptr && parcel.nzc.size != 0) {
    throw Error(call + ": nzc chunk has size " + std::to_string(parcel.nzc.size) + " but no data");
  }
  for (std::size_t i = 0; i < parcel.zc.size(); ++i) {
    if (parcel.zc[i].data == nullptr && parcel.zc[i].size != 0) {
      throw Error(call + ": zc chunk " + std::to_string(i) + " has size " + std::to_string(parcel.zc[i].size) +
                  " but no data");
    }
  }
}

}  // namespace ferry::parcel::detail
