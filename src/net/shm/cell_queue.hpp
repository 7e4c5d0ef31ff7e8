// cell_queue.hpp — the bounded multi-producer, single-consumer queue of fixed cells that
// carries every shared-memory message into one receiving (rank, device).
//
// Layout. The queue lives in its receiver's shared-memory segment: a tail counter on a cache
// line of its own, a head counter on another, then `count` cells (a power of two) of `stride`
// bytes each, stride a multiple of the cache line, then `count` claim words (8 bytes each). A
// cell is a 40-byte CellHeader followed by its payload inline, so a message of up to 24 bytes
// touches exactly one cache line on the way in and one on the way out. The consumer's working
// head is private; the shared head is how far it has freed cells, stored once per poll.
//
// Algorithm (a bounded multi-producer, single-consumer queue: Vyukov's cell sequence numbers
// for publication, a shared head for room, a claim word per cell for ownership). A position p
// maps to cell p & (count-1), to the claim word of the same index, and to lap p / count. A
// producer claims p with one CAS on that claim word, from the previous lap (the value every
// word starts with, or was last claimed with) to (p's lap, its rank), allowed only while
// p < head + count (head: the shared head, every position below it consumed and free). It
// then fills the cell (its seq first marked busy, then the header and payload) and stores
// seq = p+1. The consumer at position h reads the cell once seq == h+1 (a value no earlier lap
// and no busy mark can hold), and later stores a head past it. The tail is only a hint of
// where to start: the claimer of p stores p+1 there, and a producer that finds the word of its
// position taken (claimed for p's lap, or for a later one when its hint was old) moves past
// the position the word names. Every position below a claimed one was claimed (claims are made
// in order from the hint, and the hint only ever holds a claimed position + 1), so claims
// leave no gap.
//
// A sender that dies: the claim and the record of who claimed are one atomic write, so there
// is no instant at which a position is taken but its owner unknown. Once the claimer's rank is
// known failed, the consumer, finding the cell unpublished, reads the claim word and moves past
// the cell (skip_dead_claim) instead of waiting forever. (The claim was once a CAS on the tail
// followed by a mark in the cell: a sender killed between the two, in a window of a few
// instructions that preemption can stretch to a time slice, left a cell nobody could name,
// and the receiver stalled behind it.)
//
// Why room comes from a head rather than from each cell's seq, and why ownership is not marked
// in the cell: a producer that read or CASed the cell would pull the line the consumer is
// spinning on before writing it, and the consumer's next read would pull it back before the
// producer's stores; with the cores far apart each such transfer costs a few hundred
// nanoseconds. Here a producer's first touch of the cell is a store (the busy mark); mark,
// fill and publish leave its store buffer together, and the consumer never writes a cell.
// The claim words and the tail are lines only producers touch (the consumer reads a claim
// word only once some rank has failed), and producers read the shared head only when the
// head they last saw (seen_head_) leaves no room, so its line stays with the consumer.
// (Claiming by a CAS on the cell's seq instead halved ferry's 8 B message rate with the cores
// far apart; the claim words cost the raw transport's streaming rate up to a fifth, ferry's
// nothing beyond its run-to-run spread: README.md here.)
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
//  - Nothing here trusts the cells' contents or the shared words: the consumer validates
//    every header field it uses (the transport does that). A corrupt seq can only make a cell
//    look empty or full; a corrupt head can only make producers overwrite cells whose
//    messages the consumer then validates; a corrupt claim word can only make producers
//    pass positions (the consumer then waits at the first, as for a cell never published;
//    a word that names a later lap than the one a producer claims sends it past the room, so
//    the queue looks full), a corrupt tail only change where they start looking (far ahead:
//    the queue looks full).
//  - Lock-free, no system call, no allocation.
//
// Memory orders
//  - The consumer stores the head with release after its reads of every cell below it; a
//    producer loads it with acquire, so those reads happen before the producer overwrites a
//    cell. seen_head_ (this process's copy) is stored with release and loaded with acquire so
//    that a thread using another thread's copy is ordered after the consumer's reads too.
//  - The CAS's atomicity alone decides which producer owns a position, and the word carries
//    no data (room is decided by the head, data handoff by the cell's seq), so the producers'
//    loads of claim words are relaxed. A claim the consumer passes because its claimer died is
//    published by nothing: it reaches the next lap's producers through the consumer's read of
//    the word, which comes before its release of the head (read-read coherence then keeps a
//    producer from reading an older word, which would make it pass a free position and leave a
//    gap). The CAS's release and that read's acquire make the order plain; on x86 they cost
//    nothing (any CAS is a full barrier there).
//  - The tail hint is relaxed: an old or lowered hint costs a producer more claim-word loads
//    (up to a lap of them), never a wrong claim. The busy mark is relaxed: the consumer never
//    acts on it.
//  - publish() stores seq = p+1 with release, ordering the cell's header and payload before
//    it; the consumer's acquire load of seq pairs with it.
#pragma once

