// faa_ring.hpp — a bounded multi-producer multi-consumer queue in the LCRQ class: producers and
// consumers take tickets with fetch-and-add (never a CAS retry loop on head or tail) and meet in
// a ring of cells. This is one CRQ of LCRQ (Morrison & Afek, PPoPP 2013) rebuilt on 64-bit
// atomics, without LCRQ's list of rings.
//
// Contract
//  - Any number of threads may call try_push and try_pop concurrently. Neither ever waits for
//    another thread.
//  - try_push returns false when the ring is full (its ticket is a whole lap ahead of the
//    consumers), or after kMaxAttempts tickets in a row were unusable (cells held by preempted
//    consumers or producers: "starvation" in LCRQ's terms). A refused push leaves the value
//    with the caller. CompletionQueue spills refused pushes into its overflow list.
//  - try_pop returns false when the ring is empty, or when the only elements are still being
//    written (a consumer that finds its cell mid-write hands the write back to its producer,
//    which retries with a new ticket; see "abandoned" below).
//  - A failed push may burn a ticket; consumers skip burnt tickets. So right after a refused
//    push the ring can accept fewer than capacity() elements until consumers pass the burnt
//    tickets (MpmcRing never burns; this ring trades that for FAA instead of CAS on the
//    counters).
//  - FIFO: elements come out in ticket order; in particular one producer's elements come out in
//    its push order (each push takes a later ticket than the previous one).
//  - Capacity is rounded up to a power of two (at least 2). T must be nothrow move
//    constructible and assignable. No allocation after construction.
//
// Why bounded (not LCRQ's unbounded list of rings): LCRQ closes a ring when it is full or a
// producer starves, and links a fresh ring. A closed ring may be freed only when no thread still
// holds a pointer to it, which needs hazard pointers or an epoch scheme on every operation (an
// extra contended or fenced access), or else keeping every ring ever made until the queue dies,
// which grows without bound in a long-running process that overflows now and then. The
// CompletionQueue already catches refused pushes in its overflow list, so a bounded ring
// keeps memory fixed and the fast path short.
//
// Cell state word (64 bits): idx << 3 | unsafe << 2 | status.
//  - idx: the ticket that may use the cell next (EMPTY) or that uses it now (other states).
//    It only grows; a cell starts at idx = its index.
//  - status: EMPTY (no element), WRITING (producer idx claimed it and is moving the element
//    in), FULL (element of ticket idx is there), ABANDONED (consumer idx found it WRITING and
//    gave the ticket up; producer idx takes its element back and retries).
//  - unsafe: LCRQ's "unsafe" bit. A consumer with ticket h that finds an older lap's element
//    still in its cell cannot wait for it, so it marks the cell unsafe and moves on; a producer
//    with ticket t may then use the cell only if no consumer has taken ticket t yet
//    (head <= t), since otherwise its element would sit where no consumer will ever look.
//
// Producer with ticket t: may claim the cell when it is EMPTY with idx <= t and (safe, or
// head <= t): CAS to WRITING(t), move the element in, CAS to FULL(t) (keeping the unsafe bit
// that consumers may have set meanwhile). If the cell is not usable it takes a new ticket.
// Consumer with ticket h, cell state s (a CAS on the cell for every case but idx > h, so a
// producer with ticket h always sees the consumer's visit, see "memory orders"):
//  - FULL(h): take the element, then EMPTY(h + N).
//  - WRITING(h): ABANDONED(h); the producer sees it when it publishes.
//  - EMPTY with idx <= h: EMPTY(h + N), so producer h (and any older one) can no longer use it.
//  - an older ticket's element (idx < h, not EMPTY): set unsafe.
//  - idx > h: a later lap owns the cell; producer h can never use it (idx only grows).
// Then, if tail <= h + 1 the ring is empty: return false (after moving tail up to head if the
// consumers overtook it, LCRQ's fixState, so producers do not burn the skipped tickets).
//
// Memory orders
//  - Cell state RMWs are acq_rel and its loads acquire: the state carries the element's bytes
//    from producer to consumer (FULL), the cell's emptiness from consumer to the next producer
//    (EMPTY after a read, or ABANDONED back to EMPTY after the producer reclaimed its element).
//    Every state change after the first is an RMW, so a later acquire load synchronizes with
//    every release in the chain (C++20 release sequences are made of RMWs).
//  - head/tail fetch_adds and loads are relaxed: a ticket orders nothing by itself. The one
//    place where a counter's value decides safety is the producer's "head <= t" test on an
//    unsafe cell. It is sound with a relaxed load: the producer read the cell (acquire) after
//    consumer t's unsafe-marking CAS (release, sequenced after consumer t's fetch_add on head)
//    or after a later RMW in its release sequence, so that fetch_add happens before the head
//    load, which therefore returns at least t + 1. If the producer instead read the cell before
//    consumer t touched it, its CAS expects that old state and fails once consumer t has
//    changed it, or consumer t finds WRITING/FULL(t) and deals with it.
//  - The "full" and "empty" tests on head/tail are heuristics: a stale value only refuses a
//    push or a pop early (both allowed) and never loses or duplicates an element.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <new>

