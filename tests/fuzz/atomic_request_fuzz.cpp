// atomic_request_fuzz.cpp — libFuzzer target: arbitrary bytes as a remote atomic's request
// (src/core/atomic_wire.hpp), checked and performed the way an owner's progress does it. The
// input is the header's op and type bytes, then an AtomicBody, whose address is folded into a
// window around a registered region of 64 bytes (inside, straddling either end, outside,
// misaligned) so the region check is reached. A request the checks accept must name an
// aligned location wholly inside the region; performing it must touch nothing else (ASan),
// and a compare-swap that does not match must leave the location as it was.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/atomic_wire.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ferry::detail;
  if (size < 3 + sizeof(AtomicBody)) return 0;
  const std::uint8_t op = data[0];
  const std::uint16_t type = static_cast<std::uint16_t>(data[1] | (data[2] << 8));
  AtomicBody b;
  std::memcpy(&b, data + 3, sizeof b);
  alignas(8) static unsigned char memory[192];
  unsigned char* const region = memory + 64;  // 64 bytes; 64 on either side are not the region's
  static RegionSet regions;
  static const bool added = (regions.add(memory + 64, 64, 7), true);
  (void)added;
  b.addr = reinterpret_cast<std::uint64_t>(memory) + b.addr % 192;
  if (const char* why = check_atomic_request(op, type, b)) {
    if (why[0] == '\0') std::abort();  // a refusal always says why
    return 0;
  }
  const auto t = static_cast<ferry::DataType>(type);
  const std::size_t width = atomic_width(t);
  if (width == 0 || b.addr % width != 0) std::abort();
  void* at = regions.find(b.addr, width, b.key);
  if (at == nullptr) return 0;
  const auto* p = static_cast<unsigned char*>(at);
  if (b.key != 7 || p < region || p + width > region + 64) std::abort();  // found outside the region
  unsigned char before[8];
  std::memcpy(before, at, width);
  const std::uint64_t old = apply_atomic(at, static_cast<ferry::AtomicOp>(op), t, b.operand, b.compare);
  std::uint64_t was = 0;
  std::memcpy(&was, before, width);
  if (old != was) std::abort();  // the value returned is the value before
  if (static_cast<ferry::AtomicOp>(op) == ferry::AtomicOp::compare_swap) {
    const std::uint64_t expected = width == 4 ? (b.compare & 0xFFFFFFFFu) : b.compare;
    if (was != expected && std::memcmp(before, at, width) != 0) std::abort();  // no match, no change
  }
  return 0;
}
