// am_rma.hpp — ferry's RMA over UCP active messages: the wire records and the requester's
// table of operations in flight.
//
// UCX 1.13 emulates put and get in software over active messages wherever an endpoint has no
// RMA lane (its shared-memory transports, tcp): the target's UCX answers a get request, or
// acknowledges a put, from inside its progress, and when that answer cannot be sent (the
// requester died after asking) UCX aborts the process ("unexpected error: Endpoint timeout",
// ucp_request_try_send). So to such peers ferry does the same protocol itself, where a failed
// answer is an error it handles: a put is one active message carrying its bytes (UCX picks
// eager or rendezvous; rendezvous moves them zero-copy where UCX can, cross-memory attach
// within a host), acknowledged by the target once written; a get is a request the target
// answers with the bytes. The target checks every request against its registrations (key,
// range, access) before it touches memory: the header is bytes from the wire. No remote key
// travels, so the first operation on a registration needs no key round trip. A rendezvous
// read to a peer reached by cross-memory attach may instead be pushed: the target writes the
// bytes into the requester's memory itself and says so (PushHeader, kAmPushDone).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/spinlock.hpp"
#include "net/op_context.hpp"

namespace ferry::net::ucx {

// Active message ids (beside the transport's own 1-4).
constexpr unsigned kAmPut = 5;       // header: PutHeader; data: the bytes
constexpr unsigned kAmGet = 6;       // header: GetHeader; no data
constexpr unsigned kAmGetReply = 7;  // header: RmaReply; data: the bytes (none on error)
constexpr unsigned kAmPutAck = 8;    // header: RmaReply; no data
constexpr unsigned kAmGetPush = 9;   // header: PushHeader; no data
constexpr unsigned kAmPushDone = 10; // header: RmaReply (offset 0); no data

enum PutFlag : std::uint32_t {
  put_ack = 1,     // the requester waits for an RmaReply (put, put_data; not inject_put)
  put_notify = 2,  // put_data: the target reports a remote write with `data` once written
};

struct PutHeader {
  std::int32_t from;
  std::uint32_t flags;  // PutFlag bits
  std::uint64_t id;     // the requester's operation, echoed in the acknowledgement
  std::uint64_t addr;
  std::uint64_t key;
  std::uint64_t length;
  std::uint64_t data;  // put_notify: the notification's data
};
struct GetHeader {
  std::int32_t from;
  std::uint32_t pad;
  std::uint64_t id;
  std::uint64_t addr;
  std::uint64_t key;
  std::uint64_t length;
};
// A pushed get (Transport::get_pushed, to a peer this rank reaches by cross-memory attach):
// the target writes the bytes to `dest` in the requester's memory itself and answers with
// kAmPushDone; a target that cannot write there answers as a get, with the bytes.
struct PushHeader {
  GetHeader get;
  std::uint64_t dest;
};
struct RmaReply {
  std::int32_t from;
  std::int32_t error;  // 0, or a negative errno value (-EINVAL: no such registration or range)
  std::uint64_t id;
  std::uint64_t offset;  // a get's answer: where in the get these bytes go
};

// A get's answer to a peer on this host comes in pieces of at most this many bytes, each one
// eager message that UCX copies through its queue in one piece (its shared-memory segments are
// 8 KiB) and the requester copies straight into place: two copies, as UCX's own emulation.
// (One message of the whole would be reassembled by UCX first: a third copy.)
constexpr std::size_t kGetPiece = 8000;
// Answer messages in flight to one peer (UCX's queue to it holds 64 by default). Per peer: over
// UCX's shared memory the sends to a peer that died stay queued for good.
constexpr std::size_t kPieces = 64;
// Bytes of gets a requester keeps in flight (at least one get).
constexpr std::size_t kGetWindow = std::size_t{2} << 20;

// An answer message in flight: its header, which UCX reads until the send completes.
struct Piece {
  void* owner;  // the transport, for the send's callback (its user data is the Piece)
  int to;
  RmaReply head;
};

// The target's: a put whose bytes UCX's rendezvous is moving into place.
struct PendingPut {
  void* transport;
  PutHeader head;
};
// A pushed get the target's poll serves after its progress, outside the worker lock.
struct Push {
  int from;
  std::uint64_t id;
  std::uint64_t addr;
  std::uint64_t length;
  std::uint64_t dest;
};
// An answer the target's poll sends: an acknowledgement, or a get's bytes (addr, length).
struct Answer {
  unsigned am;
  int to;
  RmaReply reply;
  std::uint64_t addr;
  std::uint64_t length;
};

// The requester's operations in flight, by id: a fixed table (no allocation per operation),
// the id carrying the slot and a generation, so an answer to an operation that is gone
// (stale, or bytes from the wire that name none) finds nothing.
//
// Contract: every call under lock() (posting threads, the data callbacks, the poll lock
// holder; RMA only, never the message path). A slot is free once its send completed and its
// answer came (inject_put waits for none), so the header UCX may still read while the send is
// queued stays valid. Every path that reports an operation's event clears `awaiting` with it,
// so an answer finds only operations that have not reported.
class RmaOps {
 public:
  struct Op {
    void* owner = nullptr;  // the transport, for the send's callback (its user data is the Op)
    std::uint64_t id = 0;   // 0: free
    OpContext* ctx = nullptr;
    std::int32_t rank = -1;
    bool sending = false;   // UCX has not completed the send yet
    bool awaiting = false;  // the target's answer has not come
    bool finished = false;  // its event was pushed (or it has none)
    std::size_t received = 0;  // a get's bytes in place so far
    bool counted = false;      // a get whose length is in `getting`
    bool pushed = false;       // a pushed get: kAmPushDone may end it
    void* buffer = nullptr;  // a get's destination
    std::size_t length = 0;
    union {
      PutHeader put;
      GetHeader get;
      PushHeader push;
    } head{};
    unsigned char* bounce = nullptr;  // inject_put: the transport's bounce slot holding its bytes
  };

