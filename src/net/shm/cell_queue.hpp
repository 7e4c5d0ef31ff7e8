// cell_queue.hpp — the bounded multi-producer, single-consumer queue of fixed cells that
// carries every shared-memory message into one receiving (rank, device).
//
// Layout. The queue lives in its receiver's shared-memory segment: a tail counter on a cache
// line of its own, a head counter on another, then `count` cells (a power of two) of `stride`
// bytes each, stride a multiple of the cache line. A cell is a 40-byte CellHeader followed by
// its payload inline, so a message of up to 24 bytes touches exactly one cache line on the way
// in and one on the way out. The consumer's working head is private; the shared head is how
// far it has freed cells, stored once per poll.
//
// Algorithm (a bounded multi-producer, single-consumer queue: Vyukov's cell sequence numbers
// for publication, a shared head for room). Cell i starts with seq = i. A position p maps to
// cell p & (count-1). A producer claims position p with a CAS tail: p -> p+1, allowed only
// while p < head + count (head: the shared head, every position below it consumed and free).
// It marks the cell claimed (seq = claimed_seq(p, its rank): the top bit set, so the cell does
// not read as published), fills it, then stores seq = p+1. The consumer at position h reads
// the cell once seq == h+1 (a value no earlier lap and no mark can hold), and later stores a
// head past it. A sender that dies between claim and publish leaves its mark: once that rank
// is known failed, the consumer moves past the cell (skip_dead_claim) instead of waiting
// forever. Only the one instruction between the CAS and the mark is unprotected.
//
// Why room comes from a head rather than from each cell's seq: a producer that read the
// cell's seq to see it free would pull the line the consumer is spinning on before writing
// it, and the consumer's release store would pull it back again; with the cores far apart
// each such transfer costs a few hundred nanoseconds. Here a producer's first touch of the
// cell is a store, the mark, fill and publish leave its store buffer together, and the
// consumer never writes a cell. Producers read the shared head only when the head they last
// saw (seen_head_) leaves no room, so its line stays with the consumer.
//
// Contract
//  - try_claim()/publish() by any thread of any process that maps the segment, concurrently.
//    try_claim never blocks and never waits for another producer: a full queue returns null
//    (the transport answers -EAGAIN). Every claimed cell must be published, promptly — the
//    consumer cannot pass an unpublished cell (it looks empty until then), so a sender
//    preempted between its claim and its publish delays that receiver's later messages until
//    it runs again (other senders go on until the queue fills). Nothing that can block or
//    fail may sit between the two.
//  - peek()/free_below()/skip_dead_claim() by one thread at a time, the receiver's poll-lock
//    holder. Cells come out in the order their positions were claimed, so two messages of
//    one sending thread arrive in the order sent. A cell the consumer has passed stays
//    readable until it frees it with free_below(): that is how the transport lends payloads.
//  - Nothing here trusts the cells' contents or the shared counters: the consumer validates
//    every header field it uses (the transport does that). A corrupt seq can only make a cell
//    look empty or full; a corrupt head can only make producers overwrite cells whose
//    messages the consumer then validates.
//  - Lock-free, no system call, no allocation.
//
// Memory orders
//  - The consumer stores the head with release after its reads of every cell below it; a
//    producer loads it with acquire, so those reads happen before the producer overwrites a
//    cell. seen_head_ (this process's copy) is stored with release and loaded with acquire so
//    that a thread using another thread's copy is ordered after the consumer's reads too.
//  - The CAS on tail is relaxed (and the tail loads too): tail only arbitrates which producer
//    owns a position — the CAS's atomicity gives that alone — and carries no data; room is
//    decided by the head, data handoff by the cell's seq.
//  - publish() stores seq = p+1 with release, ordering the cell's header and payload before
//    it; the consumer's acquire load of seq pairs with it.
//  - The claim mark is relaxed: it orders no data, and the consumer acts on it only for a
//    rank already failed, whose process writes nothing more.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>

#include "common/cache_line.hpp"
#include "common/tsan.hpp"

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

