// device.hpp — one device: its transports, packets, and the protocols.
//
// A device reaches each peer through one transport (net/transport.hpp): shared memory for
// ranks on its host, a network backend for the others, or one backend for all. A Link is the
// device's record of one transport; route_[rank] names the link that reaches `rank`.
//
// Code paths and their rules
//  - small-message path (post_am / post_send up to eager_limit(), and progress delivering
//    them): a packet from the pool (thread cache), one memcpy, the transport's inject or
//    send; on the receiver one poll, a push into the target completion queue, one receive
//    repost. No allocation, no blocking lock, no system call but the transport's.
//  - medium path (eager messages whose header and payload exceed the provider's inject size,
//    when fragmenting is on): the message goes as inject-size fragments straight from the
//    caller's buffer, so the send completes at once and costs the provider no handshake. A
//    fragment the provider refuses midway leaves the rest of the message in a pool packet on
//    the device's backlog; every later message post and every progress call sends the backlog
//    first (a post that cannot answers retry), so one thread's messages keep their order.
//    The receiver reassembles in the packet of the first fragment to arrive.
//  - rendezvous and multi-chunk RMA: may allocate an operation record and register memory;
//    network calls for them are issued by progress from the deferred list.
//  - setup/teardown: anything goes.
// Progress runs under a try-lock: one thread polls a device at a time and others return at
// once. Everything only progress touches (posted receive count, deferred list drain) is
// owned by the lock holder.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/matching.hpp"
#include "core/packet_pool.hpp"
#include "common/spinlock.hpp"
#include "core/wire.hpp"
#include "ferry/runtime.hpp"
#include "net/transport.hpp"

namespace ferry::detail {

class RuntimeImpl;
struct SendOp;
struct RecvOp;
struct RmaOp;

struct RegionImpl {
  class DeviceImpl* device = nullptr;
  void* data = nullptr;
  std::size_t size = 0;
  std::uint64_t key = 0;  // the key peers name it by (the network transport's; shared memory needs none)
  std::vector<std::pair<net::Transport*, net::Registration*>> registrations;  // one per transport
  ~RegionImpl();
};

// The device's record of one transport.
struct Link {
  net::Transport* transport;
  const net::Caps* caps;
  net::Registration* pool_registration;  // the packet slab
  void* pool_desc;                       // its desc() under local_registration, else null
  std::size_t fragment_payload;          // payload bytes per fragment; 0 when not fragmenting
  std::size_t fragment_limit;            // messages past the inject size and up to this are fragmented
  std::size_t posted_recvs;              // owned by the poll lock holder
  // Whether a message of `size` payload bytes goes as fragments over this link.
  bool fragmented(std::size_t size) const noexcept {
    return size <= fragment_limit && sizeof(WireHeader) + size > caps->inject_size;
  }
};

class DeviceImpl {
 public:
  // transports: this device's backends; route[r] indexes the one that reaches rank r. The
  // device owns the transports.
  DeviceImpl(RuntimeImpl& runtime, int index, const Config& config,
             std::vector<std::unique_ptr<net::Transport>> transports, const std::vector<int>& route);
  ~DeviceImpl();
  DeviceImpl(const DeviceImpl&) = delete;
  DeviceImpl& operator=(const DeviceImpl&) = delete;

  std::size_t transport_count() const noexcept { return links_.size(); }
  net::Transport& transport(std::size_t i) noexcept { return *links_[i].transport; }
  // Posts the receive buffers, once every transport is connected.
  void start();

  Status post_am(const AmArgs& a);
  Status post_am_iovec(const AmIovecArgs& a);
  Status post_send(const SendArgs& a);
  Status post_recv(const RecvArgs& a);
  Status post_put(const PutArgs& a);
  Status post_get(const GetArgs& a);
  bool progress();
  MemoryRegion register_memory(void* data, std::size_t size);

  // The argument checks of a post (A: AmArgs, AmIovecArgs, SendArgs, RecvArgs, PutArgs or
  // GetArgs), without performing it: a lock model that defers a post checks it first. Throws
  // ferry::Error like the post would.
  template <class A>
  void validate(const A& args) const;

  int index() const noexcept { return index_; }
  // Fragmented messages count as eager: sent at once, in order, never a rendezvous.
  std::size_t eager_limit() const noexcept { return std::max(eager_limit_, fragment_limit_); }
  std::size_t iovec_eager_limit(std::size_t parts) const noexcept;
  Link& link(int rank) noexcept { return *route_[static_cast<std::size_t>(rank)]; }
  // The largest message the transport that reaches `rank` copies at once (0 for a bad rank).
  std::size_t inject_size(int rank) const noexcept {
    return rank >= 0 && static_cast<std::size_t>(rank) < route_.size() ? route_[static_cast<std::size_t>(rank)]->caps->inject_size : 0;
  }
  // "shm", "ofi/tcp;ofi_rxm", or "shm+ofi/tcp;ofi_rxm" when the device uses two transports.
  std::string transport_names() const;

  // Teardown: this device's own operations not yet complete (open rendezvous and RMA records,
  // sends awaiting their completion, deferred steps, backlog tails); exact when quiescent.
  std::size_t in_flight() const noexcept;
  void mark_finalized() noexcept { finalized_.store(true, std::memory_order_relaxed); }

  // Used by the protocol records (device.cpp).
  void defer(std::function<bool()> step);
  bool take_credit() noexcept;
  void return_credit() noexcept;
  PacketPool& pool() noexcept { return *pool_; }
  RuntimeImpl& runtime() noexcept { return runtime_; }
  std::atomic<std::size_t>& open_ops() noexcept { return open_ops_; }

