// device.hpp — one device: its transports, packets, the protocols, and the receive path.
//
// A device reaches each peer through one transport (net/transport.hpp): shared memory for
// ranks on its host, a network backend for the others, or one backend for all. The shared
// state (packet pool, links, route, credits, deferred steps) is the DeviceContext; the
// protocols own theirs (protocols/: eager, fragments, rendezvous, rma). The device itself
// checks every post's arguments, picks the protocol, runs the receive path (matching, arrived
// messages) and dispatches every transport event, success and error alike, in one place.
// Its definitions: device.cpp (construction, start, teardown), device_posts.cpp (the posts,
// their checks, memory registration), device_receive.cpp (progress and the receive path),
// device_failure.cpp (a peer's failure).
//
// Code paths and their rules
//  - small-message path (post_am / post_send up to eager_limit(), and progress delivering
//    them): a packet from the pool (thread cache), one memcpy, the transport's inject or
//    send; on the receiver one poll, a push into the target completion queue, one receive
//    repost. No allocation, no blocking lock, no system call but the transport's.
//  - medium path: fragments (protocols/fragments.hpp).
//  - rendezvous and multi-chunk RMA: may allocate an operation record and register memory;
//    transport calls for them are issued by progress from the deferred list.
//  - setup/teardown: anything goes.
// Progress runs under a try-lock: one thread polls a device at a time and others return at
// once. Everything only progress touches (posted receive counts, reassembly, the deferred
// list drain) is owned by the lock holder.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/spinlock.hpp"
#include "core/config.hpp"
#include "core/device_context.hpp"
#include "core/extension.hpp"
#include "core/matching.hpp"
#include "core/packet_pool.hpp"
#include "core/protocols/eager.hpp"
#include "core/protocols/fragments.hpp"
#include "core/protocols/rendezvous.hpp"
#include "core/protocols/atomics.hpp"
#include "core/shared_memory.hpp"
#include "core/protocols/rma.hpp"
#include "core/recv_blocks.hpp"
#include "core/wire.hpp"
#include "ferry/runtime.hpp"
#include "net/transport.hpp"