#include <atomic>
#include <bit>
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
  // (cache-line aligned); claims: the first of `count` claim words; count: a power of two, at
  // most 2^24 (the segment checks it), so a jump past a claimed lap stays within 64 bits.
  CellQueue(std::atomic<std::uint64_t>* tail, std::atomic<std::uint64_t>* head, unsigned char* cells,
            std::atomic<std::uint64_t>* claims, std::uint64_t count, std::size_t stride) noexcept
      : tail_(tail), head_(head), cells_(cells), claims_(claims), mask_(count - 1), stride_(stride),
        lap_shift_(std::countr_zero(count)) {}
  CellQueue(const CellQueue& o) noexcept
      : tail_(o.tail_), head_(o.head_), cells_(o.cells_), claims_(o.claims_), mask_(o.mask_), stride_(o.stride_),
        lap_shift_(o.lap_shift_), seen_head_(o.seen_head_.load(std::memory_order_acquire)) {}
  CellQueue& operator=(const CellQueue& o) noexcept {
    tail_ = o.tail_;
    head_ = o.head_;
    cells_ = o.cells_;
    claims_ = o.claims_;
    mask_ = o.mask_;
    stride_ = o.stride_;
    lap_shift_ = o.lap_shift_;
    seen_head_.store(o.seen_head_.load(std::memory_order_acquire), std::memory_order_release);
    return *this;
  }

  // Builds an empty queue. Only the owner, before any other party sees it. `zeroed`: the cells'
  // memory is known to read as zeros (a fresh shm file), so their headers are left untouched: a
  // seq of 0 is never position + 1 of a lap-0 position, which is all peek asks of an unused
  // cell, and a cell's page then becomes resident only when a message first lands in it.
  static void initialize(void* tail, void* head, unsigned char* cells, void* claims, std::uint64_t count,
                         std::size_t stride, bool zeroed = false) noexcept {
    new (tail) std::atomic<std::uint64_t>(0);
    new (head) std::atomic<std::uint64_t>(0);
    auto* words = static_cast<std::atomic<std::uint64_t>*>(claims);
    for (std::uint64_t i = 0; i < count; ++i) {
      if (!zeroed) {
        auto* c = new (cells + i * stride) CellHeader{};
        c->seq.store(0, std::memory_order_relaxed);  // published by whatever hands the segment out
      }
      // As if lap -1 had been claimed by nobody: position i (lap 0) is free to claim.
      new (&words[i]) std::atomic<std::uint64_t>(claim_word(kLapMask, kUnknownClaimer));
    }
  }

  static constexpr std::size_t stride_for(std::size_t payload) noexcept {
    return (kCellHeaderBytes + payload + detail::cache_line - 1) / detail::cache_line * detail::cache_line;
  }
  // The claim words' bytes, rounded to whole 128-byte pairs of lines.
  static constexpr std::size_t claims_bytes(std::uint64_t count) noexcept {
    return static_cast<std::size_t>((count * sizeof(std::uint64_t) + 127) / 128 * 128);
  }

  std::uint64_t count() const noexcept { return mask_ + 1; }
  bool valid() const noexcept { return tail_ != nullptr; }

  // A claim word: the claimer's rank in the top 24 bits, the claimed position's lap (position /
  // count, modulo 2^40) below; the word's index gives the rest of the position. Laps are
  // compared modulo 2^40: a word repeats a value only after 2^40 laps of its queue (2^48
  // messages with 256 cells), far more than a producer can sleep through between its load and
  // its CAS.
  static constexpr int kLapBits = 40;
  static constexpr std::uint64_t kLapMask = (std::uint64_t{1} << kLapBits) - 1;
  static constexpr int kUnknownClaimer = 0xFFFFFF;  // never a failed rank
  // A claimed cell's seq until its publish: never position + 1 of any position.
  static constexpr std::uint64_t kBusySeq = std::uint64_t{1} << 63;
  // A producer's rank part of the claim word, computed once (claim_mark(rank)).
  static constexpr std::uint64_t claim_mark(int rank) noexcept {
    return static_cast<std::uint64_t>(rank & 0xFFFFFF) << kLapBits;
  }
  static constexpr std::uint64_t claim_word(std::uint64_t lap, int rank) noexcept {
    return claim_mark(rank) | (lap & kLapMask);
  }

  // Producer: a cell to fill and the position to publish it at, or null when full. The claim
  // word records `mark` (claim_mark of this process's rank) as the claimer.
  CellHeader* try_claim(std::uint64_t& pos, std::uint64_t mark = claim_mark(kUnknownClaimer)) noexcept {
    std::uint64_t p = tail_->load(std::memory_order_relaxed);
    std::uint64_t freed = seen_head_.load(std::memory_order_acquire);
    for (;;) {
      // Signed: p may be an old tail that the head has passed since (its word is then taken).
      if (static_cast<std::int64_t>(p - freed) > static_cast<std::int64_t>(mask_)) {
        freed = head_->load(std::memory_order_acquire);
        seen_head_.store(freed, std::memory_order_release);
        if (static_cast<std::int64_t>(p - freed) > static_cast<std::int64_t>(mask_)) {
          return nullptr;  // cell p still holds the message of position p - count: full
        }
      }
      std::atomic<std::uint64_t>& word = claims_[p & mask_];
      const std::uint64_t lap = p >> lap_shift_;
      std::uint64_t w = word.load(std::memory_order_relaxed);
      if (((w - (lap - 1)) & kLapMask) == 0 &&
          word.compare_exchange_strong(w, mark | (lap & kLapMask), std::memory_order_release, std::memory_order_relaxed)) {
        tail_->store(p + 1, std::memory_order_relaxed);
        CellHeader* c = cell(p);
        // The previous lap's producer of this cell, if it was a thread of this process, published
        // it with a release on seq; the consumer, in another process, read it before the head
        // that gave this claim room. TSan sees neither the consumer nor the head's store: say
        // that the publish happens before this claim, as it does through them.
        detail::tsan_acquire(&c->seq);
        // The cell's first write, at once: it asks for the line the fill and publish write
        // next (a value the consumer never takes for a publish: the top bit is set). The
        // claim word, not this, names the claimer; a producer killed here left that already.
        c->seq.store(kBusySeq | p, std::memory_order_relaxed);
        pos = p;
        return c;
      }
      // Position p is taken: w names p's lap, or a later one when p is an old hint. Every
      // position below a claimed one is claimed too, so the search goes on past w's. A word of
      // an earlier lap than p's previous cannot be seen here: room says p - count was consumed,
      // so claimed, and the claim happened before the consumer passed it (published with a
      // release, or, a dead claim, read with an acquire by skip_dead_claim) and so before the
      // head that gave this room. A corrupt one is passed like a taken one.
      const std::uint64_t ahead = (w - lap) & kLapMask;
      p += ahead < (kLapMask >> 1) ? (ahead << lap_shift_) + 1 : 1;
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
  // Consumer, when peek(head) found nothing: true if position head was claimed by a rank
  // `failed` names and its cell is still unpublished (it never will be): the consumer moves
  // past it, and frees it with free_below like any other. (A rank can be declared failed
  // while its process still runs, by the keepalive or a transport error: a cell it published
  // by now is read, not passed. One that publishes later, after the cell was passed, is not
  // caught: its writes land in a freed cell, as the contract's "a failed rank writes nothing
  // more" excludes.)
  template <class Failed>
  bool skip_dead_claim(std::uint64_t head, Failed failed) noexcept {
    const std::uint64_t w = claims_[head & mask_].load(std::memory_order_acquire);
    if (((w - (head >> lap_shift_)) & kLapMask) != 0) return false;  // not claimed yet
    if (!failed(static_cast<int>(w >> kLapBits))) return false;
    return cell(head)->seq.load(std::memory_order_acquire) != head + 1;
  }

 private:
  CellHeader* cell(std::uint64_t pos) const noexcept {
    return reinterpret_cast<CellHeader*>(cells_ + (pos & mask_) * stride_);
  }

  std::atomic<std::uint64_t>* tail_ = nullptr;
  std::atomic<std::uint64_t>* head_ = nullptr;
  unsigned char* cells_ = nullptr;
  std::atomic<std::uint64_t>* claims_ = nullptr;
  std::uint64_t mask_ = 0;
  std::size_t stride_ = 0;
  int lap_shift_ = 0;  // log2(count)
  // The shared head as this process last read it: a lower bound (the head only grows), so
  // acting on an old value can only refuse a claim that had room, and then the head is read.
  std::atomic<std::uint64_t> seen_head_{0};
};

}  // namespace ferry::net::shm
