// packet_pool.hpp — fixed-size, pre-registered packets for one device.
//
// Contract
//  - get() and put() may be called by any thread, concurrently; neither blocks nor allocates.
//  - get() returns nullptr when no packet is free: the caller reports retry(packet_pool).
//  - Every packet comes from one slab allocated (and registered with the provider by the
//    device) at construction; a packet returns to the pool that made it.
//  - The slab's address range is reserved at once, its packets made as they are needed: the
//    first kGrowBatch at construction, then kGrowBatch more whenever a get finds the shared
//    list empty (a CAS on made_ gives each grower its own range, so concurrent growers make
//    disjoint packets). An unmade packet's pages are never touched, so a device's resident
//    memory follows the most packets it held at once, not FERRY_PACKETS.
//  - The shared free list is a lock-free stack of packet indices with a generation tag in the
//    same 64-bit word (no ABA). Unlike a bounded ring, a push can never be refused, so a
//    returned packet is never lost, whatever other threads are doing.
//  - Each thread keeps a private cache per pool so the common get/put pair touches no shared
//    cache line and makes no atomic read-modify-write. The cache trades with the shared list
//    in batches of half its capacity, one CAS per batch: an empty cache takes a batch, a full
//    one gives a batch back. So a burst of gets or puts (the device reposts its receives in
//    bursts of up to FERRY_PREPOST/2) pays one CAS per batch, not one per packet. Pools smaller
//    than kMinCachedPool packets cache nothing, and a cache holds at most 1/32 of its pool
//    (cache_capacity()), so an idle thread strands few packets.
//  - A pool must outlive every get/put on it. When it is destroyed, threads' caches of it are
//    invalidated by a generation number, never dereferenced.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "common/cache_line.hpp"
#include "core/op_context.hpp"
#include "ferry/completion.hpp"

namespace ferry::net {
class Registration;
}

