// mpmc_ring.hpp — a bounded multi-producer multi-consumer queue on a ring of cells.
//
// Contract
//  - Any number of threads may call try_push and try_pop concurrently.
//  - try_push returns false when the ring is full, or when the cell it needs still holds an
//    element whose consumer has claimed it but not finished reading it (a preempted consumer
//    can make a ring that is not full refuse a push). try_pop returns false when the ring is
//    empty, or when the cell it needs is still being written by a producer that claimed it.
//    Neither ever spins on another thread. So a caller must be ready for a refusal even with
//    room to spare: CompletionQueue spills into an overflow list; PacketPool does not use
//    this ring for that reason.
//  - Elements are delivered FIFO with respect to the order in which producers claimed slots.
//  - Capacity is rounded up to a power of two. T must be nothrow-move-constructible.
//  - No allocation after construction.
//
// Algorithm: every cell carries a sequence number. A producer at position p may write cell
// p % N when seq == p; it claims p by CAS on the tail, writes, then publishes seq = p + 1. A
// consumer at position p may read when seq == p + 1; it claims p by CAS on the head, reads,
// then frees the cell for the next lap with seq = p + N.
//
// Memory orders
//  - seq loads are acquire and seq stores release: they carry the element's bytes from the
//    producer to the consumer and the cell's emptiness from the consumer to the next producer.
//  - head/tail CASes and loads are relaxed: a position is only a ticket; the data handoff is
//    entirely through seq, so the ticket need not order any other memory.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include "common/cache_line.hpp"
#include "common/queue_support.hpp"

namespace ferry::detail {

template <class T>
class MpmcRing {
  static_assert(std::is_nothrow_move_constructible_v<T>, "MpmcRing needs a nothrow move");

 public:
  explicit MpmcRing(std::size_t capacity) : mask_(round_up_pow2(capacity) - 1), cells_(new Cell[mask_ + 1]) {
    // The layout the padding is for: head and tail each alone on a line, the read-only mask
    // and cell pointer sharing a third. (Here because the class is complete only in a body.)
#ifndef __clang__  // clang does not count libstdc++'s unique_ptr as standard layout; gcc builds check
    static_assert(std::is_standard_layout_v<MpmcRing>);
    static_assert(offsetof(MpmcRing, head_) == 0 && offsetof(MpmcRing, tail_) == cache_line &&
                  offsetof(MpmcRing, mask_) == 2 * cache_line);
#endif
    static_assert(sizeof(MpmcRing) == 3 * cache_line && alignof(MpmcRing) == cache_line);
    for (std::size_t i = 0; i <= mask_; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
  }
  ~MpmcRing() {
    // Destroy what is still queued (single-threaded by contract at destruction).
    T item;
    while (try_pop(item)) {
    }
  }
  MpmcRing(const MpmcRing&) = delete;
  MpmcRing& operator=(const MpmcRing&) = delete;

  std::size_t capacity() const noexcept { return mask_ + 1; }

  template <class U>
  bool try_push(U&& value) noexcept {
    std::size_t pos = tail_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& cell = cells_[pos & mask_];
      const std::size_t seq = cell.seq.load(std::memory_order_acquire);
      const auto diff = static_cast<std::intptr_t>(seq) - static_cast<std::intptr_t>(pos);
      if (diff == 0) {
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          ::new (cell.storage()) T(std::forward<U>(value));
          cell.seq.store(pos + 1, std::memory_order_release);
          return true;
        }
      } else if (diff < 0) {
        return false;  // full: the cell still holds last lap's element
      } else {
        pos = tail_.load(std::memory_order_relaxed);
      }
    }
  }

