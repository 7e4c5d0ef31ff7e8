// small_copy.hpp — copies of a few bytes without a call into libc.
//
// memcpy with a length known only at run time is a call into libc (the PLT, then a dispatch on
// the size): about twenty instructions before the first byte moves. The small-message path
// copies a 16-byte header and a payload of a few words per message, so up to 32 bytes are
// copied inline here with two overlapping moves of a fixed size; longer copies go to libc.
// The ranges must not overlap (as for memcpy).
#pragma once

#include <cstddef>
#include <cstring>

namespace ferry::detail {

// n in [W, 2W]: the first and the last W bytes, as two loads then two stores (they overlap
// when n < 2W, harmlessly: both carry the same source bytes).
template <std::size_t W>
inline void copy_two_words(unsigned char* d, const unsigned char* s, std::size_t n) noexcept {
  unsigned char lo[W], hi[W];
  std::memcpy(lo, s, W);
  std::memcpy(hi, s + n - W, W);
  std::memcpy(d, lo, W);
  std::memcpy(d + n - W, hi, W);
}

inline void copy_small(void* dst, const void* src, std::size_t n) noexcept {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  if (n > 32) {
    std::memcpy(d, s, n);
  } else if (n >= 16) {
    copy_two_words<16>(d, s, n);
  } else if (n >= 8) {
    copy_two_words<8>(d, s, n);
  } else if (n >= 4) {
    copy_two_words<4>(d, s, n);
  } else {
    for (std::size_t i = 0; i < n; ++i) d[i] = s[i];
  }
}

}  // namespace ferry::detail
