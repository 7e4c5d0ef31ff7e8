// mpi_header_fuzz.cpp — libFuzzer target: arbitrary bytes as an MPI parcelport header
// (src/parcel/mpi_header.hpp), copied to a buffer of exactly their size so that ASan sees any
// read past it. A header that checks out is read in full (every zero-copy size and every
// piggybacked nzc byte); a piggybacked aggregate's index is checked against the header's
// zero-copy count, and every parcel it accepts is read in full.
#include <cstdint>
#include <memory>
#include <vector>

#include "parcel/mpi_header.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace d = ferry::parcel::detail;
  auto bytes = std::make_unique<std::byte[]>(size == 0 ? 1 : size);
  for (std::size_t i = 0; i < size; ++i) bytes[i] = static_cast<std::byte>(data[i]);
  d::MpiHeaderView v;
  if (!d::check_mpi_header(size == 0 ? nullptr : bytes.get(), size, v)) return 0;
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < v.h.zc_count; ++i) sum += d::mpi_zc_size(v, i);
  if (v.piggyback()) {
    for (std::size_t i = 0; i < v.h.nzc_size; ++i) sum += static_cast<std::uint8_t>(v.nzc[i]);
    if (v.aggregate()) {
      std::vector<d::AggregatePart> parts;
      if (d::check_aggregate_index(v.nzc, v.h.nzc_size, v.h.zc_count, parts)) {
        for (const d::AggregatePart& p : parts) {
          for (std::size_t i = 0; i < p.nzc_size; ++i) sum += static_cast<std::uint8_t>(v.nzc[p.nzc_offset + i]);
        }
      }
    }
  }
  volatile std::uint64_t keep = sum;
  (void)keep;
  return 0;
}