  // Sends a Runtime::barrier step to `rank`; false when it must be retried.
  bool post_barrier_step(int rank, std::uint32_t step);
  // Sends p's first `length` payload bytes to `rank`; consumes the packet on every path.
  Status send_packet(Packet* p, int rank, std::size_t length);

 private:
  // The checks of each post, inline on its fast path (validate runs the same ones). The
  // iovec check returns the zero-copy parts' total, the put check the notification data.
  void check(const AmArgs& a) const;
  std::size_t check(const AmIovecArgs& a) const;
  void check(const SendArgs& a) const;
  void check(const RecvArgs& a) const;
  std::uint64_t check(const PutArgs& a) const;
  void check(const GetArgs& a) const;
  void check_alive(const char* call) const;
  void check_rank(const char* call, int rank) const;
  void check_target(const char* call, std::uint16_t id) const;
  std::uint64_t notify_data(const PutArgs& a) const;
  void check_iovec_fits(const AmIovecArgs& a) const;
  Status inject_small(Link& l, MsgKind kind, std::uint16_t target, Tag tag, int rank, const void* buffer, std::size_t size);
  Status post_fragments(Link& link, MsgKind kind, std::uint16_t target, Tag tag, int rank, const void* buffer,
                        std::size_t size);
  // Sends what it can of the backlog; true when the backlog is empty.
  bool flush_backlog();
  // A post's first step: false (answer retry) while earlier fragments wait in the backlog.
  bool backlog_clear() { return backlog_count_.load(std::memory_order_acquire) == 0 || flush_backlog(); }
  void on_fragment(Packet* p, std::size_t length);
  // A whole message in its packet (received in one piece or reassembled): arrived.length is set.
  void on_packet(Packet* p);
  // A message reassembled past a packet's size: p holds its header (kind am or msg), `heap`
  // its `size` payload bytes.
  void on_heap_message(Packet* p, unsigned char* heap, std::size_t size);
  void match_message(Packet* p, MsgKind kind);
  Status post_rendezvous(OpKind op, int rank, Tag tag, std::uint16_t target, const void* buffer,
                         std::size_t size, CompletionObject* local, void* context);
  // The one dispatch of every event a transport reports, success and error alike.
  void on_event(Link& link, const net::Event& e);
  void on_recv(Link& link, Packet* p, std::size_t length);
  void on_notification(const net::Event& e);
  // `recv`: what a receive wants, from post_recv directly or from its queued descriptor.
  void deliver_message(const RecvDescriptor& recv, Packet* message);
  // An eager message packet's payload (after its header, or its heap block) and its release.
  static const unsigned char* message_payload(Packet* m) noexcept;
  static std::size_t message_size(const Packet* m) noexcept;
  void release_message(Packet* m) noexcept;
  void start_rendezvous_recv(Packet* rts, const RecvDescriptor* recv);
  void repost(Link& link);
  void run_deferred();

  RuntimeImpl& runtime_;
  const int index_;
  const Config& config_;
  std::unique_ptr<PacketPool> pool_;
  // Descriptors of receives that wait for their message: a pool of their own, so posting a
  // receive never competes with the packets that carry (and hold) arriving messages.
  std::unique_ptr<PacketPool> recv_descriptors_;
  std::vector<std::unique_ptr<net::Transport>> transports_;
  std::vector<Link> links_;    // one per transport; fixed after construction
  std::vector<Link*> route_;   // by rank
  std::size_t eager_limit_;
  std::size_t credits_max_;
  // The largest fragmented message over any link (0 when no link fragments): eager_limit().
  std::size_t fragment_limit_ = 0;

  SpinLock poll_lock_;
  MatchingEngine matching_;
  // Messages being reassembled, owned by the poll lock holder. Few at a time (one per sending
  // thread that is mid-message), so a linear search; capacity reserved up front.
  struct Partial {
    std::int32_t src;
    std::uint32_t id;
    Packet* packet;       // holds the message: WireHeader (its own kind), then the payload
    unsigned char* heap;  // the payload instead, when the message is larger than a packet
    std::uint32_t received;
  };
  std::vector<Partial> partials_;

  // Free send credits. Relaxed: a credit is a count, it guards no other memory.
  alignas(cache_line) std::atomic<std::int64_t> credits_;
  // Rendezvous and RMA records not yet finished (teardown waits for zero). Relaxed: a count.
  std::atomic<std::size_t> open_ops_{0};
  std::atomic<bool> finalized_{false};
  // Fragmented messages: ids, and the tails the provider refused (a FIFO of packets in their
  // `backlog` view, linked by Packet::next under backlog_lock_: flushers only try it, a post
  // that queues a tail holds it for three stores). backlog_count_ is the fast check on every post. It changes only under
  // backlog_lock_, so whenever the lock is free it equals the number of queued tails, and the
  // thread that queued a tail reads nonzero until that tail has gone. Release on the
  // decrement after a tail's last piece and acquire in the check put that piece before any
  // message the checking thread sends.
  std::atomic<std::uint32_t> next_fragment_id_{0};
  SpinLock backlog_lock_;
  Packet* backlog_head_ = nullptr;
  Packet* backlog_tail_ = nullptr;
  std::atomic<std::size_t> backlog_count_{0};

  std::mutex deferred_mutex_;  // large-message path only; progress takes it with try_lock
  std::vector<std::function<bool()>> deferred_;
  std::atomic<std::size_t> deferred_count_{0};
};
// credits_ (taken and returned by every sending thread) starts a line of its own.
static_assert(alignof(DeviceImpl) == cache_line);

}  // namespace ferry::detail