namespace ferry::detail {

struct RegionImpl {
  class DeviceImpl* device = nullptr;
  void* data = nullptr;
  std::size_t size = 0;
  std::uint64_t key = 0;  // the key peers name it by (the network transport's; shared memory needs none)
  std::vector<std::pair<net::Transport*, net::Registration*>> registrations;  // one per transport
  SharedBlock block;  // allocate_memory's memory (else empty), freed after the deregistrations
  ~RegionImpl();
};

class DeviceImpl : public DeviceContext {
 public:
  // transports: this device's backends; route[r] indexes the one that reaches rank r. The
  // device owns the transports.
  DeviceImpl(const DeviceParts& parts, int index, const Config& config,
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
  Status post_atomic(const AtomicArgs& a);
  bool progress();
  MemoryRegion register_memory(void* data, std::size_t size);
  MemoryRegion allocate_memory(std::size_t size);
  // ~RegionImpl: the region leaves the set atomics may touch before it is deregistered.
  void forget_region(const RegionImpl& r) noexcept { regions_.remove(r.data, r.size, r.key); }

  // The argument checks of a post (A: AmArgs, AmIovecArgs, SendArgs, RecvArgs, PutArgs,
  // GetArgs or AtomicArgs), without performing it: a lock model that defers a post checks it first. Throws
  // ferry::Error like the post would.
  template <class A>
  void validate(const A& args) const;

  // Fragmented messages count as eager: sent at once, in order, never a rendezvous.
  // On a device with several transports, the smallest of their eager limits.
  std::size_t eager_limit() const noexcept { return eager_everywhere(); }
  std::size_t iovec_eager_limit(std::size_t parts) const noexcept;
  // The largest message the transport that reaches `rank` copies at once (0 for a bad rank).
  std::size_t inject_size(int rank) const noexcept {
    return rank >= 0 && static_cast<std::size_t>(rank) < route_.size() ? route_[static_cast<std::size_t>(rank)]->inject_size : 0;
  }
  // "shm", "ofi/tcp;ofi_rxm", or "shm+ofi/tcp;ofi_rxm" when the device uses two transports.
  std::string transport_names() const;
  // How this device reaches `rank` (Transport::describe_peer of its route).
  std::string describe_peer(int rank) const;

  // Teardown: this device's own operations not yet complete (open rendezvous and RMA records,
  // sends awaiting their completion, deferred steps, backlog tails); exact when quiescent.
  std::size_t in_flight() const noexcept;
  std::uint64_t delivered_inline() const noexcept { return inline_count_.load(std::memory_order_relaxed); }
  DeviceFootprint footprint() const noexcept;
  // Device::trim_memory: the free packets' payload pages back to the system, unless one of the
  // device's transports pins its registrations (the pool's slab is registered with each).
  std::size_t trim_memory();
  // Start-up: the peers given an address on this device's transports that connected them all,
  // and those that connect on first use (their own count).
  void set_peers_connected(std::size_t n) noexcept { peers_connected_ = n; }
  void add_connecting_on_demand(std::size_t transport);
  // Whether `rank` may hold a connection to this device: it is reached eagerly, or this device
  // connected it, or it sent here. Finalize's departure goes to such ranks only.
  bool in_touch(int rank) const noexcept;
  // Whether the calling thread is inside this device's progress (a Handler's callback, say,
  // or a call nested in one): what only this progress call can take in cannot arrive while
  // the caller waits for it there.
  bool progressing_here() const noexcept;
  void mark_finalized() noexcept { finalized_.store(true, std::memory_order_relaxed); }

  // Peer failure, acted on by progress (under the poll lock) once the runtime's failure count
  // moves: every operation pending to or from a newly failed rank completes with
  // peer_failed_error. Ordering with posts racing it: the runtime's flag is set before the
  // count moves; a post that queues something (a receive, a rendezvous send) does so under a
  // lock this sweep also takes, and reads the flag after it, failing its own operation if set.
  void fail_peer(int rank);

  // Sends a Runtime::barrier step to `rank`; false when it must be retried.
  bool post_barrier_step(int rank, std::uint32_t step);

  // The device's extension, made by `make` on the first call (any thread; later calls return
  // the first one's). Acquire, paired with the release that installs it.
  DeviceExtension& extension(const std::function<std::unique_ptr<DeviceExtension>()>& make) {
    if (DeviceExtension* e = extension_.load(std::memory_order_acquire)) return *e;
    std::lock_guard<std::mutex> guard(extension_mutex_);
    if (extension_owner_ == nullptr) {
      extension_owner_ = make();
      extension_.store(extension_owner_.get(), std::memory_order_release);
    }
    return *extension_owner_;
  }

 private:
  // The checks of each post, inline on its fast path (validate runs the same ones). The
  // iovec check returns the zero-copy parts' total, the put check the notification data.
  void check(const AmArgs& a) const;
  std::size_t check(const AmIovecArgs& a) const;
  void check(const SendArgs& a) const;
  void check(const RecvArgs& a) const;
  std::uint64_t check(const PutArgs& a) const;
  void check(const GetArgs& a) const;
  void check(const AtomicArgs& a) const;
  // register_memory's and allocate_memory's registration of r's memory with every transport.
  MemoryRegion register_region(std::unique_ptr<RegionImpl> r);
  void check_alive(const char* call) const;
  void check_rank(const char* call, int rank) const;
  void check_target(const char* call, std::uint16_t id) const;
  std::uint64_t notify_data(const PutArgs& a) const;
  void check_iovec_fits(const AmIovecArgs& a) const;
  // A whole message in its packet (received in one piece or reassembled): arrived.length is set.
  void on_packet(Packet* p);
  // An active message in p: staged for its target (on_am), or for one not exposed (yet).
  void on_am(Packet* p, const WireHeader& h);
  void deliver_unexposed(Packet* p, const WireHeader& h);
  // An arrived active message's completion, its payload in p (or copied out of it).
  void fill_am(Completion& c, Packet* p, const WireHeader& h);
  // A message reassembled past a packet's size: p holds its header (kind am or msg), `heap`
  // its `size` payload bytes.
  void on_heap_message(Packet* p, unsigned char* heap, std::size_t size);
  void match_message(Packet* p, MsgKind kind);
  // The one dispatch of every event a transport reports, success and error alike.
  void on_event(Link& link, const net::Event& e);
  // `payload`: a fragment's payload bytes, in p or in the transport's memory (on_lent).
  template <bool kFits = false>
  void on_recv(Link& link, Packet* p, std::size_t length, const unsigned char* payload);
  // Logs, counts and returns to the pool a packet that fails its checks.
  [[gnu::cold, gnu::noinline]] void drop_malformed(Packet* p, std::size_t length) noexcept;
  // A message lent by its transport (Event::lent): copied into a spare packet, then on_recv.
  void on_lent(Link& link, std::size_t length, const unsigned char* lent);
  // on_lent's copy into a spare packet, before on_recv (on_inline's fast path comes between).
  Packet* lent_packet(Link& link, std::size_t length, const unsigned char* lent, const unsigned char*& payload);
  // Refills spare_ from the pool (as far as it has packets); returns how many it holds.
  int top_up_spares() noexcept;
  // Transport::set_inline_sink's sink: `device` is this, `link` one of links_.
  static void on_inline(void* device, void* link, const net::Event& e) noexcept;
  // Inside on_inline's handler of a second exception in one poll: logs it (only the first is rethrown).
  void log_dropped_inline_error() noexcept;
  // on_inline's fast path for an active message to a target that does not batch (a Handler).
  bool signal_inline(Link& link, Packet* p, std::size_t length, bool lent);
  // `recv`: what a receive wants, from post_recv directly or from its queued descriptor.
  void deliver_message(const RecvDescriptor& recv, Packet* message);
  // An eager message packet's payload (after its header, or its heap block) and its release.
  // Here, inline: post_recv and deliver_message, in two files, both use them.
  static const unsigned char* message_payload(Packet* m) noexcept {
    return m->arrived.heap != nullptr ? m->arrived.heap : m->data() + kHeader;
  }
  static std::size_t message_size(const Packet* m) noexcept {
    return m->arrived.heap != nullptr ? m->arrived.heap_size : m->arrived.length - kHeader;
  }
  void release_message(Packet* m) noexcept {
    if (m->arrived.heap != nullptr) recv_blocks::give(m->arrived.heap);
    pool_->put(m);
  }
  // Keeps FERRY_PREPOST receives posted on a transport that takes posted receives.
  void repost(Link& link);
  // Signals the staged active messages (below) to their target, and empties the stage.
  void flush_staged() noexcept {
    if (staged_count_ != 0) flush_staged_slow();
  }
  void flush_staged_slow() noexcept;
  // The slow path of progress: the peer check, every 1024 calls, and failures not yet acted on;
  // then the extension's.
  void check_failures();
  std::mutex extension_mutex_;
  std::unique_ptr<DeviceExtension> extension_owner_;       // under extension_mutex_
  std::atomic<DeviceExtension*> extension_{nullptr};
  // Signals each receive taken off the matching engine for failed `rank` with the failure.
  void fail_recvs(int rank);

  // Descriptors of receives that wait for their message: a pool of their own, so posting a
  // receive never competes with the packets that carry (and hold) arriving messages.
  std::unique_ptr<PacketPool> recv_descriptors_;
  SpinLock poll_lock_;
  MatchingEngine matching_;
  Fragments fragments_;
  Rendezvous rendezvous_;
  Rma rma_;
  // Every region registered on this device, for the owner's check of an atomic's request.
  RegionSet regions_;
  Atomics atomics_;
  // The allocated regions of peers on this host this device mapped (their atomics' direct path).
  PeerMappings mappings_;
  const std::vector<std::uint32_t>& host_of_;  // the runtime's: by rank, the lowest rank on its host
  std::atomic<bool> finalized_{false};
  // Owned by the poll lock holder.
  std::uint32_t progress_calls_ = 0;
  // FERRY_TRIM_IDLE_MS, from the slow path of progress (one poller at a time): the pool's list
  // version last seen, since when (steady clock, ns), and the version the last trim left.
  void trim_if_idle() noexcept;
  std::uint32_t trim_seen_version_ = 0;
  std::int64_t trim_seen_ns_ = 0;
  std::uint64_t trim_left_version_ = ~std::uint64_t{0};
  // Statistics for footprint(): relaxed, they order nothing.
  std::atomic<std::size_t> trims_{0};
  std::atomic<std::size_t> trimmed_bytes_{0};
  bool delivered_inline_ = false;      // this progress call's polls handed a message to on_inline
  // Messages on_inline took, for DeviceStats: only the poll lock holder writes (a load and a
  // store, no read-modify-write); relaxed, it orders nothing.
  std::atomic<std::uint64_t> inline_count_{0};
  std::exception_ptr inline_error_;    // thrown inside on_inline, rethrown by progress
  std::uint32_t failures_seen_ = 0;    // the runtime's failure count last acted on
  std::size_t peers_connected_ = 0;    // set at start-up, read by footprint()
  std::vector<const net::Transport*> on_demand_;  // likewise
  // By rank, where a link connects on first use: a message came from it (note_sender). Written
  // by the poll lock holder, read by in_touch at finalize; relaxed: a flag ordering nothing.
  std::unique_ptr<std::atomic<std::uint8_t>[]> heard_;
  void note_sender(const Link& l, int src) noexcept {
    if (!l.on_demand) return;
    std::atomic<std::uint8_t>& h = heard_[static_cast<std::size_t>(src)];
    if (h.load(std::memory_order_relaxed) == 0) h.store(1, std::memory_order_relaxed);
  }
  // Packets for the messages lent transports hand over (Link::lends): a lent message is
  // copied into one during its delivery. Each poll of such a transport lends at most
  // spare_count_ messages, so the device never takes a message it has no packet for; refilled
  // before each such poll, up to min(FERRY_PREPOST, kPollBatch).
  std::array<Packet*, kPollBatch> spare_{};
  int spare_count_ = 0;
  int spare_target_ = 0;
  std::vector<std::uint8_t> handled_;  // by rank: fail_peer ran
  // The active messages this progress call received for one target, in arrival order, not yet
  // signalled: they go to the target in one signal_batch (one claim of a CompletionQueue's
  // ring for the run, not one per message) when a message for another target comes, when the
  // stage is full, before the device signals anything else, and at the end of each link's
  // events. So the order of everything this thread signals is unchanged, and nothing stays
  // staged once progress returns. Owned by the poll lock holder; empty outside progress.
  static constexpr std::uint32_t kStageMax = 16;
  CompletionObject* staged_target_ = nullptr;
  std::uint32_t staged_count_ = 0;
  std::array<Completion, kStageMax> staged_;
};
// The context's credits (taken and returned by every sending thread) start a line of their own.
static_assert(alignof(DeviceImpl) == cache_line);

}  // namespace ferry::detail
