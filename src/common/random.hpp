// random.hpp — a per-thread pseudo-random number source for spreading load (which device to
// poll, where a steal starts), never for anything that needs real randomness.
#pragma once

#include <cstdint>

namespace ferry::detail {

// xorshift32 (Marsaglia): a few cycles a number, one per thread, no shared state. Good enough
// to spread polls and steals uniformly; not for anything else.
struct XorShift {
  std::uint32_t state;
  explicit XorShift(std::uint32_t seed) noexcept : state(seed != 0 ? seed : 0x9E3779B9u) {}
  std::uint32_t next() noexcept {
    std::uint32_t x = state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return state = x;
  }
  // Uniform enough in [0, n) for the small n here (devices).
  int below(int n) noexcept { return static_cast<int>((static_cast<std::uint64_t>(next()) * static_cast<std::uint32_t>(n)) >> 32); }
};

}  // namespace ferry::detail
