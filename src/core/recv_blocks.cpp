#include "core/recv_blocks.hpp"

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
  std::atomic<std::size_t> limit{std::size_t{256} << 20};
};

// Never destroyed: buffers may be released by static destructors or after main returns.
Cache& cache() noexcept {
  static Cache* c = new Cache;
  return *c;
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
  if (k < kClasses) {
    Class& cl = c.classes[k];
    void* block = nullptr;
    cl.lock.lock();
    if (cl.count != 0) block = cl.blocks[--cl.count];
    cl.lock.unlock();
    if (block != nullptr) {
      c.cached.fetch_sub(std::size_t{1} << (k + kMinShift), std::memory_order_relaxed);
      return static_cast<unsigned char*>(block) + kPrefix + offset;
    }
  }
  const std::size_t bytes = k < kClasses ? (std::size_t{1} << (k + kMinShift)) : size;
  // A size no process can hold (a hostile peer's, say) fails here, without asking the allocator.
  if (bytes >= kNoAllocation) return nullptr;
  // A cache line of slack at the end leaves room for any offset; aligned_alloc wants a
  // multiple of the alignment.
  const std::size_t total = (kPrefix + bytes + cache_line + cache_line - 1) / cache_line * cache_line;
  void* raw = std::aligned_alloc(cache_line, total);
  if (raw == nullptr) return nullptr;
  static_cast<Prefix*>(raw)->klass = k < kClasses ? k : kUncached;
  return static_cast<unsigned char*>(raw) + kPrefix + offset;
}

void give(void* block) noexcept {
  if (block == nullptr) return;
  // Back to the block's cache line (take's offset is below one), then past the prefix.
  const auto at = reinterpret_cast<std::uintptr_t>(block) & ~static_cast<std::uintptr_t>(cache_line - 1);
  void* raw = reinterpret_cast<unsigned char*>(at) - kPrefix;
  const std::uint32_t k = static_cast<Prefix*>(raw)->klass;
  Cache& c = cache();
  if (k != kUncached) {
    const std::size_t bytes = std::size_t{1} << (k + kMinShift);
    if (c.cached.load(std::memory_order_relaxed) + bytes <= c.limit.load(std::memory_order_relaxed)) {
      Class& cl = c.classes[k];
      bool kept = false;
      cl.lock.lock();
      if (cl.count < kSlots) {
        cl.blocks[cl.count++] = raw;
        kept = true;
      }
      cl.lock.unlock();
      if (kept) {
        c.cached.fetch_add(bytes, std::memory_order_relaxed);
        return;
      }
    }
  }
  std::free(raw);
}

void set_limit(std::size_t bytes) noexcept {
  Cache& c = cache();
  c.limit.store(bytes, std::memory_order_relaxed);
  // Hand kept blocks back to the allocator, largest first, until the cache fits the new limit.
  for (unsigned k = kClasses; k-- > 0;) {
    Class& cl = c.classes[k];
    while (c.cached.load(std::memory_order_relaxed) > bytes) {
      void* raw = nullptr;
      cl.lock.lock();
      if (cl.count != 0) raw = cl.blocks[--cl.count];
      cl.lock.unlock();
      if (raw == nullptr) break;
      c.cached.fetch_sub(std::size_t{1} << (k + kMinShift), std::memory_order_relaxed);
      std::free(raw);
    }
  }
}

std::size_t cached_bytes() noexcept { return cache().cached.load(std::memory_order_relaxed); }

}  // namespace ferry::detail::recv_blocks
