// shared_memory.hpp — regions ferry allocates (Device::allocate_memory) in memory peers on the
// owner's host can map, and a device's mappings of its peers' such regions, through which
// their atomics are CPU atomics with no message.
//
// A region's memory is a memfd named "ferry-region-<rank>-<serial>-<base>-<size>" and mapped
// shared; its RemoteKey carries the owner's pid, the serial and the descriptor
// (RemoteKey::shared). A peer on the
// host opens /proc/<pid>/fd/<fd> (the access cross-memory attach needs already), checks the
// name against the key (a descriptor number reused for another file, or a pid of another PID
// namespace, never matches) and maps it. Where that fails, the key is remembered as not
// mappable and the atomic goes by message (core/protocols/atomics).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "ferry/runtime.hpp"

namespace ferry::detail {

struct SharedBlock {
  void* data = nullptr;
  std::size_t size = 0;
  int fd = -1;
  std::uint64_t shared = 0;  // RemoteKey::shared (shared_memory.cpp)
};

// `size` zeroed bytes, page-aligned, in a memfd of this process (rank `rank`). Throws
// ferry::Error naming the call that failed.
SharedBlock allocate_shared(std::size_t size, int rank);
void free_shared(const SharedBlock& b) noexcept;

// Mappings of the peers' allocated regions, by rank.
//
// Contract: find() from any thread, any number at once. The fast path is one acquire load of
// the rank's last entry (published with release after it was filled in); a miss takes the
// mutex, looks through the rank's entries and maps a new one if none matches. Entries (and
// their mappings) live until the object goes: a thread may still be using one another
// thread just replaced in its slot. At most kMaxPerRank entries per rank: past them a
// region's atomics go by message.
class PeerMappings {
 public:
  static constexpr std::size_t kMaxPerRank = 64;

  explicit PeerMappings(int size) : slots_(static_cast<std::size_t>(size)) {}
  ~PeerMappings();
  PeerMappings(const PeerMappings&) = delete;
  PeerMappings& operator=(const PeerMappings&) = delete;

  // The local address of the start of `k`'s region (k.shared != 0, k.rank checked), or null
  // when this process cannot map it.
  unsigned char* find(const RemoteKey& k) noexcept {
    const Entry* e = slots_[static_cast<std::size_t>(k.rank)].load(std::memory_order_acquire);
    if (e != nullptr && e->shared == k.shared && e->base == k.base && e->size == k.size) return e->mapped;
    return find_slow(k);
  }

 private:
  struct Entry {
    int rank;
    std::uint64_t shared, base, size;
    unsigned char* mapped;  // null: not mappable
  };
  unsigned char* find_slow(const RemoteKey& k) noexcept;

  std::vector<std::atomic<const Entry*>> slots_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<Entry>> entries_;  // under mutex_
};

}  // namespace ferry::detail
