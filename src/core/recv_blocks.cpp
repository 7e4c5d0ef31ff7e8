#include "core/recv_blocks.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>

#include "common/cache_line.hpp"
#include "common/limits.hpp"
#include "common/spinlock.hpp"

namespace ferry::detail::recv_blocks {

namespace {

// Each block starts with a cache line that records its class, so give() needs no size and
// the payload stays 64-byte aligned.
constexpr std::size_t kPrefix = cache_line;
constexpr unsigned kMinShift = 12;  // 4 KiB
constexpr unsigned kMaxShift = 30;  // 1 GiB
constexpr unsigned kClasses = kMaxShift - kMinShift + 1;
constexpr std::uint32_t kUncached = 0xFFFFFFFFu;

struct Prefix {
  std::uint32_t klass;
  std::uint32_t huge;       // 1: a mapping of its own, its payload on 2 MiB pages (madvised)
  std::size_t footprint;    // bytes the block holds: what the cache counts
  void* map;                // huge blocks: the mapping to unmap
};
static_assert(sizeof(Prefix) <= kPrefix);

struct alignas(cache_line) Class {
  SpinLock lock;
  std::size_t count = 0;
  void* blocks[kSlots] = {};
};
static_assert(sizeof(Class) % cache_line == 0 && alignof(Class) == cache_line, "one class per line(s)");

struct Cache {
  Class classes[kClasses];
  alignas(cache_line) std::atomic<std::size_t> cached{0};
  // Every take and give counts here: unchanged over a while, the cache rested (relaxed: a hint
  // for release_if_rested, ordering nothing).
  std::atomic<std::uint64_t> uses{0};
  std::atomic<std::size_t> limit{std::size_t{256} << 20};
  std::atomic<std::size_t> huge_from{0};  // 0: never
};

// Never destroyed: buffers may be released by static destructors or after main returns.
Cache& cache() noexcept {
  static Cache* c = new Cache;
  return *c;
}

constexpr std::size_t kSmallPage = 4096;
constexpr std::size_t kHugePage = std::size_t{2} << 20;

std::size_t round_up(std::size_t n, std::size_t to) noexcept { return (n + to - 1) / to * to; }

// A block on 2 MiB pages: its payload starts on a 2 MiB boundary (plus the offset), its prefix
// sits at the end of the 4 KiB page before it, and the mapping runs to the payload's end (plus
// a line of slack) but at least one whole 2 MiB page, the least the kernel backs with a huge
// page. Null when the kernel maps nothing (the caller falls back to the allocator).
void* take_huge(unsigned k, std::size_t bytes, std::size_t offset) noexcept {
  const std::size_t tail = std::max(round_up(bytes + cache_line, kSmallPage), kHugePage);
  const std::size_t span = kSmallPage + tail + kHugePage;  // room to align
  void* m = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<std::uintptr_t>(m);
  const std::uintptr_t payload = round_up(base + kSmallPage, kHugePage);
  const std::uintptr_t keep = payload - kSmallPage;
  const std::uintptr_t end = payload + tail;
  if (keep > base) ::munmap(m, keep - base);
  if (base + span > end) ::munmap(reinterpret_cast<void*>(end), base + span - end);
  // Advice only: where the kernel has no huge pages to give, the block still works.
  const bool advised = ::madvise(reinterpret_cast<void*>(payload), tail, MADV_HUGEPAGE) == 0;
  auto* prefix = reinterpret_cast<Prefix*>(payload - kPrefix);
  *prefix = Prefix{k, advised ? 1u : 0u, kSmallPage + tail, reinterpret_cast<void*>(keep)};
  return reinterpret_cast<unsigned char*>(payload) + offset;
}

Prefix* prefix_of(const void* block) noexcept {
  // Back to the block's cache line (take's offset is below one), then past the prefix.
  const auto at = reinterpret_cast<std::uintptr_t>(block) & ~static_cast<std::uintptr_t>(cache_line - 1);
  return reinterpret_cast<Prefix*>(at - kPrefix);
}

void release_memory(Prefix* p) noexcept {
  if (p->map != nullptr) {
    ::munmap(p->map, p->footprint);
  } else {
    std::free(p);
  }
}

unsigned class_of(std::size_t size) noexcept {
  unsigned shift = kMinShift;
  while (shift <= kMaxShift && (std::size_t{1} << shift) < size) ++shift;
  return shift - kMinShift;  // kClasses when larger than the largest class
}

}  // namespace

void* take(std::size_t size, std::size_t offset) noexcept {
  offset &= cache_line - 1;
  const unsigned k = class_of(size);
  Cache& c = cache();
  c.uses.fetch_add(1, std::memory_order_relaxed);
  if (k < kClasses) {
    Class& cl = c.classes[k];
    void* block = nullptr;
    cl.lock.lock();
    if (cl.count != 0) block = cl.blocks[--cl.count];
    cl.lock.unlock();
    if (block != nullptr) {
      c.cached.fetch_sub(static_cast<Prefix*>(block)->footprint, std::memory_order_relaxed);
      return static_cast<unsigned char*>(block) + kPrefix + offset;
    }
  }
  const std::size_t bytes = k < kClasses ? (std::size_t{1} << (k + kMinShift)) : size;
  // A size no process can hold (a hostile peer's, say) fails here, without asking the allocator.
  if (bytes >= kNoAllocation) return nullptr;
  const std::size_t huge_from = c.huge_from.load(std::memory_order_relaxed);
  if (k < kClasses && huge_from != 0 && bytes >= huge_from) {
    if (void* block = take_huge(k, bytes, offset)) return block;  // else the allocator's pages
  }
  // A cache line of slack at the end leaves room for any offset; aligned_alloc wants a
  // multiple of the alignment.
  const std::size_t total = (kPrefix + bytes + cache_line + cache_line - 1) / cache_line * cache_line;
  void* raw = std::aligned_alloc(cache_line, total);
  if (raw == nullptr) return nullptr;
  *static_cast<Prefix*>(raw) = Prefix{k < kClasses ? k : kUncached, 0, bytes, nullptr};
  return static_cast<unsigned char*>(raw) + kPrefix + offset;
}

void give(void* block) noexcept {
  if (block == nullptr) return;
  Prefix* p = prefix_of(block);
  const std::uint32_t k = p->klass;
  Cache& c = cache();
  c.uses.fetch_add(1, std::memory_order_relaxed);
  if (k != kUncached) {
    const std::size_t bytes = p->footprint;
    if (c.cached.load(std::memory_order_relaxed) + bytes <= c.limit.load(std::memory_order_relaxed)) {
      Class& cl = c.classes[k];
      bool kept = false;
      cl.lock.lock();
      if (cl.count < kSlots) {
        cl.blocks[cl.count++] = p;
        kept = true;
      }
      cl.lock.unlock();
      if (kept) {
        c.cached.fetch_add(bytes, std::memory_order_relaxed);
        return;
      }
    }
  }
  release_memory(p);
}

namespace {

// Hands kept blocks back to the allocator, largest first, until the cache holds at most
// `bytes`; returns the bytes handed back.
std::size_t shrink_to(std::size_t bytes) noexcept {
  Cache& c = cache();
  std::size_t freed = 0;
  for (unsigned k = kClasses; k-- > 0;) {
    Class& cl = c.classes[k];
    while (c.cached.load(std::memory_order_relaxed) > bytes) {
      void* raw = nullptr;
      cl.lock.lock();
      if (cl.count != 0) raw = cl.blocks[--cl.count];
      cl.lock.unlock();
      if (raw == nullptr) break;
      auto* p = static_cast<Prefix*>(raw);
      c.cached.fetch_sub(p->footprint, std::memory_order_relaxed);
      freed += p->footprint;
      release_memory(p);
    }
  }
  return freed;
}

// release_if_rested's view of the cache, guarded by `busy` (one caller at a time; others
// return at once): the use count last seen, since when, and the count the last release left.
struct Rest {
  std::atomic_flag busy;
  std::uint64_t seen_uses = 0;
  std::int64_t seen_ns = 0;
  std::uint64_t left_uses = ~std::uint64_t{0};
};
Rest& rest() noexcept {
  static Rest* r = new Rest;  // never destroyed, as the cache
  return *r;
}

}  // namespace

void set_limit(std::size_t bytes) noexcept {
  cache().limit.store(bytes, std::memory_order_relaxed);
  (void)shrink_to(bytes);
}

std::size_t release_cached() noexcept { return shrink_to(0); }

std::size_t release_if_rested(std::int64_t now_ns, std::int64_t rest_ns) noexcept {
  Cache& c = cache();
  if (c.cached.load(std::memory_order_relaxed) == 0) return 0;
  Rest& r = rest();
  if (r.busy.test_and_set(std::memory_order_acquire)) return 0;
  std::size_t freed = 0;
  const std::uint64_t uses = c.uses.load(std::memory_order_relaxed);
  if (uses != r.seen_uses || r.seen_ns == 0) {
    r.seen_uses = uses;
    r.seen_ns = now_ns;
  } else if (uses != r.left_uses && now_ns - r.seen_ns >= rest_ns) {
    freed = shrink_to(0);
    r.left_uses = uses;  // the release itself takes and gives nothing through take and give
  }
  r.busy.clear(std::memory_order_release);
  return freed;
}

void set_huge_from(std::size_t bytes) noexcept { cache().huge_from.store(bytes, std::memory_order_relaxed); }

bool huge(const void* block) noexcept { return block != nullptr && prefix_of(block)->huge != 0; }

std::size_t cached_bytes() noexcept { return cache().cached.load(std::memory_order_relaxed); }

}  // namespace ferry::detail::recv_blocks
