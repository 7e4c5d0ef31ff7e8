// mpi_header.hpp — the MPI parcelports' header on the wire ("mpi", "mpi_a", "mpix"), and its
// checks.
//
// A parcel's header travels as one MPI message on the header tag: an MpiParcelHeader, then one
// u64 size per zero-copy chunk, then the nzc bytes when they are piggybacked (otherwise they
// follow on the parcel's own tag, as the zero-copy chunks do). With mpi_a, the nzc starts with
// an aggregate index: a u64 count, then per parcel a u64 nzc size and a u64 zero-copy count,
// then the parcels' nzcs one after the other; the header's size table lists every parcel's
// zero-copy chunks in the same order. Both come from another process: nothing is read
// through them before check_mpi_header or check_aggregate_index has accepted them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/limits.hpp"

namespace ferry::parcel::detail {

using ferry::detail::kNoAllocation;

inline constexpr std::uint32_t kMpiSignature = 0x46525931u;  // catches a header layout mismatch
inline constexpr std::uint32_t kFlagPiggyback = 1u;          // the nzc follows the size table
inline constexpr std::uint32_t kFlagAggregate = 2u;          // the nzc is an mpi_a index + several nzcs

struct MpiParcelHeader {
  std::uint32_t signature;
  std::int32_t tag;
  std::uint32_t flags;
  std::uint32_t zc_count;
  std::uint64_t nzc_size;
  // then zc_count u64 sizes, then the nzc when kFlagPiggyback
};
static_assert(sizeof(MpiParcelHeader) == 24);

// A header that checked out: its fields, its size table, and its piggybacked nzc (if any).
struct MpiHeaderView {
  MpiParcelHeader h;
  const std::byte* sizes;
  const std::byte* nzc;
  bool piggyback() const noexcept { return (h.flags & kFlagPiggyback) != 0; }
  bool aggregate() const noexcept { return (h.flags & kFlagAggregate) != 0; }
};

// Checks `size` bytes at `base` as a header: signature and flags known, the size table within
// the bytes, and exactly the piggybacked nzc after it (or nothing, when the nzc follows on its
// own); an aggregate's nzc holds at least its count. False for anything else.
inline bool check_mpi_header(const std::byte* base, std::size_t size, MpiHeaderView& out) noexcept {
  if (base == nullptr || size < sizeof(MpiParcelHeader)) return false;
  std::memcpy(&out.h, base, sizeof out.h);
  if (out.h.signature != kMpiSignature || (out.h.flags & ~(kFlagPiggyback | kFlagAggregate)) != 0) return false;
  // Sizes no allocation meets are refused here, so a hostile size is a dropped header, never an
  // allocation failure or a size handed to the application's allocate_zc_chunks.
  if (out.h.nzc_size >= kNoAllocation || out.h.tag < 0) return false;
  const std::size_t room = size - sizeof(MpiParcelHeader);
  const std::size_t table = std::size_t{out.h.zc_count} * sizeof(std::uint64_t);
  if (table > room) return false;
  if (room - table != (out.piggyback() ? out.h.nzc_size : 0)) return false;
  if (out.aggregate() && out.h.nzc_size < sizeof(std::uint64_t)) return false;
  out.sizes = base + sizeof(MpiParcelHeader);
  out.nzc = out.sizes + table;
  return ferry::detail::sizes_allocatable(out.sizes, out.h.zc_count);
}

// Zero-copy size i of a checked header (i < zc_count).
inline std::uint64_t mpi_zc_size(const MpiHeaderView& v, std::size_t i) noexcept {
  std::uint64_t s;
  std::memcpy(&s, v.sizes + i * sizeof s, sizeof s);
  return s;
}

// One parcel of an aggregate: its nzc (offset and size within the aggregate's nzc) and how many
// of the message's zero-copy chunks are its own, in order.
struct AggregatePart {
  std::size_t nzc_offset;
  std::size_t nzc_size;
  std::size_t zc_count;
};

inline std::size_t aggregate_index_size(std::size_t count) noexcept { return 8 + count * 16; }

// Checks the aggregate index at the start of an nzc of `size` bytes whose message carried
// `zc_total` zero-copy chunks: the index lies within the nzc, the parcels' nzcs exactly fill
// the rest, and their zero-copy counts add up to zc_total. Fills `parts`; false for anything else.
inline bool check_aggregate_index(const std::byte* base, std::size_t size, std::size_t zc_total,
                                  std::vector<AggregatePart>& parts) {
  parts.clear();
  if (base == nullptr || size < 8) return false;
  std::uint64_t count = 0;
  std::memcpy(&count, base, 8);
  if (count > (size - 8) / 16) return false;
  std::size_t at = aggregate_index_size(static_cast<std::size_t>(count));
  std::size_t zc_at = 0;
  parts.reserve(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < count; ++i) {
    std::uint64_t entry[2];
    std::memcpy(entry, base + 8 + 16 * i, 16);
    if (entry[0] > size - at || entry[1] > zc_total - zc_at) return false;
    parts.push_back({at, static_cast<std::size_t>(entry[0]), static_cast<std::size_t>(entry[1])});
    at += static_cast<std::size_t>(entry[0]);
    zc_at += static_cast<std::size_t>(entry[1]);
  }
  return at == size && zc_at == zc_total;
}

}  // namespace ferry::parcel::detail
