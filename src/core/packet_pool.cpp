#include "core/packet_pool.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <vector>

#include "ferry/error.hpp"

namespace ferry::detail {

namespace packet_cache {
constinit thread_local CacheTable* tls_table = nullptr;
}
using packet_cache::CacheTable;
using packet_cache::kMaxPools;
using packet_cache::tls_table;

namespace {

// Which pool owns each cache slot now. Only touched when a pool is made or destroyed and when
// a thread exits: never on the get/put path.
struct Registry {
  std::mutex mutex;
  std::array<PacketPool*, kMaxPools> pool{};
  std::array<std::uint64_t, kMaxPools> generation{};
  std::uint64_t next_generation = 1;
};

Registry& registry() {
  static Registry r;
  return r;
}

// Made together with the table; at thread exit it returns the cached packets to their pools
// (if those still exist) and frees the table. Touched only when a thread's table is created.
struct TableOwner {
  CacheTable* table = nullptr;
  ~TableOwner() {
    if (table == nullptr) return;
    Registry& reg = registry();
    std::lock_guard<std::mutex> guard(reg.mutex);
    for (std::size_t s = 0; s < kMaxPools; ++s) {
      PacketPool::ThreadCache* c = table->slot[s];
      if (c == nullptr) continue;
      if (reg.pool[s] != nullptr && reg.generation[s] == c->generation) {
        for (std::uint32_t i = 0; i < c->count; ++i) reg.pool[s]->put_shared(c->items[i]);
      }
      delete c;
    }
    delete table;
    tls_table = nullptr;
  }
};
thread_local TableOwner tls_owner;

[[gnu::noinline]] CacheTable* make_table() noexcept {
  auto* t = new (std::nothrow) CacheTable;
  if (t == nullptr) return nullptr;
  tls_owner.table = t;
  tls_table = t;
  return t;
}

}  // namespace

PacketPool::PacketPool(std::size_t count, std::size_t payload_size)
    : count_(count),
      payload_(payload_size),
      stride_(sizeof(Packet) + ((payload_size + cache_line - 1) / cache_line) * cache_line),
      slab_(nullptr),
      cached_(count >= kMinCachedPool),
      cache_cap_(cached_ ? static_cast<std::uint32_t>(std::clamp<std::size_t>(count / 32, kCacheSize / 4, kCacheSize)) : 0),
      cache_batch_(cache_cap_ / 2) {
  // The free-list head starts a line of its own: get/put hammer it (and free_count_ next to
  // it) while the line before — the geometry and the thread-cache slot that every get/put
  // reads — stays clean in every thread's cache.
  static_assert(std::is_standard_layout_v<PacketPool>);
  static_assert(offsetof(PacketPool, head_) == cache_line && alignof(PacketPool) == cache_line);
  if (count == 0) throw Error("FERRY_PACKETS=0: a device needs at least one packet");
  if (payload_size > UINT32_MAX) throw Error("FERRY_PACKET_SIZE=" + std::to_string(payload_size) + " is too large");
  slab_ = static_cast<unsigned char*>(std::aligned_alloc(4096, ((stride_ * count + 4095) / 4096) * 4096));
  if (slab_ == nullptr) throw Error("packet pool: cannot allocate " + std::to_string(stride_ * count) + " bytes");
  // Only the first batch's headers are written here (see the contract); a payload is always
  // written before it is read (a post copies into it, a receive fills it), so even a made
  // packet's payload pages fault in only when it first carries data.
  if (count >= kEmpty) throw Error("FERRY_PACKETS=" + std::to_string(count) + " is too large");
  head_.store(kEmpty, std::memory_order_relaxed);
  free_count_.store(count, std::memory_order_relaxed);  // unmade packets count as free
  (void)grow();
  Registry& reg = registry();
  std::lock_guard<std::mutex> guard(reg.mutex);
  std::size_t s = 0;
  while (s < kMaxPools && reg.pool[s] != nullptr) ++s;
  if (s == kMaxPools) {
    std::free(slab_);
    throw Error("packet pool: more than " + std::to_string(kMaxPools) + " devices alive in one process");
  }
  slot_ = static_cast<std::uint32_t>(s);
  generation_ = reg.next_generation++;
  reg.pool[s] = this;
  reg.generation[s] = generation_;
}

PacketPool::~PacketPool() {
  {
    Registry& reg = registry();
    std::lock_guard<std::mutex> guard(reg.mutex);
    reg.pool[slot_] = nullptr;
    reg.generation[slot_] = 0;
  }
  std::free(slab_);
}

PacketPool::ThreadCache* PacketPool::cache_slow(ThreadCache*& c) noexcept {
  if (c == nullptr) {
    c = new (std::nothrow) ThreadCache;  // once per thread and pool slot, not per message
    if (c == nullptr) return nullptr;
  }
  if (c->generation != generation_) {  // a previous pool used this slot: forget its packets
    c->generation = generation_;
    c->count = 0;
  }
  return c;
}

// Inlined into get and put: a call there cost as much as the lookup itself.
[[gnu::always_inline]] inline PacketPool::ThreadCache* PacketPool::cache() noexcept {
  CacheTable* table = tls_table;
  if (table == nullptr && (table = make_table()) == nullptr) return nullptr;
  ThreadCache*& c = table->slot[slot_];
  if (__builtin_expect(c == nullptr || c->generation != generation_, 0)) return cache_slow(c);
  return c;
}

// get and put's fast paths are inline in the header; these take every other case.
Packet* PacketPool::get_slow() noexcept {
  if (cached_) {
    ThreadCache* c = cache();
    if (c != nullptr) {
      while (c->count == 0) {
        c->count = take_shared(c->items, cache_batch_);
        if (c->count == 0 && !grow()) return nullptr;
      }
      return c->items[--c->count];
    }
  }
  Packet* p = nullptr;
  while (take_shared(&p, 1) == 0) {
    if (!grow()) return nullptr;
  }
  return p;
}

bool PacketPool::grow() noexcept {
  std::uint32_t from = made_.load(std::memory_order_relaxed);
  std::uint32_t to = 0;
  do {
    if (from >= count_) return false;
    to = static_cast<std::uint32_t>(std::min<std::size_t>(count_, std::size_t{from} + kGrowBatch));
  } while (!made_.compare_exchange_weak(from, to, std::memory_order_relaxed, std::memory_order_relaxed));
  Packet* fresh[kGrowBatch];
  // Lowest index on top of the list, as the packets were ordered when all were made at once.
  for (std::uint32_t i = from; i < to; ++i) {
    auto* p = new (slab_ + std::size_t{i} * stride_) Packet{};
    p->pool = this;
    p->capacity = static_cast<std::uint32_t>(payload_);
    p->index = i;
    fresh[i - from] = p;
  }
  free_count_.fetch_sub(to - from, std::memory_order_relaxed);  // counted while unmade; give_shared adds them back
  give_shared(fresh, to - from);
  return true;
}

std::uint32_t PacketPool::take_shared(Packet** out, std::uint32_t n) noexcept {
  // Acquire on the head pairs with the release of every earlier push: each change of the head
  // is a CAS (a read-modify-write), so the head's value continues the release sequence of
  // every push before it, and the links of all packets in the list — not only the top one's —
  // are the ones their pushers wrote. The links are read relaxed while other threads may pop
  // and reuse those packets: any change to the list bumps the head's tag, so the CAS then
  // fails and the walk is redone from the new head.
  std::uint64_t head = head_.load(std::memory_order_acquire);
  for (;;) {
    std::uint32_t next = static_cast<std::uint32_t>(head);
    std::uint32_t k = 0;
    while (k < n && next != kEmpty && next < count_) {
      Packet* p = at(next);
      out[k++] = p;
      next = p->pool_next.load(std::memory_order_relaxed);
    }
    if (k == 0) return 0;
    // A link read from a packet that was popped meanwhile may be anything (next < count_ keeps
    // the walk inside the slab); the tag check below throws such a walk away.
    const std::uint64_t want = ((head >> 32) + 1) << 32 | next;
    if (head_.compare_exchange_weak(head, want, std::memory_order_acquire, std::memory_order_acquire)) {
      free_count_.fetch_sub(k, std::memory_order_relaxed);
      return k;
    }
  }
}

void PacketPool::put_slow(Packet* packet) noexcept {
  if (cached_) {
    ThreadCache* c = cache();
    if (c != nullptr) {
      if (c->count == cache_cap_) {  // full: the older half goes back in one batch
        give_shared(c->items, cache_batch_);
        c->count -= cache_batch_;
        std::copy(c->items + cache_batch_, c->items + cache_batch_ + c->count, c->items);
      }
      c->items[c->count++] = packet;
      return;
    }
  }
  put_shared(packet);
}

void PacketPool::put_shared(Packet* packet) noexcept { give_shared(&packet, 1); }

void PacketPool::give_shared(Packet* const* items, std::uint32_t n) noexcept {
  // The batch is chained through its links first (relaxed: nobody else can see these packets
  // yet); the release CAS then publishes the chain and its links together. free_count_ is a
  // statistic only: relaxed.
  for (std::uint32_t i = 0; i + 1 < n; ++i) items[i]->pool_next.store(items[i + 1]->index, std::memory_order_relaxed);
  Packet* last = items[n - 1];
  std::uint64_t head = head_.load(std::memory_order_relaxed);
  for (;;) {
    last->pool_next.store(static_cast<std::uint32_t>(head), std::memory_order_relaxed);
    const std::uint64_t want = ((head >> 32) + 1) << 32 | items[0]->index;
    if (head_.compare_exchange_weak(head, want, std::memory_order_release, std::memory_order_relaxed)) break;
  }
  free_count_.fetch_add(n, std::memory_order_relaxed);
}

std::size_t PacketPool::trim() {
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  std::vector<Packet*> taken;
  taken.reserve(made());
  Packet* batch[kGrowBatch];
  for (std::uint32_t k; (k = take_shared(batch, kGrowBatch)) != 0;) taken.insert(taken.end(), batch, batch + k);
  std::size_t released = 0;
  for (Packet* p : taken) {
    const auto begin = (reinterpret_cast<std::uintptr_t>(p->data()) + page - 1) / page * page;
    const auto end = (reinterpret_cast<std::uintptr_t>(p->data()) + payload_) / page * page;
    if (end > begin && madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED) == 0) released += end - begin;
  }
  for (std::size_t i = 0; i < taken.size(); i += kGrowBatch) {
    give_shared(taken.data() + i, static_cast<std::uint32_t>(std::min<std::size_t>(kGrowBatch, taken.size() - i)));
  }
  return released;
}

void PacketPool::release_payload(void* pool, void* payload) noexcept {
  static_cast<PacketPool*>(pool)->put(Packet::from_data(payload));
}

}  // namespace ferry::detail
