// cell_queue.hpp — the bounded multi-producer, single-consumer queue of fixed cells that
// carries every shared-memory message into one receiving (rank, device).
//
// Layout. The queue lives in its receiver's shared-memory segment: one tail counter on a cache
// line of its own, then `count` cells (a power of two) of `stride` bytes each, stride a
// multiple of the cache line. A cell is a 40-byte CellHeader followed by its payload inline,
// so a message of up to 24 bytes touches exactly one cache line on the way in and one on the
// way out. The consumer's head is not shared: it lives in the receiver's private memory.
//
// Algorithm (Vyukov's bounded queue, single consumer). Cell i starts with seq = i. A position
// p maps to cell p & (count-1) and
//   seq == p            the cell is free for the producer that claims position p,
//   seq == p + 1        it holds the message published at position p,
//   seq == p + count    the consumer has released it: free for position p + count.
// A producer claims position p with a CAS tail: p -> p+1, marks the cell claimed (seq =
// claimed_seq(p, its rank): the top bit set, so the cell is neither free nor published), fills
// it, then stores seq = p+1. The consumer at head h reads the cell once seq == h+1, then
// stores h + count. A sender that dies between claim and publish leaves its mark: once that
// rank is known failed, the consumer frees the cell and moves past it (skip_dead_claim)
// instead of waiting forever. Only the one instruction between the CAS and the mark is
// unprotected.
//
// Contract
//  - try_claim()/publish() by any thread of any process that maps the segment, concurrently.
//    try_claim never blocks and never waits for another producer: a full queue returns null
//    (the transport answers -EAGAIN). Every claimed cell must be published, promptly — the
//    consumer cannot pass an unpublished cell (it looks empty until then), so a sender
//    preempted between its claim and its publish delays that receiver's later messages until
//    it runs again (other senders go on until the queue fills). Nothing that can block or
//    fail may sit between the two.
//  - peek()/release() by one thread at a time, the receiver's poll-lock holder. Cells come
//    out in the order their positions were claimed, so two messages of one sending thread
//    arrive in the order sent.
//  - Nothing here trusts the cells' contents: the consumer validates every header field it
//    uses (the transport does that). A corrupt seq can only make a cell look empty or full.
//  - Lock-free, no system call, no allocation.
//
// Memory orders
//  - Producer loads of seq are acquire: they pair with the consumer's release store of
//    h + count, so the consumer's reads of the previous message happen before this producer
//    overwrites the cell.
//  - The CAS on tail is relaxed (and the tail loads too): tail only arbitrates which producer
//    owns a position — the CAS's atomicity gives that alone — and carries no data; every data
//    handoff goes through the cell's seq.
//  - publish() stores seq = p+1 with release, ordering the cell's header and payload before
//    it; the consumer's acquire load of seq pairs with it.
//  - The claim mark is relaxed: it orders no data (the cell is empty), and a later producer
//    at p + count reads it as "full" whatever it sees; the consumer acts on it only for a rank
//    already failed, whose process writes nothing more.
//  - release() stores h + count with release (pairs with the producer's acquire above).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>

#include "common/cache_line.hpp"

namespace ferry::net::shm {

// What a cell carries. Values come from another process: the consumer checks them.
enum class CellKind : std::uint32_t {
  message = 1,       // a send or inject; payload = the message
  remote_write = 2,  // a put_data's notice: arg0 = data, arg1 = bytes written
  put_chunk = 3,     // copy mode: payload goes to the receiver's address arg0
  get_request = 4,   // arg0 = address, arg1 = request id, payload[0..8) = bytes wanted; a pushed
                     // get adds payload[8..16) = where to write them in the requester
  get_reply = 5,     // copy mode: arg0 = request id, arg1 = offset; aux = errno (0: data follows)
  nop = 6,           // a claimed cell whose operation failed after the claim: skip it
  get_done = 7,      // a pushed get was written: arg0 = request id, arg1 = bytes; aux = errno
};
inline constexpr std::uint32_t kCellKindMax = 7;

struct CellHeader {
  std::atomic<std::uint64_t> seq;
  std::uint32_t length;  // payload bytes
  std::int32_t rank;     // the sender
  std::uint32_t kind;    // a CellKind
  std::uint32_t aux;
  std::uint64_t arg0;
  std::uint64_t arg1;
};
inline constexpr std::size_t kCellHeaderBytes = 40;
static_assert(sizeof(CellHeader) == kCellHeaderBytes, "cell header layout is shared between processes");
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "seq must be address-free across processes");

inline unsigned char* cell_payload(CellHeader* c) noexcept {
  return reinterpret_cast<unsigned char*>(c) + kCellHeaderBytes;
}

