// copy_small: every length from 0 to past its inline range copies exactly the bytes asked for,
// at every alignment, and writes nothing outside the destination range.
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "common/small_copy.hpp"

namespace {

TEST(SmallCopy, CopiesExactlyTheRangeAtEveryLengthAndAlignment) {
  constexpr std::size_t kGuard = 40;
  for (std::size_t n = 0; n <= 72; ++n) {
    for (std::size_t src_off = 0; src_off < 8; ++src_off) {
      for (std::size_t dst_off = 0; dst_off < 8; ++dst_off) {
        std::vector<unsigned char> src(n + 16), dst(n + 2 * kGuard, 0xEE);
        for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 1);
        ferry::detail::copy_small(dst.data() + kGuard + dst_off, src.data() + src_off, n);
        for (std::size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= kGuard + dst_off && i < kGuard + dst_off + n;
          const unsigned char want = inside ? src[i - kGuard - dst_off + src_off] : 0xEE;
          ASSERT_EQ(dst[i], want) << "n " << n << " src offset " << src_off << " dst offset " << dst_off << " byte " << i;
        }
      }
    }
  }
}

}  // namespace
