// fragments.hpp — the medium-message protocol: eager messages sent as inject-size pieces.
//
// A message whose header and payload exceed the link's inject size, up to the link's
// fragment limit, goes as pieces of at most kMaxFragmentFrame bytes injected straight from the
// caller's buffer, so the send completes at once and costs the transport no handshake. A piece
// the transport refuses midway leaves the rest of the message in a pool packet (or a heap
// block, past a packet's size) on the backlog; every later message post and every progress
// call sends the backlog first (a post that cannot answers retry), so one thread's messages
// keep their order. The receiver reassembles in the packet of the first piece to arrive, or
// in a receive block when the message is larger than a packet.
//
// Concurrency. post() and clear() by any thread. The backlog is a FIFO of packets in their
// `backlog` view, linked by Packet::next under lock_: flushers only try it, a post that queues
// a tail holds it for three stores. count_ is the fast check on every post. It changes only
// under lock_, so whenever the lock is free it equals the number of queued tails, and the
// thread that queued a tail reads nonzero until that tail has gone. Release on the decrement
// after a tail's last piece and acquire in clear() put that piece before any message the
// checking thread sends. on_fragment() only by the poll lock holder (it owns partials_).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/spinlock.hpp"
#include "core/device_context.hpp"

namespace ferry::detail {

class Fragments {
 public:
  explicit Fragments(DeviceContext& dc);
  ~Fragments();
  Fragments(const Fragments&) = delete;
  Fragments& operator=(const Fragments&) = delete;

  // Sends an am or msg of `size` bytes as pieces (l.fragmented(size) holds).
  Status post(Link& l, MsgKind kind, std::uint16_t target, Tag tag, int rank, const void* buffer, std::size_t size);
  // A post's first step: false (answer retry) while earlier pieces wait in the backlog.
  bool clear() { return count_.load(std::memory_order_acquire) == 0 || flush(); }
  // Sends what it can of the backlog; true when the backlog is empty.
  bool flush();
  // Tails waiting in the backlog. Relaxed: a stale value only delays a flush to the next call.
  std::size_t backlog() const noexcept { return count_.load(std::memory_order_relaxed); }

  // A reassembled message: `packet` holds its header (of the message's own kind) and, when
  // `heap` is null, its payload (arrived.length set); else `heap` holds its `size` bytes.
  // packet == nullptr: nothing complete yet.
  struct Whole {
    Packet* packet = nullptr;
    unsigned char* heap = nullptr;
    std::size_t size = 0;
  };
  // Takes an arrived piece (its packet is consumed). The packet holds the piece's headers;
  // its `length - kFragmentHeader` payload bytes are at `payload`: in the packet, or in a
  // transport's lent memory, from where they go straight to the message being gathered.
  Whole on_fragment(Packet* p, std::size_t length, const unsigned char* payload);
  // `rank` failed: its partly gathered messages can never complete and are dropped. (Backlog
  // tails to it are dropped by flush.)
  void fail_peer(int rank);

 private:
  DeviceContext& dc_;
  std::atomic<std::uint32_t> next_id_{0};  // message ids: names, they order nothing
  SpinLock lock_;
  Packet* head_ = nullptr;
  Packet* tail_ = nullptr;
  std::atomic<std::size_t> count_{0};
  // Messages being reassembled. Few at a time (one per sending thread that is mid-message),
  // so a linear search; capacity reserved up front.
  struct Partial {
    std::int32_t src;
    std::uint32_t id;
    Packet* packet;       // holds the message: WireHeader (its own kind), then the payload
    unsigned char* heap;  // the payload instead, when the message is larger than a packet
    std::uint32_t received;
    std::uint32_t total;  // from the first fragment to arrive: every later one must agree
  };
  std::vector<Partial> partials_;
};

}  // namespace ferry::detail