  RmaOps(std::size_t slots, void* owner) : ops_(slots) {
    for (Op& op : ops_) op.owner = owner;
    free_.reserve(slots);
    for (std::size_t i = slots; i-- > 0;) free_.push_back(static_cast<std::uint32_t>(i));
  }

  detail::SpinLock& lock() noexcept { return lock_; }

  std::size_t getting = 0;  // bytes of gets in flight (under lock())
  // A get's bytes leave `getting` when it ends, or when its peer failed (its request may stay
  // queued to the dead peer for good).
  void uncount(Op* op) noexcept {
    if (!op->counted) return;
    getting -= op->length;
    op->counted = false;
  }

  // A free slot for an operation to `rank`, or null when all are in flight (-EAGAIN).
  Op* claim(OpContext* ctx, int rank, bool awaiting) noexcept {
    if (free_.empty()) return nullptr;
    const std::uint32_t slot = free_.back();
    free_.pop_back();
    Op& op = ops_[slot];
    op.id = (++generation_ << 20) | (slot + 1);  // never 0
    op.ctx = ctx;
    op.rank = rank;
    op.sending = true;
    op.awaiting = awaiting;
    op.finished = false;
    op.buffer = nullptr;
    op.length = 0;
    op.received = 0;
    op.counted = false;
    op.pushed = false;
    op.bounce = nullptr;
    return &op;
  }
  Op* find(std::uint64_t id) noexcept {
    const std::uint64_t slot = (id & ((1u << 20) - 1));
    if (slot == 0 || slot > ops_.size()) return nullptr;
    Op& op = ops_[slot - 1];
    return op.id == id ? &op : nullptr;
  }
  // Frees the slot once neither the send nor the answer is outstanding.
  void settle(Op* op) noexcept {
    if (op->sending || op->awaiting) return;
    uncount(op);
    op->id = 0;
    free_.push_back(static_cast<std::uint32_t>(op - ops_.data()));  // reserved: no allocation
  }
  // Each operation in flight to `rank`.
  template <class F>
  void each_to(int rank, F&& each) noexcept {
    for (Op& op : ops_) {
      if (op.id == 0 || op.rank != rank) continue;
      each(op);
    }
  }

 private:
  detail::SpinLock lock_;
  std::vector<Op> ops_;
  std::vector<std::uint32_t> free_;
  std::uint64_t generation_ = 0;
};

}  // namespace ferry::net::ucx
