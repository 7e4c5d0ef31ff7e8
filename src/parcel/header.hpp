// header.hpp — the ferry parcelport's header on the wire, and its check.
//
// A parcel's header travels as one active message (or tagged send): a ParcelHeader, then one
// u64 size per zero-copy chunk, then the non-zero-copy bytes when they are piggybacked. With
// iovec, the follow-ups (the nzc unless piggybacked, then every zero-copy chunk) come as the
// message's parts. The header comes from another process: check_header validates every count
// and length against the bytes that arrived before anything is read through it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/limits.hpp"

namespace ferry::parcel::detail {

struct ParcelHeader {
  std::uint32_t tag;       // follow-up tag; 0 when there are none
  std::uint32_t nzc_size;
  std::uint16_t zc_count;
  std::uint8_t piggyback;  // the nzc bytes follow the size table
  std::uint8_t device;     // the device the follow-ups use
  std::uint32_t reserved;
};
static_assert(sizeof(ParcelHeader) == 16);

// A header that checked out: its fields, where its size table starts, and where a piggybacked
// nzc starts (right after the table).
struct HeaderView {
  ParcelHeader h;
  const std::byte* sizes;
  const std::byte* nzc;
};

// Checks `size` bytes at `base` as a header that came with `parts` iovec parts (0 without
// iovec): the fixed part, the size table and a piggybacked nzc lie within the bytes, and the
// parts are the follow-ups the header counts. False for anything else.
inline bool check_header(const std::byte* base, std::size_t size, std::size_t parts, HeaderView& out) noexcept {
  if (base == nullptr || size < sizeof(ParcelHeader)) return false;
  std::memcpy(&out.h, base, sizeof out.h);
  const std::size_t room = size - sizeof(ParcelHeader);
  const std::size_t table = std::size_t{out.h.zc_count} * sizeof(std::uint64_t);
  if (table > room) return false;
  if (out.h.piggyback && out.h.nzc_size > room - table) return false;
  if (parts != 0 && parts != std::size_t{out.h.zc_count} + (out.h.piggyback ? 0 : 1)) return false;
  out.sizes = base + sizeof(ParcelHeader);
  out.nzc = out.sizes + table;
  // A size no allocation meets never reaches the application's allocate_zc_chunks.
  return ferry::detail::sizes_allocatable(out.sizes, out.h.zc_count);
}

// Zero-copy size i of a checked header (i < zc_count).
inline std::uint64_t zc_size(const HeaderView& v, std::size_t i) noexcept {
  std::uint64_t s;
  std::memcpy(&s, v.sizes + i * sizeof s, sizeof s);
  return s;
}

}  // namespace ferry::parcel::detail
