// test_support.hpp — what the parcel layer's test programs share: upcalls that are never called
// and make_parcelport's refusal message (for tests that expect one), and the one argument
// (--parcelport KIND) of the small multi-rank programs.
#pragma once

#include <cstdio>
#include <cstring>
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

// Reads `--parcelport KIND` into o.kind; false (after naming the argument) for anything else.
inline bool parse_parcelport_argument(const char* program, int argc, char** argv, ParcelportOptions& o) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--parcelport") == 0 && i + 1 < argc) {
      o.kind = argv[++i];
    } else {
      std::fprintf(stderr, "%s: unknown argument '%s'; valid: --parcelport KIND\n", program, argv[i]);
      return false;
    }
  }
  return true;
}

}  // namespace ferry::parcel::test
