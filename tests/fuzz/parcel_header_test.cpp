// The ferry parcelport's header check (src/parcel/header.hpp): a header is read only when its
// size table, its piggybacked nzc and its iovec parts agree with the bytes that arrived.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "parcel/header.hpp"

namespace {

using ferry::parcel::detail::check_header;
using ferry::parcel::detail::HeaderView;
using ferry::parcel::detail::ParcelHeader;

std::vector<std::byte> header(std::uint16_t zc_count, std::uint32_t nzc_size, bool piggyback, std::size_t extra) {
  ParcelHeader h{7, nzc_size, zc_count, static_cast<std::uint8_t>(piggyback ? 1 : 0), 0, 0};
  std::vector<std::byte> b(sizeof h + extra);
  std::memcpy(b.data(), &h, sizeof h);
  for (std::uint16_t i = 0; i < zc_count && sizeof h + (i + 1) * 8u <= b.size(); ++i) {
    const std::uint64_t s = 100u + i;
    std::memcpy(b.data() + sizeof h + i * 8u, &s, 8);
  }
  return b;
}

TEST(ParcelHeader, AWellFormedHeaderIsReadInFull) {
  const auto b = header(3, 5, true, 3 * 8 + 5);
  HeaderView v;
  ASSERT_TRUE(check_header(b.data(), b.size(), 0, v));
  EXPECT_EQ(v.h.zc_count, 3);
  EXPECT_EQ(ferry::parcel::detail::zc_size(v, 2), 102u);
  EXPECT_EQ(v.nzc, b.data() + sizeof(ParcelHeader) + 24);
}

TEST(ParcelHeader, ASizeTablePastTheBytesIsRefused) {
  const auto b = header(1000, 0, false, 16);  // 1000 sizes claimed, room for 2
  HeaderView v;
  EXPECT_FALSE(check_header(b.data(), b.size(), 0, v));
}

TEST(ParcelHeader, APiggybackedNzcPastTheBytesIsRefused) {
  const auto b = header(1, 4000, true, 8 + 10);
  HeaderView v;
  EXPECT_FALSE(check_header(b.data(), b.size(), 0, v));
  const auto ok = header(1, 10, true, 8 + 10);
  EXPECT_TRUE(check_header(ok.data(), ok.size(), 0, v));
}

TEST(ParcelHeader, IovecPartsMustBeTheFollowUpsTheHeaderCounts) {
  HeaderView v;
  const auto piggy = header(2, 0, true, 16);     // parts: the 2 zero-copy chunks
  EXPECT_TRUE(check_header(piggy.data(), piggy.size(), 2, v));
  EXPECT_FALSE(check_header(piggy.data(), piggy.size(), 3, v));
  const auto apart = header(2, 50, false, 16);   // parts: the nzc, then the 2 chunks
  EXPECT_TRUE(check_header(apart.data(), apart.size(), 3, v));
  EXPECT_FALSE(check_header(apart.data(), apart.size(), 1, v));
}

TEST(ParcelHeader, FewerBytesThanTheFixedPartAreRefused) {
  const auto b = header(0, 0, false, 0);
  HeaderView v;
  EXPECT_FALSE(check_header(b.data(), sizeof(ParcelHeader) - 1, 0, v));
  EXPECT_FALSE(check_header(nullptr, 0, 0, v));
  EXPECT_TRUE(check_header(b.data(), b.size(), 0, v));
}

TEST(ParcelHeader, AZeroCopySizeNoAllocationMeetsIsRefused) {
  auto b = header(2, 0, true, 16);
  HeaderView v;
  ASSERT_TRUE(check_header(b.data(), b.size(), 0, v));
  const std::uint64_t too_big = ferry::detail::kNoAllocation;
  std::memcpy(b.data() + sizeof(ParcelHeader) + 8, &too_big, 8);
  EXPECT_FALSE(check_header(b.data(), b.size(), 0, v));
}

}  // namespace
