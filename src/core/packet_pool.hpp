// packet_pool.hpp — fixed-size, pre-registered packets for one device.
//
// Contract
//  - get() and put() may be called by any thread, concurrently; neither blocks nor allocates.
//  - get() returns nullptr when no packet is free: the caller reports retry(packet_pool).
//  - Every packet comes from one slab allocated (and registered with the provider by the
//    device) at construction; a packet returns to the pool that made it.
//  - The shared free list is a lock-free stack of packet indices with a generation tag in the
//    same 64-bit word (no ABA). Unlike a bounded ring, a push can never be refused, so a
//    returned packet is never lost, whatever other threads are doing.
//  - Each thread keeps a small private cache per pool so the common get/put pair touches no
//    shared cache line. Pools smaller than kMinCachedPool packets cache nothing, so a tiny
//    pool's packets cannot be stranded in an idle thread's cache.
//  - A pool must outlive every get/put on it. When it is destroyed, threads' caches of it are
//    invalidated by a generation number, never dereferenced.
#pragma once

#include <cstddef>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <cstddef>

#include <atomic>

#include "common/cache_line.hpp"
#include "core/op_context.hpp"
#include "ferry/completion.hpp"

namespace ferry::detail {

class PacketPool;

// The metadata in front of each packet's payload. The payload starts at data(); what the
// metadata fields mean depends on what the packet is doing (OpContext::kind).
struct alignas(cache_line) Packet {
  OpContext ctx;  // must be first: libfabric hands back &ctx.fi as the op context
  PacketPool* pool;
  std::uint32_t capacity;  // payload bytes
  std::uint32_t length;    // payload bytes in use
  // Scratch for the operation this packet carries (recv descriptor, rma op, match entry).
  Packet* next;
  void* buffer;
  std::size_t size;
  CompletionObject* local;
  void* context;
  std::int32_t rank;
  std::uint32_t tag;
  void* mr;  // a temporary registration this op owns (fid_mr*), or null
  OpKind op;
  bool notify;
  // An eager message reassembled from fragments past a packet's size: its payload is the
  // malloc'ed block `buffer` of `size` bytes, not the bytes after its header. Set only while the
  // packet holds such a message; whoever releases it frees the block and clears the flag.
  bool heap_payload;
  std::uint32_t index;                  // position in the slab
  std::atomic<std::uint32_t> pool_next;  // the free-list link (read racily by poppers: atomic)
  unsigned char* data() noexcept { return reinterpret_cast<unsigned char*>(this) + sizeof(Packet); }
  static Packet* from_data(void* payload) noexcept {
    return reinterpret_cast<Packet*>(static_cast<unsigned char*>(payload) - sizeof(Packet));
  }
};
static_assert(sizeof(Packet) % cache_line == 0, "payloads must stay cache-line aligned");
static_assert(alignof(Packet) == cache_line, "a packet's metadata starts a line: no packet shares one with another");
static_assert(offsetof(Packet, ctx) == 0, "libfabric's context pointer is the packet pointer");

class PacketPool {
 public:
  static constexpr std::size_t kMinCachedPool = 512;
  static constexpr std::size_t kCacheSize = 16;

  PacketPool(std::size_t count, std::size_t payload_size);
  ~PacketPool();
  PacketPool(const PacketPool&) = delete;
  PacketPool& operator=(const PacketPool&) = delete;

  Packet* get() noexcept;
  void put(Packet* packet) noexcept;
  // Straight to the shared ring, bypassing this thread's cache.
  void put_shared(Packet* packet) noexcept;

  void* slab() const noexcept { return slab_; }
  std::size_t slab_bytes() const noexcept { return stride_ * count_; }
  std::size_t count() const noexcept { return count_; }
  std::size_t payload_size() const noexcept { return payload_; }
  // Packets in the shared free list (not counting per-thread caches); exact when quiescent.
  std::size_t available_approx() const noexcept { return free_count_.load(std::memory_order_relaxed); }

  // Buffer::Release for packets handed to the caller.
  static void release_payload(void* pool, void* payload) noexcept;

  struct ThreadCache;

 private:
  ThreadCache* cache() noexcept;

  std::size_t count_;
  std::size_t payload_;
  std::size_t stride_;
  unsigned char* slab_;
  Packet* at(std::uint32_t index) const noexcept { return reinterpret_cast<Packet*>(slab_ + index * stride_); }
  // Free-list head: low 32 bits the top packet's index (kEmpty when none), high 32 bits a tag
  // bumped by every successful change, so a stale head can never be swapped back in (ABA).
  static constexpr std::uint32_t kEmpty = 0xFFFFFFFFu;
  alignas(cache_line) std::atomic<std::uint64_t> head_;
  std::atomic<std::size_t> free_count_{0};
  bool cached_;
  std::uint32_t slot_;        // index into each thread's cache table
  std::uint64_t generation_;  // distinguishes this pool from earlier ones in the same slot
};

}  // namespace ferry::detail
