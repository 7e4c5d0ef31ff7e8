// ms_queue.hpp — the Michael–Scott lock-free linked queue (PODC 1996), with its nodes in a
// per-queue pool addressed by tagged 32-bit indices.
//
// Contract
//  - Any number of threads may call try_push and try_pop concurrently; both are lock-free
//    (a thread retries only when another thread's CAS succeeded).
//  - try_push returns false only when the node pool is exhausted: capacity() elements are
//    queued or still being read by consumers that dequeued them. A refused push leaves the
//    value with the caller. try_pop returns false only when the queue is empty.
//  - FIFO (linearizable): elements come out in the order their link CASes succeeded.
//  - Capacity is rounded up to a power of two (at least 2). T must be nothrow move
//    constructible and assignable. No allocation after construction.
//
// Memory: the pool is one array of capacity() + 1 nodes (one is always the dummy), allocated
// at construction and freed only by the destructor, so a thread that read a stale index never
// touches freed memory. Free nodes sit on a Treiber stack with a tagged head (like PacketPool).
// Every link word (head, tail, node.next, the free-list head) is tag << 32 | index, and every
// successful CAS or reuse increments the tag, so a CAS made with a stale snapshot fails (no
// ABA; a thread would have to sleep through 2^32 updates of one word for a tag to repeat).
//
// Node reuse: Michael–Scott reads the value before the head CAS; with a non-trivial T that read
// would race with the winner moving it out. Here the winner of the head CAS moves the value out
// of the new dummy afterwards. A node is then done with only after two events: its value was
// taken (by the thread whose head CAS made it the dummy) and it was unlinked (by the thread
// whose head CAS moved past it). Each event adds one to node.releases; whoever makes it 2
// returns the node to the pool. (The initial dummy starts at 1: it has no value.)
//
// Memory orders
//  - The link CAS on node.next is release (failure relaxed) and every load of a next word is
//    acquire: the element and the new node's next word, written before linking, are visible to
//    whoever follows the link.
//  - head/tail loads are acquire and their CASes release (head: acq_rel): a thread that reads
//    an index from them reads that node's next word as initialized before it was published.
//  - releases.fetch_add is acq_rel: the value's reader and the unlinker both happen before the
//    pool push, hence before the next owner writes the node.
//  - Free-list push CAS is release and pop loads/CAS acquire (the free_next link, as PacketPool).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <new>

#include "common/cache_line.hpp"
#include "common/queue_support.hpp"

namespace ferry::detail {

template <QueueElement T>
class MsQueue {
 public:
  // CompletionQueue caps capacities at 2^28, so the rounded capacity fits 32 bits.
  explicit MsQueue(std::size_t capacity)
      : capacity_(static_cast<std::uint32_t>(round_up_pow2(capacity))), nodes_(new Node[capacity_ + 1]) {
    // The layout the padding is for: head, tail and the free-list head each alone on a line,
    // the read-only capacity and node pointer sharing a fourth.
#ifndef __clang__  // clang does not count libstdc++'s unique_ptr as standard layout; gcc builds check
    static_assert(std::is_standard_layout_v<MsQueue>);
    static_assert(offsetof(MsQueue, head_) == 0 && offsetof(MsQueue, tail_) == cache_line &&
                  offsetof(MsQueue, free_) == 2 * cache_line && offsetof(MsQueue, capacity_) == 3 * cache_line);
#endif
    static_assert(sizeof(MsQueue) == 4 * cache_line && alignof(MsQueue) == cache_line);
    for (std::uint32_t i = 0; i <= capacity_; ++i) {
      nodes_[i].next.store(kNil, std::memory_order_relaxed);
      nodes_[i].releases.store(0, std::memory_order_relaxed);
    }
    nodes_[0].releases.store(1, std::memory_order_relaxed);  // the dummy has no value to take
    head_.store(0, std::memory_order_relaxed);
    tail_.store(0, std::memory_order_relaxed);
    free_.store(kNil, std::memory_order_relaxed);
    for (std::uint32_t i = capacity_; i >= 1; --i) pool_push(i);
  }
  ~MsQueue() {
    T item;  // single-threaded by contract: destroy what is still queued
    while (try_pop(item)) {
    }
  }
  MsQueue(const MsQueue&) = delete;
  MsQueue& operator=(const MsQueue&) = delete;

  std::size_t capacity() const noexcept { return capacity_; }