// A view of one queue in mapped memory; copying the view does not copy the queue (it copies
// the head this process last saw, which is only ever a lower bound of the true one).
class CellQueue {
 public:
  CellQueue() = default;
  // tail, head: the shared counters (each on its own cache line); cells: the first cell
  // (cache-line aligned); count: a power of two.
  CellQueue(std::atomic<std::uint64_t>* tail, std::atomic<std::uint64_t>* head, unsigned char* cells,
            std::uint64_t count, std::size_t stride) noexcept
      : tail_(tail), head_(head), cells_(cells), mask_(count - 1), stride_(stride) {}
  CellQueue(const CellQueue& o) noexcept
      : tail_(o.tail_), head_(o.head_), cells_(o.cells_), mask_(o.mask_), stride_(o.stride_),
        seen_head_(o.seen_head_.load(std::memory_order_acquire)) {}
  CellQueue& operator=(const CellQueue& o) noexcept {
    tail_ = o.tail_;
    head_ = o.head_;
    cells_ = o.cells_;
    mask_ = o.mask_;
    stride_ = o.stride_;
    seen_head_.store(o.seen_head_.load(std::memory_order_acquire), std::memory_order_release);
    return *this;
  }

  // Builds an empty queue in fresh memory. Only the owner, before any other party sees it.
  static void initialize(void* tail, void* head, unsigned char* cells, std::uint64_t count, std::size_t stride) noexcept {
    new (tail) std::atomic<std::uint64_t>(0);
    new (head) std::atomic<std::uint64_t>(0);
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
    std::uint64_t freed = seen_head_.load(std::memory_order_acquire);
    for (;;) {
      // Signed: p may be an old tail that the head has passed since (the CAS then fails).
      if (static_cast<std::int64_t>(p - freed) > static_cast<std::int64_t>(mask_)) {
        freed = head_->load(std::memory_order_acquire);
        seen_head_.store(freed, std::memory_order_release);
        if (static_cast<std::int64_t>(p - freed) > static_cast<std::int64_t>(mask_)) {
          return nullptr;  // cell p still holds the message of position p - count: full
        }
      }
      if (tail_->compare_exchange_weak(p, p + 1, std::memory_order_relaxed, std::memory_order_relaxed)) {
        CellHeader* c = cell(p);
        // The previous lap's producer of this cell, if it was a thread of this process, published
        // it with a release on seq; the consumer, in another process, read it before the head
        // that gave this claim room. TSan sees neither the consumer nor the head's store: say
        // that the publish happens before this claim, as it does through them.
        detail::tsan_acquire(&c->seq);
        c->seq.store(mark | (p & kPosMask), std::memory_order_relaxed);
        pos = p;
        return c;
      }
      // p now holds the current tail: try again there.
    }
  }
  static void publish(CellHeader* c, std::uint64_t pos) noexcept { c->seq.store(pos + 1, std::memory_order_release); }

  // Consumer: the cell at head if it is published, else null.
  CellHeader* peek(std::uint64_t head) noexcept {
    CellHeader* c = cell(head);
    return c->seq.load(std::memory_order_acquire) == head + 1 ? c : nullptr;
  }
  // Consumer: every position below `pos` is read and its cell free for producers. Never lower
  // than a value stored before.
  void free_below(std::uint64_t pos) noexcept { head_->store(pos, std::memory_order_release); }
  // Consumer, when peek(head) found nothing: true if the cell at head is claimed by a rank
  // `failed` names (it will never be published): the consumer moves past it, and frees it
  // with free_below like any other.
  template <class Failed>
  bool skip_dead_claim(std::uint64_t head, Failed failed) noexcept {
    CellHeader* c = cell(head);
    const std::uint64_t s = c->seq.load(std::memory_order_acquire);
    if ((s & kClaimedBit) == 0 || s != claimed_seq(head, static_cast<int>((s >> kPosBits) & 0xFFFFFF))) return false;
    return failed(static_cast<int>((s >> kPosBits) & 0xFFFFFF));
  }

 private:
  CellHeader* cell(std::uint64_t pos) const noexcept {
    return reinterpret_cast<CellHeader*>(cells_ + (pos & mask_) * stride_);
  }

  std::atomic<std::uint64_t>* tail_ = nullptr;
  std::atomic<std::uint64_t>* head_ = nullptr;
  unsigned char* cells_ = nullptr;
  std::uint64_t mask_ = 0;
  std::size_t stride_ = 0;
  // The shared head as this process last read it: a lower bound (the head only grows), so
  // acting on an old value can only refuse a claim that had room, and then the head is read.
  std::atomic<std::uint64_t> seen_head_{0};
};

}  // namespace ferry::net::shm
