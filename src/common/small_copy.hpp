// small_copy.hpp — copies of a few bytes without a call into libc.
//
// memcpy with a length known only at run time is a call into libc (the PLT, then a dispatch on
// the size): about twenty instructions before the first byte moves. The small-message path
// copies a 16-byte header and a payload of a few words per message, so up to 32 bytes are
// copied inline here with two overlapping moves of a fixed size; longer copies go to libc.
// The ranges must not overlap (as for memcpy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ferry::detail {

inline void copy_small(void* dst, const void* src, std::size_t n) noexcept {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  if (n > 32) {
    std::memcpy(d, s, n);
  } else if (n >= 16) {
    unsigned char lo[16], hi[16];
    std::memcpy(lo, s, 16);
    std::memcpy(hi, s + n - 16, 16);
    std::memcpy(d, lo, 16);
    std::memcpy(d + n - 16, hi, 16);
  } else if (n >= 8) {
    std::uint64_t lo, hi;
    std::memcpy(&lo, s, 8);
    std::memcpy(&hi, s + n - 8, 8);
    std::memcpy(d, &lo, 8);
    std::memcpy(d + n - 8, &hi, 8);
  } else if (n >= 4) {
    std::uint32_t lo, hi;
    std::memcpy(&lo, s, 4);
    std::memcpy(&hi, s + n - 4, 4);
    std::memcpy(d, &lo, 4);
    std::memcpy(d + n - 4, &hi, 4);
  } else {
    for (std::size_t i = 0; i < n; ++i) d[i] = s[i];
  }
}

}  // namespace ferry::detail