namespace ferry::detail {

class PacketPool;

// The metadata in front of each packet's payload: fields of the pool (fixed for the packet's
// life), then one view per use of the packet. A packet has one use at a time; the code that
// gives it a use writes that use's view and reads no other, so no field means two things.
//
//   view     the packet is                                      from             until
//   recv     a posted receive waiting in the matching engine    post_recv        matched
//   arrived  an eager message or RTS that arrived (also while   its receive      delivered or
//            fragments of it are gathered in it)                completion       read
//   send     an eager send or control message given to fi_send  send_packet      its completion
//   backlog  a fragmented message's tail the provider refused   post_fragments   flushed
//   rma      a put or get of one transfer                       post_rma         its completion
//
// The views are trivial structs in one union: giving a packet a use costs only the stores of
// the fields that use needs.

// What the matching engine compares: for a receive, the sender and tag it wants (any_source,
// any_tag allowed); for a message, its sender and tag.
struct MatchKey {
  std::int32_t rank;
  Tag tag;
};

// A posted receive (a packet of the device's receive-descriptor pool; no payload is used).
struct RecvDescriptor {
  MatchKey want;
  void* buffer;
  std::size_t size;
  CompletionObject* local;
  void* context;
};

// An arrived eager message (am, msg), RTS or control message, in the packet it arrived in.
// A message reassembled past a packet's size keeps only its header in the packet and its
// payload in the malloc'ed block `heap`; whoever releases the message frees the block.
struct ArrivedMessage {
  std::uint32_t length;  // bytes in the packet, wire header included
  MatchKey from;         // msg and rts_msg: set when the message enters the matching engine
  unsigned char* heap;   // msg and rts_msg: the payload's heap block, or null (payload follows the header)
  std::size_t heap_size;  // bytes in `heap`
};

// An eager send or control message the provider holds until its send completion.
struct EagerSend {
  std::int32_t rank;  // the destination, for the error report should the send fail
};

// The part of a fragmented message the provider refused midway, queued on the device's
// backlog. `frame` holds [fragment header][the tail's bytes]: the packet's payload, or a
// malloc'ed block when the tail is larger than a packet. Each piece's header is written
// just in front of its bytes, over bytes already sent.
struct BacklogTail {
  unsigned char* frame;
  std::int32_t rank;    // the destination
  std::uint32_t size;   // the message's payload bytes
  std::uint32_t bytes;  // the tail's bytes: the message's last `bytes`
  std::uint32_t sent;   // of those, bytes sent
  std::uint32_t remaining() const noexcept { return bytes - sent; }
  // The message offset of the next byte to send.
  std::uint32_t offset() const noexcept { return size - bytes + sent; }
};

// A put or get of one transfer: its whole state, so nothing is allocated for it.
struct RmaSingle {
  OpKind op;
  std::int32_t rank;
  std::size_t size;
  CompletionObject* local;
  void* context;
  net::Registration* mr;  // a temporary registration of the local buffer (local_registration), or null
};

struct alignas(cache_line) Packet {
  OpContext ctx;  // must be first: a transport hands back &ctx as the op context
  PacketPool* pool;
  // The link of the one intrusive list that holds the packet, if any: a matching engine list
  // (recv, arrived) or the device's backlog (backlog).
  Packet* next;
  // Its place in the order of the matching engine's entries (recv, arrived), set when queued.
  std::uint64_t match_seq;
  std::uint32_t capacity;                // payload bytes
  std::uint32_t index;                   // position in the slab
  std::atomic<std::uint32_t> pool_next;  // the free-list link (read racily by poppers: atomic)
  union {
    RecvDescriptor recv;
    ArrivedMessage arrived;
    EagerSend send;
    BacklogTail backlog;
    RmaSingle rma;
  };
  unsigned char* data() noexcept { return reinterpret_cast<unsigned char*>(this) + sizeof(Packet); }
  static Packet* from_data(void* payload) noexcept {
    return reinterpret_cast<Packet*>(static_cast<unsigned char*>(payload) - sizeof(Packet));
  }
};
static_assert(sizeof(Packet) % cache_line == 0, "payloads must stay cache-line aligned");
static_assert(alignof(Packet) == cache_line, "a packet's metadata starts a line: no packet shares one with another");
static_assert(offsetof(Packet, ctx) == 0, "an event's context pointer is the packet pointer");
static_assert(std::is_trivially_copyable_v<RecvDescriptor> && std::is_trivially_copyable_v<ArrivedMessage> &&
                  std::is_trivially_copyable_v<EagerSend> && std::is_trivially_copyable_v<BacklogTail> &&
                  std::is_trivially_copyable_v<RmaSingle>,
              "a view is plain data: giving a packet a use runs no constructor");
// The views share the header's last cache line(s): the largest one ends inside the header
// without adding a line to every packet.
inline constexpr std::size_t kLargestPacketView =
    std::max({sizeof(RecvDescriptor), sizeof(ArrivedMessage), sizeof(EagerSend), sizeof(BacklogTail), sizeof(RmaSingle)});
static_assert(offsetof(Packet, recv) + kLargestPacketView <= sizeof(Packet));
static_assert(sizeof(Packet) - (offsetof(Packet, recv) + kLargestPacketView) < cache_line,
              "the header is the fewest cache lines that hold its fields");

// Each thread's packet caches (see the contract). Declared here so that get and put inline
// their fast path into the receive loop; only packet_pool.cpp makes or frees them.
namespace packet_cache {
inline constexpr std::size_t kMaxPools = 256;  // devices alive in one process
inline constexpr std::size_t kCacheSize = 64;
struct ThreadCache {
  std::uint64_t generation = 0;
  std::uint32_t count = 0;
  Packet* items[kCacheSize];
};
// A thread's caches for every pool slot.
struct CacheTable {
  ThreadCache* slot[kMaxPools] = {};
};
// The fast path reads this pointer only: constant-initialized, trivially destructible and
// initial-exec, so each access is one %fs-relative load, with no __tls_get_addr call and no
// TLS init guard (constinit tells other translation units there is no dynamic initializer).
extern constinit thread_local CacheTable* tls_table __attribute__((tls_model("initial-exec")));
}  // namespace packet_cache

class PacketPool {
 public:
  static constexpr std::size_t kMinCachedPool = 512;
  static constexpr std::uint32_t kGrowBatch = 64;  // packets made at a time (see the contract)
  static constexpr std::size_t kCacheSize = packet_cache::kCacheSize;  // the largest cache_capacity()

  PacketPool(std::size_t count, std::size_t payload_size);
  ~PacketPool();
  PacketPool(const PacketPool&) = delete;
  PacketPool& operator=(const PacketPool&) = delete;

  // Inline: the common get or put is a few loads of this thread's warm cache. The slow paths
  // stay out of line, so the fast path saves no registers for them.
  Packet* get() noexcept {
    ThreadCache* c = warm_cache();
    if (__builtin_expect(c != nullptr && c->count > 0, 1)) return c->items[--c->count];
    return get_slow();
  }
  // Up to `n` packets into out[0..); returns how many (fewer only when the pool runs dry).
  // The cache's checks are made once for the whole run.
  std::size_t get_many(Packet** out, std::size_t n) noexcept {
    std::size_t k = 0;
    if (ThreadCache* c = warm_cache(); __builtin_expect(c != nullptr, 1)) {
      k = std::min<std::size_t>(n, c->count);
      c->count -= static_cast<std::uint32_t>(k);
      for (std::size_t i = 0; i < k; ++i) out[i] = c->items[c->count + i];
    }
    for (; k < n; ++k) {
      Packet* p = get_slow();
      if (p == nullptr) break;
      out[k] = p;
    }
    return k;
  }
  void put(Packet* packet) noexcept {
    ThreadCache* c = warm_cache();
    if (__builtin_expect(c != nullptr && c->count != cache_cap_, 1)) {
      c->items[c->count++] = packet;
      return;
    }
    put_slow(packet);
  }
  // Straight to the shared ring, bypassing this thread's cache.
  void put_shared(Packet* packet) noexcept;

