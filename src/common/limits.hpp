// limits.hpp — sizes no process can hold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ferry::detail {

// The user half of a 48-bit address space: no allocation of this many bytes or more can
// succeed. A size from the wire at or past it (a hostile peer's, say) is refused before it
// reaches an allocator, whose sanitizer builds would stop the process rather than return null,
// or an application's allocation upcall.
inline constexpr std::uint64_t kNoAllocation = std::uint64_t{1} << 47;

// True when each of the `count` u64 sizes at `table` (unaligned, as on the wire) is below it.
inline bool sizes_allocatable(const std::byte* table, std::size_t count) noexcept {
  for (std::size_t i = 0; i < count; ++i) {
    std::uint64_t s;
    std::memcpy(&s, table + i * sizeof s, sizeof s);
    if (s >= kNoAllocation) return false;
  }
  return true;
}

}  // namespace ferry::detail