#include "common/cache_line.hpp"
#include "common/queue_support.hpp"

namespace ferry::detail {

template <QueueElement T>
class FaaRing {
 public:
  // Unusable tickets in a row before try_push gives up (LCRQ closes its ring at this point).
  static constexpr int kMaxAttempts = 64;

  explicit FaaRing(std::size_t capacity) : mask_(round_up_pow2(capacity) - 1), cells_(new Cell[mask_ + 1]) {
    // The layout the padding is for: head and tail each alone on a line (consumers and
    // producers hammer them), the read-only mask and cell pointer sharing a third.
#ifndef __clang__  // clang does not count libstdc++'s unique_ptr as standard layout; gcc builds check
    static_assert(std::is_standard_layout_v<FaaRing>);
    static_assert(offsetof(FaaRing, head_) == 0 && offsetof(FaaRing, tail_) == cache_line &&
                  offsetof(FaaRing, mask_) == 2 * cache_line);
#endif
    static_assert(sizeof(FaaRing) == 3 * cache_line && alignof(FaaRing) == cache_line);
    for (std::uint64_t i = 0; i <= mask_; ++i) cells_[i].state.store(i << kIdxShift, std::memory_order_relaxed);
  }
  ~FaaRing() {
    // Single-threaded by contract: every element still queued is at a ticket in [head, tail).
    T item;
    while (try_pop(item)) {
    }
  }
  FaaRing(const FaaRing&) = delete;
  FaaRing& operator=(const FaaRing&) = delete;

  std::size_t capacity() const noexcept { return static_cast<std::size_t>(mask_ + 1); }

  bool try_push(T&& value) noexcept {
    const std::uint64_t n = mask_ + 1;
    for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
      const std::uint64_t t = tail_.fetch_add(1, std::memory_order_relaxed);
      Cell& cell = cells_[t & mask_];
      std::uint64_t s = cell.state.load(std::memory_order_acquire);
      for (;;) {
        if ((s & kStatusMask) != kEmpty || (s >> kIdxShift) > t) break;  // not ours to use
        if ((s & kUnsafe) != 0 && head_.load(std::memory_order_relaxed) > t) break;
        // The new state is safe: either it was, or no consumer has ticket t yet.
        if (cell.state.compare_exchange_weak(s, (t << kIdxShift) | kWriting, std::memory_order_acq_rel,
                                             std::memory_order_acquire)) {
          ::new (cell.storage()) T(std::move(value));
          if (publish(cell, t)) return true;
          // Consumer t gave up on us: take the element back, free the cell for the next lap.
          T* item = std::launder(reinterpret_cast<T*>(cell.storage()));
          value = std::move(*item);
          item->~T();
          cell.state.fetch_add((n << kIdxShift) - kAbandoned, std::memory_order_acq_rel);  // -> EMPTY(t + n)
          break;
        }
      }
      // Ticket t is burnt. Full when it is a whole lap ahead of the consumers.
      const std::uint64_t h = head_.load(std::memory_order_relaxed);
      if (static_cast<std::int64_t>(t - h) >= static_cast<std::int64_t>(n)) return false;
    }
    return false;
  }