// A view of one queue in mapped memory; copying the view does not copy the queue.
class CellQueue {
 public:
  CellQueue() = default;
  // tail: the shared counter; cells: the first cell (cache-line aligned); count: a power of two.
  CellQueue(std::atomic<std::uint64_t>* tail, unsigned char* cells, std::uint64_t count, std::size_t stride) noexcept
      : tail_(tail), cells_(cells), mask_(count - 1), stride_(stride) {}

  // Builds an empty queue in fresh memory. Only the owner, before any other party sees it.
  static void initialize(void* tail, unsigned char* cells, std::uint64_t count, std::size_t stride) noexcept {
    new (tail) std::atomic<std::uint64_t>(0);
    for (std::uint64_t i = 0; i < count; ++i) {
      auto* c = new (cells + i * stride) CellHeader{};
      c->seq.store(i, std::memory_order_relaxed);  // published by whatever hands the segment out
    }
  }

  static constexpr std::size_t stride_for(std::size_t payload) noexcept {
    return (kCellHeaderBytes + payload + detail::cache_line - 1) / detail::cache_line * detail::cache_line;
  }

  std::uint64_t count() const noexcept { return mask_ + 1; }
  bool valid() const noexcept { return tail_ != nullptr; }

  // The mark of a cell claimed at `pos` by `rank` and not yet published.
  static constexpr std::uint64_t kClaimedBit = std::uint64_t{1} << 63;
  static constexpr int kPosBits = 39;
  static constexpr int kUnknownClaimer = 0xFFFFFF;  // never a failed rank
  static constexpr std::uint64_t kPosMask = (std::uint64_t{1} << kPosBits) - 1;
  // A producer's mark without the position, computed once (claim_mark(rank)).
  static constexpr std::uint64_t claim_mark(int rank) noexcept {
    return kClaimedBit | (static_cast<std::uint64_t>(rank & 0xFFFFFF) << kPosBits);
  }
  static constexpr std::uint64_t claimed_seq(std::uint64_t pos, int rank) noexcept { return claim_mark(rank) | (pos & kPosMask); }

  // Producer: a cell to fill and the position to publish it at, or null when full. The cell
  // is marked claimed with `mark` (claim_mark of this process's rank).
  CellHeader* try_claim(std::uint64_t& pos, std::uint64_t mark = claim_mark(kUnknownClaimer)) noexcept {
    std::uint64_t p = tail_->load(std::memory_order_relaxed);
    for (;;) {
      CellHeader* c = cell(p);
      const std::uint64_t seq = c->seq.load(std::memory_order_acquire);
      const auto diff = static_cast<std::int64_t>(seq - p);
      if (diff == 0) {
        if (tail_->compare_exchange_weak(p, p + 1, std::memory_order_relaxed, std::memory_order_relaxed)) {
          c->seq.store(mark | (p & kPosMask), std::memory_order_relaxed);
          pos = p;
          return c;
        }
        // p now holds the current tail: try again there.
      } else if (diff < 0) {
        return nullptr;  // the cell still holds the message of position p - count: full
      } else {
        p = tail_->load(std::memory_order_relaxed);  // another producer took p
      }
    }
  }
  static void publish(CellHeader* c, std::uint64_t pos) noexcept { c->seq.store(pos + 1, std::memory_order_release); }

  // Consumer: the cell at head if it is published, else null.
  CellHeader* peek(std::uint64_t head) noexcept {
    CellHeader* c = cell(head);
    return c->seq.load(std::memory_order_acquire) == head + 1 ? c : nullptr;
  }
  void release(CellHeader* c, std::uint64_t head) noexcept {
    c->seq.store(head + mask_ + 1, std::memory_order_release);
  }
  // Consumer, when peek(head) found nothing: if the cell at head is claimed by a rank `failed`
  // names (it will never be published), frees it and returns true: the consumer moves on.
  template <class Failed>
  bool skip_dead_claim(std::uint64_t head, Failed failed) noexcept {
    CellHeader* c = cell(head);
    const std::uint64_t s = c->seq.load(std::memory_order_acquire);
    if ((s & kClaimedBit) == 0 || s != claimed_seq(head, static_cast<int>((s >> kPosBits) & 0xFFFFFF))) return false;
    if (!failed(static_cast<int>((s >> kPosBits) & 0xFFFFFF))) return false;
    release(c, head);
    return true;
  }

 private:
  CellHeader* cell(std::uint64_t pos) const noexcept {
    return reinterpret_cast<CellHeader*>(cells_ + (pos & mask_) * stride_);
  }

  std::atomic<std::uint64_t>* tail_ = nullptr;
  unsigned char* cells_ = nullptr;
  std::uint64_t mask_ = 0;
  std::size_t stride_ = 0;
};

}  // namespace ferry::net::shm
