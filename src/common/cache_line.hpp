// cache_line.hpp — the cache-line sizes ferry pads and aligns its shared data to, defined once.
//
// destructive_interference_size: the distance at which two atomics written by different
// threads no longer share a line (false sharing); padded structures align to it.
// constructive_interference_size: the most bytes that certainly share one line; data read
// together by one thread fits in it.
//
// Both are chosen here rather than taken from std::hardware_destructive_interference_size:
// GCC warns that that value may differ between compiler versions and -mtune settings, and the
// layouts below are shared between translation units (and libraries) compiled separately, so
// they must not depend on flags. 64 bytes is the line size of every x86-64 and aarch64 part
// ferry targets. (x86's adjacent-line prefetcher pairs lines, which is why folly pads to 128;
// ferry keeps 64 so that Packet headers and queue cells stay one line: measure before raising
// it.) Every padded structure in ferry carries a static_assert of its layout next to it.
#pragma once

#include <cstddef>

namespace ferry::detail {

// x86-64 and aarch64 (and, as the common size, any other target).
inline constexpr std::size_t destructive_interference_size = 64;
inline constexpr std::size_t constructive_interference_size = 64;

// What alignas() takes for data that threads write independently.
inline constexpr std::size_t cache_line = destructive_interference_size;

static_assert((cache_line & (cache_line - 1)) == 0, "a cache line is a power of two");
static_assert(constructive_interference_size <= destructive_interference_size);

}  // namespace ferry::detail