  void* slab() const noexcept { return slab_; }
  std::size_t slab_bytes() const noexcept { return stride_ * count_; }
  std::size_t count() const noexcept { return count_; }
  std::size_t payload_size() const noexcept { return payload_; }
  // Packets one thread's cache holds at most (0: this pool caches nothing).
  std::size_t cache_capacity() const noexcept { return cache_cap_; }
  // Packets a get can still have: those in the shared free list (not counting per-thread
  // caches) and those not made yet; exact when quiescent.
  std::size_t available_approx() const noexcept { return free_count_.load(std::memory_order_relaxed); }
  // Packets made so far (their headers written): the pool's resident part.
  std::size_t made() const noexcept { return made_.load(std::memory_order_relaxed); }
  std::size_t made_bytes() const noexcept { return made() * stride_; }

  // Gives back to the system the pages that lie wholly inside the payloads of the packets in
  // the shared free list (MADV_DONTNEED; their headers, the links of the list, stay), and
  // returns the bytes given back. Free packets' payloads hold nothing anyone reads (a payload
  // is written before it is read), so a given-back page reads as zeros when the packet is next
  // used, and faults in then. For a device at rest: the free list is emptied while its packets
  // are given back, so a get meanwhile may make new packets. Not for a slab registered where
  // registration pins pages (the device checks net::Caps::registration_pins). Any thread; it
  // allocates (a list of the packets taken) and makes a system call per packet.
  std::size_t trim();
  // The shared free list's version: the tag of its head, bumped by every take and return
  // through it. Unchanged over a while, no packet went in or out of the list meanwhile (the
  // threads' caches may still have traded among themselves).
  std::uint32_t list_version() const noexcept {
    return static_cast<std::uint32_t>(head_.load(std::memory_order_relaxed) >> 32);
  }

  // Buffer::Release for packets handed to the caller.
  static void release_payload(void* pool, void* payload) noexcept;

  using ThreadCache = packet_cache::ThreadCache;

 private:
  // This thread's cache of this pool when it exists and is current, else null (the slow
  // paths then make or renew it).
  ThreadCache* warm_cache() const noexcept {
    if (__builtin_expect(!cached_, 0)) return nullptr;
    const packet_cache::CacheTable* table = packet_cache::tls_table;
    if (__builtin_expect(table == nullptr, 0)) return nullptr;
    ThreadCache* c = table->slot[slot_];
    return c != nullptr && c->generation == generation_ ? c : nullptr;
  }
  ThreadCache* cache() noexcept;
  // get and put when this thread's cache is empty, full, missing or stale.
  [[gnu::noinline]] Packet* get_slow() noexcept;
  [[gnu::noinline]] void put_slow(Packet* packet) noexcept;
  [[gnu::noinline]] ThreadCache* cache_slow(ThreadCache*& c) noexcept;  // a new thread, or a new pool in the slot
  // Moves up to `n` packets from the shared list into `out`; returns how many (one CAS).
  std::uint32_t take_shared(Packet** out, std::uint32_t n) noexcept;
  // Pushes out[0..n) onto the shared list with one CAS.
  void give_shared(Packet* const* items, std::uint32_t n) noexcept;
  // Makes up to kGrowBatch more packets and pushes them onto the shared list; false when every
  // packet is made.
  bool grow() noexcept;

  std::size_t count_;
  std::size_t payload_;
  std::size_t stride_;
  unsigned char* slab_;
  bool cached_;
  std::uint32_t cache_cap_;    // 0, or kCacheSize/4..kCacheSize
  std::uint32_t cache_batch_;  // cache_cap_ / 2
  std::uint32_t slot_;        // index into each thread's cache table
  std::uint64_t generation_;  // distinguishes this pool from earlier ones in the same slot
  Packet* at(std::uint32_t index) const noexcept { return reinterpret_cast<Packet*>(slab_ + index * stride_); }
  // Free-list head: low 32 bits the top packet's index (kEmpty when none), high 32 bits a tag
  // bumped by every successful change, so a stale head can never be swapped back in (ABA).
  static constexpr std::uint32_t kEmpty = 0xFFFFFFFFu;
  alignas(cache_line) std::atomic<std::uint64_t> head_;
  std::atomic<std::size_t> free_count_{0};  // the shared list's packets and the unmade ones
  // Packets made: [0, made_) have their headers. Only grow() changes it, by CAS. Relaxed
  // everywhere: a packet made by one thread reaches another only through the shared list,
  // whose release CAS publishes its header; made_ itself orders nothing.
  std::atomic<std::uint32_t> made_{0};
};

}  // namespace ferry::detail
