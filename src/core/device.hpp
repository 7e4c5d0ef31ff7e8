// device.hpp — one device: an endpoint, its completion queue, packets, and the protocols.
//
// Code paths and their rules
//  - small-message path (post_am / post_send up to eager_limit(), and progress delivering
//    them): a packet from the pool (thread cache), one memcpy, fi_inject or fi_send; on the
//    receiver one fi_cq_read, a push into the target completion queue, one fi_recv repost.
//    No allocation, no blocking lock, no system call but the provider's.
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
#include "net/fabric.hpp"

struct fi_cq_data_entry;
struct fi_cq_err_entry;

namespace ferry::detail {

class RuntimeImpl;
struct SendOp;
struct RecvOp;
struct RmaOp;

struct RegionImpl {
  class DeviceImpl* device = nullptr;
  void* data = nullptr;
  std::size_t size = 0;
  fid_mr* mr = nullptr;
  ~RegionImpl();
};

class DeviceImpl {
 public:
  DeviceImpl(RuntimeImpl& runtime, int index, net::Fabric& fabric, const Config& config);
  ~DeviceImpl();
  DeviceImpl(const DeviceImpl&) = delete;
  DeviceImpl& operator=(const DeviceImpl&) = delete;

  std::string address() const { return endpoint_.address(); }
  // Inserts peers' addresses and posts the receive buffers.
  void connect(const std::vector<std::string>& addresses);

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
  const net::Caps& caps() const noexcept { return caps_; }
  net::Endpoint& endpoint() noexcept { return endpoint_; }

  // Teardown: this device's own operations not yet complete (open rendezvous and RMA records,
  // sends awaiting their completion, deferred steps, backlog tails); exact when quiescent.
  std::size_t in_flight() const noexcept;
  void mark_finalized() noexcept { finalized_.store(true, std::memory_order_relaxed); }

  // Used by the protocol records (device.cpp).
  void defer(std::function<bool()> step);
  bool take_credit() noexcept;
  void return_credit() noexcept;
  void* pool_desc() const noexcept { return pool_desc_; }
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
  Status inject_small(MsgKind kind, std::uint16_t target, Tag tag, int rank, const void* buffer, std::size_t size);
  // Whether a message of `size` payload bytes goes as fragments (never when fragment_limit_ is 0).
  bool fragmented(std::size_t size) const noexcept { return size <= fragment_limit_ && sizeof(WireHeader) + size > caps_.inject_size; }
  Status post_fragments(MsgKind kind, std::uint16_t target, Tag tag, int rank, const void* buffer, std::size_t size);
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
  void on_recv(Packet* p, const fi_cq_data_entry& e, std::uint64_t src);
  void on_notification(const fi_cq_data_entry& e, std::uint64_t src);
  void on_error(const fi_cq_err_entry& e);
  // `recv`: what a receive wants, from post_recv directly or from its queued descriptor.
  void deliver_message(const RecvDescriptor& recv, Packet* message);
  // An eager message packet's payload (after its header, or its heap block) and its release.
  static const unsigned char* message_payload(Packet* m) noexcept;
  static std::size_t message_size(const Packet* m) noexcept;
  void release_message(Packet* m) noexcept;
  void start_rendezvous_recv(Packet* rts, const RecvDescriptor* recv);
  void repost();
  void run_deferred();

  RuntimeImpl& runtime_;
  const int index_;
  const net::Caps& caps_;
  const Config& config_;
  std::unique_ptr<PacketPool> pool_;
  // Descriptors of receives that wait for their message: a pool of their own, so posting a
  // receive never competes with the packets that carry (and hold) arriving messages.
  std::unique_ptr<PacketPool> recv_descriptors_;
  net::Endpoint endpoint_;
  fid_mr* pool_mr_ = nullptr;
  void* pool_desc_ = nullptr;
  std::size_t eager_limit_;
  std::size_t credits_max_;
  // Payload bytes per fragment; 0 when messages are not fragmented (FERRY_FRAGMENT).
  std::size_t fragment_payload_ = 0;
  // Messages past the inject size and up to this go as fragments; 0 when fragmenting is off.
  std::size_t fragment_limit_ = 0;

  SpinLock poll_lock_;
  std::size_t posted_recvs_ = 0;  // owned by the poll lock holder
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