  // Out is T or std::optional<T> (see take_into).
  template <class Out>
  bool try_pop(Out& out) noexcept {
    const std::uint64_t n = mask_ + 1;
    // Empty check before taking a ticket: spinning consumers on an empty ring would otherwise
    // push head past tail and make producers burn the tickets they skipped.
    if (static_cast<std::int64_t>(tail_.load(std::memory_order_relaxed) - head_.load(std::memory_order_relaxed)) <= 0) {
      return false;
    }
    for (;;) {
      const std::uint64_t h = head_.fetch_add(1, std::memory_order_relaxed);
      Cell& cell = cells_[h & mask_];
      std::uint64_t s = cell.state.load(std::memory_order_acquire);
      for (;;) {
        const std::uint64_t idx = s >> kIdxShift;
        if (idx > h) break;
        const std::uint64_t status = s & kStatusMask;
        if (idx == h && status == kFull) {
          T* item = std::launder(reinterpret_cast<T*>(cell.storage()));
          take_into(out, std::move(*item));
          item->~T();
          // FULL(h) -> EMPTY(h + n), keeping the unsafe bit whatever other consumers set
          // meanwhile: one fetch_add, no CAS loop. Release: our reads of the element happen
          // before the next producer's write.
          cell.state.fetch_add((n << kIdxShift) - kFull, std::memory_order_release);
          return true;
        }
        std::uint64_t want;
        if (idx == h && status == kWriting) {
          want = (s & ~kStatusMask) | kAbandoned;
        } else if (status == kEmpty) {
          want = ((h + n) << kIdxShift) | (s & kUnsafe) | kEmpty;
        } else {
          want = s | kUnsafe;  // idx < h: an older ticket's element; its consumer will come
        }
        if (cell.state.compare_exchange_weak(s, want, std::memory_order_acq_rel, std::memory_order_acquire)) break;
      }
      const std::uint64_t t = tail_.load(std::memory_order_relaxed);
      if (static_cast<std::int64_t>(t - (h + 1)) <= 0) {
        fix_state();
        return false;
      }
    }
  }

  // A snapshot; exact only when no thread is pushing or popping and no ticket was burnt.
  std::size_t size_approx() const noexcept {
    const std::uint64_t t = tail_.load(std::memory_order_relaxed);
    const std::uint64_t h = head_.load(std::memory_order_relaxed);
    return t > h ? static_cast<std::size_t>(t - h) : 0;
  }

 private:
  static constexpr std::uint64_t kEmpty = 0, kWriting = 1, kFull = 2, kAbandoned = 3;
  static constexpr std::uint64_t kStatusMask = 3, kUnsafe = 4;
  static constexpr unsigned kIdxShift = 3;
  // The status arithmetic above (FULL - 2 = EMPTY, ABANDONED - 3 = EMPTY) must not borrow from
  // the unsafe bit, and the bits must not overlap.
  static_assert(kFull < kUnsafe && kAbandoned < kUnsafe && (kStatusMask & kUnsafe) == 0);
  static_assert((kStatusMask | kUnsafe) < (std::uint64_t{1} << kIdxShift));

  struct alignas(cache_line) Cell {
    std::atomic<std::uint64_t> state;
    alignas(T) unsigned char bytes[sizeof(T)];
    void* storage() noexcept { return bytes; }
  };
  // Neighbouring tickets go to neighbouring cells and are served by different threads at the
  // same moment: one cell per cache line (or several whole lines), never two cells on one line.
  static_assert(sizeof(Cell) % cache_line == 0 && alignof(Cell) >= cache_line);
  static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

  // WRITING(t, u) -> FULL(t, u). Fails when consumer t marked the write ABANDONED.
  static bool publish(Cell& cell, std::uint64_t t) noexcept {
    std::uint64_t s = (t << kIdxShift) | kWriting;
    for (;;) {
      if ((s & kStatusMask) == kAbandoned) return false;
      // Release: the element's bytes travel with FULL. Acquire on failure: harmless, and the
      // reclaim path then owns the cell's bytes again.
      if (cell.state.compare_exchange_weak(s, (s & ~kStatusMask) | kFull, std::memory_order_acq_rel,
                                           std::memory_order_acquire)) {
        return true;
      }
    }
  }

  // Consumers that found the ring empty have moved head past tail: move tail up so producers
  // do not take (and burn) tickets every consumer already passed.
  void fix_state() noexcept {
    std::uint64_t t = tail_.load(std::memory_order_relaxed);
    for (;;) {
      const std::uint64_t h = head_.load(std::memory_order_relaxed);
      if (static_cast<std::int64_t>(h - t) <= 0) return;
      if (tail_.compare_exchange_weak(t, h, std::memory_order_relaxed)) return;
    }
  }

  alignas(cache_line) std::atomic<std::uint64_t> head_{0};
  alignas(cache_line) std::atomic<std::uint64_t> tail_{0};
  alignas(cache_line) const std::uint64_t mask_;
  std::unique_ptr<Cell[]> cells_;
};

}  // namespace ferry::detail
