// atomic_wire.hpp — the bytes of a remote atomic (Device::post_atomic) and what its owner does
// with them: the request's one check, the registered regions it may touch, the operation.
// Header-only and free of the device, so the fuzz target (tests/fuzz/atomic_fuzz.cpp) runs it
// alone.
//
// A request is a packet of kind MsgKind::atomic: the WireHeader (reserved = the AtomicOp,
// target = the DataType), then an AtomicBody. The owner checks it, finds the location inside a
// region registered on the device the request came to, performs the operation and answers
// with MsgKind::atomic_reply: an AtomicReply with the value before and an error (0, or -EFAULT
// when the location is in no region of the owner: a region deregistered while a peer used it).
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <shared_mutex>

#include "ferry/datatype.hpp"
#include "ferry/runtime.hpp"

namespace ferry::detail {

struct AtomicBody {
  std::uint64_t addr;     // the location's virtual address on its owner
  std::uint64_t key;      // the region's key (RemoteKey::key)
  std::uint64_t operand;
  std::uint64_t compare;
  std::uint64_t id;       // the requester's, echoed in the reply
};
static_assert(sizeof(AtomicBody) == 40, "min_length's table");

struct AtomicReply {
  std::uint64_t id;
  std::uint64_t value;  // the location's value before (0-extended for a 32-bit type)
  std::int32_t error;
  std::uint32_t pad;
};
static_assert(sizeof(AtomicReply) == 24, "min_length's table");

// The width of an atomic of `type`, or 0 when atomics do not take it.
inline std::size_t atomic_width(DataType type) noexcept {
  switch (type) {
    case DataType::i32:
    case DataType::u32: return 4;
    case DataType::i64:
    case DataType::u64:
    case DataType::f64: return 8;
    default: return 0;
  }
}

inline bool valid_atomic_op(std::uint8_t op) noexcept { return op <= static_cast<std::uint8_t>(AtomicOp::fetch_xor); }

// Why (op, type) is not an atomic ferry performs, or null.
inline const char* refuse_atomic(std::uint8_t op, std::uint8_t type) noexcept {
  if (!valid_atomic_op(op)) return "an unknown operation";
  if (type > static_cast<std::uint8_t>(DataType::f64) || atomic_width(static_cast<DataType>(type)) == 0) {
    return "a type atomics do not take";
  }
  const auto o = static_cast<AtomicOp>(op);
  if (static_cast<DataType>(type) == DataType::f64 && o != AtomicOp::fetch_add && o != AtomicOp::add) {
    return "an operation f64 does not take";
  }
  return nullptr;
}

// Checks a request's header fields and body (the packet's length checked by min_length
// before): null, or why it is refused.
inline const char* check_atomic_request(std::uint8_t op, std::uint16_t type, const AtomicBody& b) noexcept {
  if (type > 0xFF) return "a type atomics do not take";
  if (const char* why = refuse_atomic(op, static_cast<std::uint8_t>(type))) return why;
  if (b.addr % atomic_width(static_cast<DataType>(type)) != 0) return "a location not aligned to its type";
  return nullptr;
}

// Performs `op` on the location `at` (aligned to the type, checked) as one sequentially
// consistent atomic and returns the value before, 0-extended. The same builtins a program's
// std::atomic_ref uses, so the owner's own atomics on the location interleave with these.
template <class T>
std::uint64_t apply_typed(void* at, AtomicOp op, std::uint64_t operand_bits, std::uint64_t compare_bits) noexcept {
  auto* p = static_cast<T*>(at);
  const T operand = static_cast<T>(operand_bits);
  T old = 0;
  switch (op) {
    case AtomicOp::fetch_add:
    case AtomicOp::add: old = __atomic_fetch_add(p, operand, __ATOMIC_SEQ_CST); break;
    case AtomicOp::swap: old = __atomic_exchange_n(p, operand, __ATOMIC_SEQ_CST); break;
    case AtomicOp::compare_swap:
      old = static_cast<T>(compare_bits);
      __atomic_compare_exchange_n(p, &old, operand, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
      break;  // old: the value found (the expected one when it swapped)
    case AtomicOp::fetch_and: old = __atomic_fetch_and(p, operand, __ATOMIC_SEQ_CST); break;
    case AtomicOp::fetch_or: old = __atomic_fetch_or(p, operand, __ATOMIC_SEQ_CST); break;
    case AtomicOp::fetch_xor: old = __atomic_fetch_xor(p, operand, __ATOMIC_SEQ_CST); break;
  }
  return static_cast<std::uint64_t>(old);
}

// A double's fetch-add: a compare-exchange loop on its bits (no CPU adds doubles atomically).
inline std::uint64_t apply_f64_add(void* at, std::uint64_t operand_bits) noexcept {
  auto* p = static_cast<std::uint64_t*>(at);
  double add;
  std::memcpy(&add, &operand_bits, sizeof add);
  std::uint64_t old = __atomic_load_n(p, __ATOMIC_RELAXED);  // only a guess: the exchange checks it
  for (;;) {
    double v;
    std::memcpy(&v, &old, sizeof v);
    v += add;
    std::uint64_t next;
    std::memcpy(&next, &v, sizeof next);
    if (__atomic_compare_exchange_n(p, &old, next, true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) return old;
  }
}

// A checked (op, type) on an aligned location.
inline std::uint64_t apply_atomic(void* at, AtomicOp op, DataType type, std::uint64_t operand, std::uint64_t compare) noexcept {
  switch (type) {
    case DataType::i32:
    case DataType::u32: return apply_typed<std::uint32_t>(at, op, operand, compare);
    case DataType::f64: return apply_f64_add(at, operand);
    default: return apply_typed<std::uint64_t>(at, op, operand, compare);
  }
}

// The regions registered on one device, for the owner's check of a request: only a location
// inside one of them, under its key, is ever touched.
//
// Contract: add/remove by the registering threads (register_memory, ~MemoryRegion), find by
// progress; any number of threads at once. A shared mutex: finds, the common call, share it.
// Not the small-message path (an atomic's request only).
class RegionSet {
 public:
  void add(const void* data, std::size_t size, std::uint64_t key) {
    std::unique_lock guard(mutex_);
    regions_.insert({reinterpret_cast<std::uintptr_t>(data), {size, key}});
  }
  void remove(const void* data, std::size_t size, std::uint64_t key) noexcept {
    std::unique_lock guard(mutex_);
    auto [first, last] = regions_.equal_range(reinterpret_cast<std::uintptr_t>(data));
    for (auto it = first; it != last; ++it) {
      if (it->second.size == size && it->second.key == key) {
        regions_.erase(it);
        return;
      }
    }
  }
  // The location [addr, addr + width) if a region under `key` holds it, else null.
  void* find(std::uint64_t addr, std::size_t width, std::uint64_t key) const noexcept {
    std::shared_lock guard(mutex_);
    // Regions may overlap (one buffer registered twice): try each that starts at or below addr,
    // nearest first.
    auto it = regions_.upper_bound(static_cast<std::uintptr_t>(addr));
    while (it != regions_.begin()) {
      --it;
      const std::uintptr_t base = it->first;
      const Entry& e = it->second;
      if (e.key == key && addr - base < e.size && width <= e.size - (addr - base)) {
        return reinterpret_cast<void*>(static_cast<std::uintptr_t>(addr));
      }
    }
    return nullptr;
  }

 private:
  struct Entry {
    std::size_t size;
    std::uint64_t key;
  };
  mutable std::shared_mutex mutex_;
  std::multimap<std::uintptr_t, Entry> regions_;
};

}  // namespace ferry::detail
