// device_context.hpp — what every protocol of a device shares, and nothing more.
//
// A device (device.hpp) is its transports plus four protocols, each in a file of its own that
// owns its state: eager sends (protocols/eager), fragments and their backlog
// (protocols/fragments), rendezvous (protocols/rendezvous) and RMA (protocols/rma). The
// protocols depend on this context, never on each other or on the device: it holds the packet
// pool, the links and the route to each rank, the send credits, the count of open operations,
// the deferred list, and the one way to put a control packet on the wire. Of the runtime it
// holds only the owners it uses (DeviceParts): the target table, the failures, the barrier.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/cache_line.hpp"
#include "core/barrier.hpp"
#include "core/config.hpp"
#include "core/failure_detector.hpp"
#include "core/packet_pool.hpp"
#include "core/target_table.hpp"
#include "core/wire.hpp"
#include "ferry/completion.hpp"
#include "ferry/status.hpp"
#include "net/transport.hpp"

namespace ferry::detail {

// What a device uses of the runtime's owners, handed over at construction; each outlives the
// device. The device reads the target table and the failure count on its fast paths directly,
// never through the runtime.
struct DeviceParts {
  int rank;
  int size;
  TargetTable& targets;    // remote targets: delivery of active messages and notifications
  PeerFailures& failures;  // failed peers: recorded, checked, acted on by progress
  Barrier& barrier;        // barrier steps that arrive
  const std::vector<std::uint32_t>& host_of;  // by rank, the lowest rank on its host
};

inline constexpr std::size_t kHeader = sizeof(WireHeader);
inline constexpr std::size_t kFragmentHeader = kHeader + sizeof(FragBody);
// Without a gathering transport a fragment is built on the stack: at most this many bytes,
// whatever the inject size. A transport that gathers takes fragments as large as it injects.
inline constexpr std::size_t kMaxFragmentFrame = 4096;
// Events one poll of a transport returns at most; also the spare packets a device holds for
// messages its lent transports hand over (Receives::lent).
inline constexpr int kPollBatch = 16;

// The device's record of one transport.
struct Link {
  net::Transport* transport;
  std::size_t inject_size;  // caps->inject_size, kept here: the small path reads it on every post
  std::size_t gather_size;  // inject_size where the transport gathers (Caps::gather_inject), else 0
  const net::Caps* caps;
  net::Registration* pool_registration;  // the packet slab
  void* pool_desc;                       // its desc() under local_registration, else null
  std::size_t fragment_payload;          // payload bytes per fragment; 0 when not fragmenting
  std::size_t fragment_limit;            // messages past the inject size and up to this are fragmented
  std::size_t posted_recvs;              // owned by the poll lock holder; 0 where the transport lends
  // The largest frame that goes whole, in one inject and one receive packet:
  // min(inject_size, FERRY_PACKET_SIZE).
  std::size_t whole_frame = 0;
  // The transport lends its messages (Caps::receives): the device posts it no receives and
  // copies each message into a spare packet instead.
  bool lends = false;
  // The transport connects on first use (Transport::connect_on_demand): the device notes who
  // sent on it (DeviceImpl::note_sender), as it has no endpoint to them of its own.
  bool on_demand = false;
  // Whether a message of `size` payload bytes goes as fragments over this link: it is within
  // the fragment limit and does not go whole.
  bool fragmented(std::size_t size) const noexcept {
    return size <= fragment_limit && kHeader + size > whole_frame;
  }
};

// One RMA transfer of at most max_rma_size bytes (a rendezvous read or a chunk of a put/get).
struct Chunk {
  OpContext ctx;  // first: the transport's context
  void* owner;    // the operation record the chunk belongs to
  unsigned char* local;
  void* desc;  // the registration desc() of `local` under local_registration, or null
  std::size_t size;
  std::uint64_t remote_addr;
  std::uint64_t key;
  bool push;  // read by asking the target to write (Transport::get_pushed); false from add_chunks
};
static_assert(offsetof(Chunk, ctx) == 0);

// Splits [local, local+size) at (addr, key) into chunks of at most `max` bytes.
void add_chunks(std::vector<Chunk>& out, void* owner, CtxKind kind, unsigned char* local, void* desc,
                std::size_t size, std::uint64_t addr, std::uint64_t key, std::size_t max);

inline void signal_local(CompletionObject* local, Completion&& c) noexcept {
  if (local != nullptr) local->signal(std::move(c));
}

// Deregisters a temporary registration; null is fine.
inline void release_registration(net::Transport* t, net::Registration* r) noexcept {
  if (r != nullptr) t->deregister(r);
}

inline Packet* fill_header(Packet* p, MsgKind kind, std::uint16_t target, int src, Tag tag, std::uint32_t aux = 0) {
  encode(p->data(), WireHeader{kind, 0, target, src, tag, aux});
  return p;
}

[[noreturn]] void throw_transport(const Link& link, const char* call, int rc, int rank);

// Whether a transport's error on a post or an operation to a peer means the peer is gone
// (its connection reset or refused, its process ended) rather than a fault of the call.
// -ECANCELED counts: ferry cancels only its posted receives (at teardown), never an operation
// to a peer, so a provider that cancels one (rxm when a connection breaks) lost the peer.
bool peer_gone_error(int rc) noexcept;

class alignas(cache_line) DeviceContext {
 public:
  DeviceContext(const DeviceParts& parts, int index, const Config& config,
                std::vector<std::unique_ptr<net::Transport>> transports, const std::vector<int>& route);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  TargetTable& targets() noexcept { return targets_; }
  PeerFailures& failures() noexcept { return failures_; }
  int index() const noexcept { return index_; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const Config& config() const noexcept { return config_; }
  PacketPool& pool() noexcept { return *pool_; }
  // The link that reaches `rank` (a checked rank: callers validate it first).
  Link& link(int rank) noexcept { return *route_[static_cast<std::size_t>(rank)]; }
  std::size_t link_count() const noexcept { return links_.size(); }
  // Payload bytes that go in one packet (smaller with FERRY_RDV_THRESHOLD or a small transport).
  std::size_t packet_eager_limit() const noexcept { return eager_limit_; }
  // The largest fragmented message over any link (0 when no link fragments): what a receiver
  // may have to reassemble.
  std::size_t fragment_limit() const noexcept { return fragment_limit_; }
  // The largest message that goes eagerly (in one packet or as fragments) to every rank.
  std::size_t eager_everywhere() const noexcept { return eager_everywhere_; }

  bool take_credit() noexcept;
  void return_credit() noexcept;
  // Rendezvous and RMA records not yet finished (teardown waits for zero).
  void open_op() noexcept { open_ops_.fetch_add(1, std::memory_order_relaxed); }
  void close_op() noexcept { open_ops_.fetch_sub(1, std::memory_order_relaxed); }
  // A step of a large-message operation for progress to run; it returns false to be run again.
  void defer(std::function<bool()> step);
  // Sends p's first `length` payload bytes to `rank`; consumes the packet on every path. To a
  // failed rank the packet is dropped and the result is failed.
  Status send_packet(Packet* p, int rank, std::size_t length);
  // Whether `rank` has failed (PeerFailures::failed; relaxed, see there).
  bool peer_down(int rank) const noexcept {
    return failed_[static_cast<std::size_t>(rank)].load(std::memory_order_relaxed) != 0;
  }
  // Records that `rank` failed (PeerFailures::peer_failed), `how` saying what showed it.
  void record_peer_failed(int rank, const std::string& how) noexcept;
  // A post's transport error other than -EAGAIN: a peer-gone error (or any error to a rank
  // already known failed) records the failure and answers failed; any other throws.
  Status transport_error(const Link& link, const char* call, int rc, int rank);
  // A remote-target completion (an active message or a notification) for the target table.
  void deliver(std::uint16_t target, Completion&& c) noexcept;
  // Keeps the chunks of an operation a transport abandoned (Event::abandoned) until the device
  // goes: the backend may still hold their contexts, so their memory is never reused. With
  // them go the ferry-owned destinations of its reads (receive blocks, zero-copy chunks): a
  // peer cut off, not dead, may still have its data in this rank's socket, and the backend
  // writes it wherever the read pointed whenever its progress reaches it.
  void bury(std::vector<Chunk>&& chunks, std::vector<Buffer>&& destinations = {});
  // A message from the wire dropped as malformed (the caller logs it with the sender's rank).
  // Relaxed: a statistic, read by Device::stats() with no order to other data.
  void count_malformed() noexcept { malformed_.fetch_add(1, std::memory_order_relaxed); }
  std::uint64_t malformed() const noexcept { return malformed_.load(std::memory_order_relaxed); }

 protected:
  // Decides which links fragment and the eager limits, from the transports' caps: at
  // construction, and again once they are connected (a transport may learn then that a peer
  // cannot be read in one copy).
  void plan_fragments();
  // Runs the deferred steps (progress, under the poll lock).
  void run_deferred();
  // Puts running_'s waiting steps back in front of any deferred meanwhile.
  void requeue_running();
  // Teardown: operations of the context not yet complete (open records, sends awaiting their
  // completion, deferred steps).
  std::size_t context_in_flight() const noexcept;

  TargetTable& targets_;
  PeerFailures& failures_;
  Barrier& barrier_;
  const std::atomic<std::uint8_t>* failed_;  // failures_'s table, by rank
  const int index_;
  const int rank_;
  const int size_;
  const Config& config_;
  std::unique_ptr<PacketPool> pool_;
  std::vector<std::unique_ptr<net::Transport>> transports_;
  std::vector<Link> links_;   // one per transport; fixed after construction
  std::vector<Link*> route_;  // by rank
  std::size_t eager_limit_ = 0;
  std::size_t fragment_limit_ = 0;
  std::size_t eager_everywhere_ = 0;
  std::size_t credits_max_ = 0;

 private:
  // Free send credits. Relaxed: a credit is a count, it guards no other memory.
  alignas(cache_line) std::atomic<std::int64_t> credits_{0};
  // Relaxed: a count.
  std::atomic<std::size_t> open_ops_{0};
  std::atomic<std::uint64_t> malformed_{0};
  std::mutex deferred_mutex_;  // large-message path only; progress takes it with try_lock
  std::vector<std::function<bool()>> deferred_;
  std::vector<std::function<bool()>> running_;  // run_deferred's batch (under the poll lock)
  std::atomic<std::size_t> deferred_count_{0};
  std::mutex graveyard_mutex_;  // peer-failure path only
  std::vector<std::vector<Chunk>> graveyard_;
  std::vector<std::vector<Buffer>> buried_buffers_;
};

}  // namespace ferry::detail
