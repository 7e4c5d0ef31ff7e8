// parcel_header_fuzz.cpp — libFuzzer target: arbitrary bytes as a ferry parcel header
// (src/parcel/header.hpp). The first input byte is the number of iovec parts that came with
// the header (mod 8); the rest is the header, copied to a buffer of exactly its size so that
// ASan sees any read past it. A header that checks out is read in full: every zero-copy size
// and every piggybacked nzc byte.
#include <cstdint>
#include <memory>

#include "parcel/header.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t parts = data[0] % 8;
  const std::size_t n = size - 1;
  auto bytes = std::make_unique<std::byte[]>(n == 0 ? 1 : n);
  for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<std::byte>(data[1 + i]);
  ferry::parcel::detail::HeaderView v;
  if (!ferry::parcel::detail::check_header(n == 0 ? nullptr : bytes.get(), n, parts, v)) return 0;
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < v.h.zc_count; ++i) sum += ferry::parcel::detail::zc_size(v, i);
  if (v.h.piggyback) {
    for (std::size_t i = 0; i < v.h.nzc_size; ++i) sum += static_cast<std::uint8_t>(v.nzc[i]);
  }
  volatile std::uint64_t keep = sum;
  (void)keep;
  return 0;
}
