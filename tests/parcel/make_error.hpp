// make_error.hpp — for tests that expect make_parcelport to refuse: upcalls that are never
// called, and the refusal's message.
#pragma once

#include <string>
#include <vector>

#include "ferry/error.hpp"
#include "ferry/parcel.hpp"

namespace ferry::parcel::test {

struct NoUpcalls final : Upcalls {
  std::vector<Chunk> allocate_zc_chunks(int, const Chunk&, const std::vector<std::size_t>&) override { return {}; }
  void handle_parcel(int, Parcel&&) override {}
};

// What make_parcelport(o) threw, or "no error".
inline std::string error_of(const ParcelportOptions& o) {
  NoUpcalls up;
  try {
    (void)make_parcelport(o, up);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace ferry::parcel::test
