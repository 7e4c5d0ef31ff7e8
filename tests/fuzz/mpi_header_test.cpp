// The MPI parcelports' header and aggregate index checks (src/parcel/mpi_header.hpp): nothing
// is read through a header or an index unless every count and length agrees with the bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "parcel/mpi_header.hpp"

namespace {

namespace d = ferry::parcel::detail;

std::vector<std::byte> header(std::uint32_t flags, std::uint32_t zc_count, std::uint64_t nzc_size, std::size_t extra,
                              std::uint32_t signature = d::kMpiSignature) {
  d::MpiParcelHeader h{signature, 9, flags, zc_count, nzc_size};
  std::vector<std::byte> b(sizeof h + extra);
  std::memcpy(b.data(), &h, sizeof h);
  for (std::uint32_t i = 0; i < zc_count && sizeof h + (i + 1) * 8u <= b.size(); ++i) {
    const std::uint64_t s = 100u + i;
    std::memcpy(b.data() + sizeof h + i * 8u, &s, 8);
  }
  return b;
}

std::vector<std::byte> index(const std::vector<std::pair<std::uint64_t, std::uint64_t>>& entries, std::size_t nzc_bytes,
                             std::uint64_t count_override = ~std::uint64_t{0}) {
  std::vector<std::byte> b(d::aggregate_index_size(entries.size()) + nzc_bytes);
  const std::uint64_t count = count_override != ~std::uint64_t{0} ? count_override : entries.size();
  std::memcpy(b.data(), &count, 8);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const std::uint64_t e[2] = {entries[i].first, entries[i].second};
    std::memcpy(b.data() + 8 + 16 * i, e, 16);
  }
  return b;
}

TEST(MpiParcelHeader, AWellFormedHeaderIsReadInFull) {
  const auto b = header(d::kFlagPiggyback, 2, 5, 2 * 8 + 5);
  d::MpiHeaderView v;
  ASSERT_TRUE(d::check_mpi_header(b.data(), b.size(), v));
  EXPECT_EQ(v.h.tag, 9);
  EXPECT_EQ(d::mpi_zc_size(v, 1), 101u);
  EXPECT_EQ(v.nzc, b.data() + sizeof(d::MpiParcelHeader) + 16);
  const auto apart = header(0, 1, 1 << 20, 8);  // the nzc follows on its own
  EXPECT_TRUE(d::check_mpi_header(apart.data(), apart.size(), v));
  EXPECT_FALSE(v.piggyback());
}

TEST(MpiParcelHeader, ShortBytesAWrongSignatureOrAnUnknownFlagAreRefused) {
  d::MpiHeaderView v;
  const auto b = header(0, 0, 0, 0);
  EXPECT_FALSE(d::check_mpi_header(b.data(), b.size() - 1, v));
  EXPECT_FALSE(d::check_mpi_header(nullptr, 0, v));
  const auto sig = header(0, 0, 0, 0, 0x12345678u);
  EXPECT_FALSE(d::check_mpi_header(sig.data(), sig.size(), v));
  const auto flag = header(4, 0, 0, 0);
  EXPECT_FALSE(d::check_mpi_header(flag.data(), flag.size(), v));
}

TEST(MpiParcelHeader, ASizeTableOrAPiggybackedNzcThatDisagreesWithTheBytesIsRefused) {
  d::MpiHeaderView v;
  const auto table = header(0, 1000000, 0, 16);  // a million sizes claimed, room for 2
  EXPECT_FALSE(d::check_mpi_header(table.data(), table.size(), v));
  const auto longer = header(d::kFlagPiggyback, 0, 4000, 10);
  EXPECT_FALSE(d::check_mpi_header(longer.data(), longer.size(), v));
  const auto shorter = header(d::kFlagPiggyback, 0, 4, 10);
  EXPECT_FALSE(d::check_mpi_header(shorter.data(), shorter.size(), v));
  const auto trailing = header(0, 0, 10, 3);  // not piggybacked, yet bytes after the table
  EXPECT_FALSE(d::check_mpi_header(trailing.data(), trailing.size(), v));
}

TEST(MpiParcelHeader, ASizeNoAllocationMeetsIsRefusedBeforeTheAllocator) {
  d::MpiHeaderView v;
  const auto huge = header(0, 0, d::kNoAllocation, 0);
  EXPECT_FALSE(d::check_mpi_header(huge.data(), huge.size(), v));
  const auto largest = header(0, 0, d::kNoAllocation - 1, 0);
  EXPECT_TRUE(d::check_mpi_header(largest.data(), largest.size(), v));
  auto zc = header(0, 2, 0, 16);  // the second zero-copy size: no allocation meets it
  const std::uint64_t too_big = d::kNoAllocation;
  std::memcpy(zc.data() + sizeof(d::MpiParcelHeader) + 8, &too_big, 8);
  EXPECT_FALSE(d::check_mpi_header(zc.data(), zc.size(), v));
  const auto aggregate_without_index = header(d::kFlagAggregate | d::kFlagPiggyback, 0, 4, 4);
  EXPECT_FALSE(d::check_mpi_header(aggregate_without_index.data(), aggregate_without_index.size(), v));
}

TEST(MpiAggregateIndex, AWellFormedIndexSplitsTheNzcAndTheChunks) {
  const auto b = index({{10, 1}, {0, 0}, {5, 2}}, 15);
  std::vector<d::AggregatePart> parts;
  ASSERT_TRUE(d::check_aggregate_index(b.data(), b.size(), 3, parts));
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].nzc_offset, d::aggregate_index_size(3));
  EXPECT_EQ(parts[2].nzc_offset, d::aggregate_index_size(3) + 10);
  EXPECT_EQ(parts[2].nzc_size, 5u);
  EXPECT_EQ(parts[2].zc_count, 2u);
}

TEST(MpiAggregateIndex, CountsAndSizesThatDisagreeWithTheBytesAreRefused) {
  std::vector<d::AggregatePart> parts;
  const auto count = index({{1, 0}}, 1, 1000000);  // a million entries claimed
  EXPECT_FALSE(d::check_aggregate_index(count.data(), count.size(), 0, parts));
  const auto past = index({{~std::uint64_t{0} - 4, 0}}, 8);  // an nzc size past the bytes (and wrapping)
  EXPECT_FALSE(d::check_aggregate_index(past.data(), past.size(), 0, parts));
  const auto gap = index({{4, 0}}, 8);  // the parcels leave bytes over
  EXPECT_FALSE(d::check_aggregate_index(gap.data(), gap.size(), 0, parts));
  const auto chunks = index({{4, 3}}, 4);  // more chunks than the message carried
  EXPECT_FALSE(d::check_aggregate_index(chunks.data(), chunks.size(), 2, parts));
  const auto fewer = index({{4, 1}}, 4);  // fewer chunks than the message carried
  EXPECT_FALSE(d::check_aggregate_index(fewer.data(), fewer.size(), 2, parts));
  EXPECT_FALSE(d::check_aggregate_index(count.data(), 7, 0, parts));
}

}  // namespace