  bool try_push(T&& value) noexcept {
    const std::uint32_t n = pool_pop();
    if (n == kNilIndex) return false;
    Node& node = nodes_[n];
    ::new (node.storage()) T(std::move(value));
    node.releases.store(0, std::memory_order_relaxed);
    // A new tag for the next word: a stale enqueuer's CAS on this node's old next fails.
    const std::uint64_t old_next = node.next.load(std::memory_order_relaxed);
    node.next.store(pack(tag_of(old_next) + 1, kNilIndex), std::memory_order_relaxed);
    for (;;) {
      std::uint64_t tail = tail_.load(std::memory_order_acquire);
      Node& last = nodes_[index_of(tail)];
      std::uint64_t next = last.next.load(std::memory_order_acquire);
      if (tail != tail_.load(std::memory_order_acquire)) continue;  // last may be stale
      if (index_of(next) == kNilIndex) {
        if (last.next.compare_exchange_weak(next, pack(tag_of(next) + 1, n), std::memory_order_release,
                                            std::memory_order_relaxed)) {
          // Swing the tail; if it fails, someone already helped.
          tail_.compare_exchange_strong(tail, pack(tag_of(tail) + 1, n), std::memory_order_release,
                                        std::memory_order_relaxed);
          return true;
        }
      } else {
        // The tail lags: help it along, then retry.
        tail_.compare_exchange_strong(tail, pack(tag_of(tail) + 1, index_of(next)), std::memory_order_release,
                                      std::memory_order_relaxed);
      }
    }
  }

  // Out is T or std::optional<T> (see take_into).
  template <class Out>
  bool try_pop(Out& out) noexcept {
    for (;;) {
      std::uint64_t head = head_.load(std::memory_order_acquire);
      const std::uint64_t tail = tail_.load(std::memory_order_acquire);
      const std::uint64_t next = nodes_[index_of(head)].next.load(std::memory_order_acquire);
      if (head != head_.load(std::memory_order_acquire)) continue;  // the snapshot is inconsistent
      if (index_of(head) == index_of(tail)) {
        if (index_of(next) == kNilIndex) return false;  // empty
        std::uint64_t t = tail;                          // the tail lags behind a new node: help
        tail_.compare_exchange_strong(t, pack(tag_of(tail) + 1, index_of(next)), std::memory_order_release,
                                      std::memory_order_relaxed);
        continue;
      }
      if (index_of(next) == kNilIndex) continue;  // head moved on between our loads
      if (head_.compare_exchange_weak(head, pack(tag_of(head) + 1, index_of(next)), std::memory_order_acq_rel,
                                      std::memory_order_relaxed)) {
        const std::uint32_t taken = index_of(next);
        T* item = std::launder(reinterpret_cast<T*>(nodes_[taken].storage()));
        take_into(out, std::move(*item));
        item->~T();
        release(taken);           // its value is taken (it is the dummy now)
        release(index_of(head));  // the old dummy is unlinked
        return true;
      }
    }
  }

 private:
  static constexpr std::uint32_t kNilIndex = 0xFFFFFFFFu;
  static constexpr std::uint64_t kNil = kNilIndex;  // tag 0, index nil

  struct alignas(cache_line) Node {
    std::atomic<std::uint64_t> next;       // queue link, tag << 32 | index
    std::atomic<std::uint32_t> releases;   // 0..2, see "node reuse"
    std::atomic<std::uint32_t> free_next;  // free-list link (index only; the head is tagged)
    alignas(T) unsigned char bytes[sizeof(T)];
    void* storage() noexcept { return bytes; }
  };
  // One node per cache line (or whole lines): a producer filling one node does not slow the
  // consumer reading its neighbour.
  static_assert(sizeof(Node) % cache_line == 0 && alignof(Node) >= cache_line);
  static_assert(std::atomic<std::uint64_t>::is_always_lock_free && std::atomic<std::uint32_t>::is_always_lock_free);

  static std::uint64_t pack(std::uint64_t tag, std::uint32_t index) noexcept { return tag << 32 | index; }
  static std::uint32_t index_of(std::uint64_t w) noexcept { return static_cast<std::uint32_t>(w); }
  static std::uint64_t tag_of(std::uint64_t w) noexcept { return w >> 32; }

  void release(std::uint32_t i) noexcept {
    if (nodes_[i].releases.fetch_add(1, std::memory_order_acq_rel) == 1) pool_push(i);
  }

  std::uint32_t pool_pop() noexcept {
    std::uint64_t top = free_.load(std::memory_order_acquire);
    for (;;) {
      const std::uint32_t i = index_of(top);
      if (i == kNilIndex) return kNilIndex;
      // Relaxed: if node i was popped and reused meanwhile, the head's tag moved and the CAS fails.
      const std::uint32_t below = nodes_[i].free_next.load(std::memory_order_relaxed);
      if (free_.compare_exchange_weak(top, pack(tag_of(top) + 1, below), std::memory_order_acquire,
                                      std::memory_order_acquire)) {
        return i;
      }
    }
  }

  void pool_push(std::uint32_t i) noexcept {
    std::uint64_t top = free_.load(std::memory_order_relaxed);
    for (;;) {
      nodes_[i].free_next.store(index_of(top), std::memory_order_relaxed);
      if (free_.compare_exchange_weak(top, pack(tag_of(top) + 1, i), std::memory_order_release,
                                      std::memory_order_relaxed)) {
        return;
      }
    }
  }

  alignas(cache_line) std::atomic<std::uint64_t> head_;
  alignas(cache_line) std::atomic<std::uint64_t> tail_;
  alignas(cache_line) std::atomic<std::uint64_t> free_;
  alignas(cache_line) const std::uint32_t capacity_;
  std::unique_ptr<Node[]> nodes_;
};

}  // namespace ferry::detail