  // Pushes items[0..k) for the largest k <= n whose cells are all free, claiming the k
  // positions with one CAS; returns k (0 as try_push's false). The items pushed are moved-from.
  // The k cells are checked before the claim: a cell at position q holds seq == q until the
  // producer that claims q writes it, and the tail only grows, so if the CAS from `pos` to
  // `pos + k` succeeds no other producer has claimed any of them meanwhile.
  std::size_t try_push_batch(T* items, std::size_t n) noexcept {
    if (n == 0) return 0;
    std::size_t pos = tail_.load(std::memory_order_relaxed);
    for (;;) {
      std::size_t k = 0;
      std::intptr_t diff = 0;
      while (k < n && k <= mask_) {
        const std::size_t seq = cells_[(pos + k) & mask_].seq.load(std::memory_order_acquire);
        diff = static_cast<std::intptr_t>(seq) - static_cast<std::intptr_t>(pos + k);
        if (diff != 0) break;
        ++k;
      }
      if (k == 0) {
        if (diff < 0) return 0;  // full
        pos = tail_.load(std::memory_order_relaxed);
        continue;
      }
      if (tail_.compare_exchange_weak(pos, pos + k, std::memory_order_relaxed)) {
        for (std::size_t i = 0; i < k; ++i) {
          Cell& cell = cells_[(pos + i) & mask_];
          ::new (cell.storage()) T(std::move(items[i]));
          cell.seq.store(pos + i + 1, std::memory_order_release);
        }
        return k;
      }
    }
  }

  // A claimed element still in its cell. The caller moves the element out through operator*;
  // the destructor then destroys what is left and frees the cell for the next lap (the seq
  // release store, so the next producer sees the cell empty only after the move). Returned as
  // a prvalue, never copied or moved. It lets a caller construct its result straight from the
  // cell, with nothing default-constructed first (CompletionQueue::pop).
  class Taken {
   public:
    Taken() noexcept = default;
    Taken(T* item, std::atomic<std::size_t>* seq, std::size_t next) noexcept : item_(item), seq_(seq), next_(next) {}
    Taken(const Taken&) = delete;
    Taken& operator=(const Taken&) = delete;
    ~Taken() {
      if (item_ == nullptr) return;
      item_->~T();
      seq_->store(next_, std::memory_order_release);
    }
    explicit operator bool() const noexcept { return item_ != nullptr; }
    T& operator*() const noexcept { return *item_; }

   private:
    T* item_ = nullptr;
    std::atomic<std::size_t>* seq_ = nullptr;
    std::size_t next_ = 0;
  };

  // Claims the oldest element; an empty Taken when try_pop would return false.
  Taken try_take() noexcept {
    std::size_t pos = head_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& cell = cells_[pos & mask_];
      const std::size_t seq = cell.seq.load(std::memory_order_acquire);
      const auto diff = static_cast<std::intptr_t>(seq) - static_cast<std::intptr_t>(pos + 1);
      if (diff == 0) {
        if (head_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          return Taken(std::launder(reinterpret_cast<T*>(cell.storage())), &cell.seq, pos + mask_ + 1);
        }
      } else if (diff < 0) {
        return Taken();  // empty, or its producer has not published yet
      } else {
        pos = head_.load(std::memory_order_relaxed);
      }
    }
  }

  // Out is T or std::optional<T> (see take_into).
  template <class Out>
  bool try_pop(Out& out) noexcept {
    Taken taken = try_take();
    if (!taken) return false;
    take_into(out, std::move(*taken));
    return true;
  }

  // A snapshot; exact only when no thread is pushing or popping.
  std::size_t size_approx() const noexcept {
    const std::size_t t = tail_.load(std::memory_order_relaxed);
    const std::size_t h = head_.load(std::memory_order_relaxed);
    return t >= h ? t - h : 0;
  }

 private:
  struct Cell {
    std::atomic<std::size_t> seq;
    alignas(T) unsigned char bytes[sizeof(T)];
    void* storage() noexcept { return bytes; }
  };
  // Producers and consumers hammer different counters: keep them on separate lines.
  alignas(cache_line) std::atomic<std::size_t> head_{0};
  alignas(cache_line) std::atomic<std::size_t> tail_{0};
  alignas(cache_line) const std::size_t mask_;
  std::unique_ptr<Cell[]> cells_;
};

}  // namespace ferry::detail
