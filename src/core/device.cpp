#include "core/device.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "common/log.hpp"
#include "core/recv_blocks.hpp"
#include "core/runtime_impl.hpp"
#include "core/wire.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {

namespace {

constexpr std::size_t kHeader = sizeof(WireHeader);
constexpr std::size_t kMaxSize = std::size_t{1} << 62;  // beyond this, size arithmetic is suspect
constexpr int kPollBatch = 16;
}  // namespace
// Messages up to this size (header included) that the provider can inject are built on the
// stack instead of in a packet.
constexpr std::size_t kStackInject = 256;
// A fragment is built on the stack: at most this many bytes, whatever the inject size.
constexpr std::size_t kMaxFragmentFrame = 4096;
constexpr std::size_t kFragmentHeader = kHeader + sizeof(FragBody);
// Below this inject size fragments would be too small to beat one provider send.
constexpr std::size_t kMinFragmentInject = 1024;
namespace {

std::string str(std::size_t v) { return std::to_string(v); }

// Returns the packet behind an active-message payload handed to the caller.
void release_am_payload(void* pool, void* payload) noexcept {
  static_cast<PacketPool*>(pool)->put(Packet::from_data(static_cast<unsigned char*>(payload) - kHeader));
}

// The eager part of an iovec active message stays in its RTS packet.
void release_rts_payload(void* pool, void* payload) noexcept {
  static_cast<PacketPool*>(pool)->put(
      Packet::from_data(static_cast<unsigned char*>(payload) - kHeader - sizeof(RtsBody)));
}

void release_malloc(void*, void* data) noexcept { std::free(data); }

// The payload of `b` in heap memory, b's own memory released; b itself if memory is short.
[[gnu::cold, gnu::noinline]] Buffer copy_out(Buffer&& b) noexcept {
  void* heap = std::malloc(b.size() != 0 ? b.size() : 1);
  if (heap == nullptr) return std::move(b);
  if (b.size() != 0) std::memcpy(heap, b.data(), b.size());
  return Buffer(heap, b.size(), &release_malloc, nullptr);
}

void signal_local(CompletionObject* local, Completion&& c) noexcept {
  if (local != nullptr) local->signal(std::move(c));
}

}  // namespace

// ---- operation records of the large-message paths -------------------------------------

// The sender's side of a rendezvous: lives until the receiver's FIN. Its fields are written
// before the RTS leaves and read when the FIN comes back, possibly on another thread; the peer
// orders the two, invisibly to tools, so `ready` carries the handoff (release before the RTS,
// acquire on the FIN).
struct SendOp {
  std::atomic<bool> ready{false};
  OpKind op;
  int rank;
  Tag tag;
  std::size_t size;
  CompletionObject* local;
  void* context;
  net::Transport* transport;  // the one the RTS went over; it holds the registrations
  std::vector<net::Registration*> registrations;
};

// One RMA transfer of at most max_rma_size bytes.
struct Chunk {
  OpContext ctx;  // first: the transport's context
  void* owner;    // RecvOp* or RmaOp*
  unsigned char* local;
  void* desc;  // the registration desc() of `local` under local_registration, or null
  std::size_t size;
  std::uint64_t remote_addr;
  std::uint64_t key;
};
static_assert(offsetof(Chunk, ctx) == 0);

// The receiver's side of a rendezvous: reads every part, then delivers and sends FIN.
struct RecvOp {
  enum class Goal : std::uint8_t { user_recv, am, iovec } goal;
  DeviceImpl* device;
  int rank;
  Tag tag;
  std::uint16_t target;
  std::uint64_t send_op;
  std::size_t size;  // bytes delivered (user_recv: after truncation)
  int error = 0;
  CompletionObject* local = nullptr;  // user_recv
  void* context = nullptr;
  Buffer eager;               // iovec: the eager part
  std::vector<Buffer> parts;  // am: [0] is the whole message; iovec: each zero-copy part
  Link* link = nullptr;       // the sender's link
  std::vector<net::Registration*> registrations;  // of the destinations, under local_registration
  std::vector<Chunk> chunks;
  std::size_t issued = 0;
  std::size_t completed = 0;
};

// A put or get of more than one chunk; a notifying put writes its last chunk with data after
// all others completed, so the target never sees the notification before the data.
struct RmaOp {
  OpKind op;
  int rank;
  std::size_t size;
  CompletionObject* local;
  void* context;
  bool notify;
  std::uint64_t notify_data;
  int error = 0;
  Link* link = nullptr;
  net::Registration* registration = nullptr;  // of the local buffer, under local_registration
  std::vector<Chunk> chunks;
  std::size_t issued = 0;
  std::size_t completed = 0;
};

RegionImpl::~RegionImpl() {
  for (auto& [transport, registration] : registrations) transport->deregister(registration);
}

namespace {
// Deregisters a temporary registration; null is fine.
void release_registration(net::Transport* t, net::Registration* r) noexcept {
  if (r != nullptr) t->deregister(r);
}
}  // namespace

// ---- setup ----------------------------------------------------------------------------

DeviceImpl::DeviceImpl(RuntimeImpl& runtime, int index, const Config& config,
                       std::vector<std::unique_ptr<net::Transport>> transports, const std::vector<int>& route)
    : runtime_(runtime),
      index_(index),
      config_(config),
      pool_(std::make_unique<PacketPool>(config.packets, config.packet_size)),
      recv_descriptors_(std::make_unique<PacketPool>(config.recv_descriptors, 64)),
      transports_(std::move(transports)),
      eager_limit_(config.packet_size - kHeader),
      credits_max_(config.send_credits),
      credits_(0) {
  if (config.rdv_threshold != 0 && config.rdv_threshold < eager_limit_) eager_limit_ = config.rdv_threshold;
  std::size_t send_queue = 0;
  for (const auto& t : transports_) {
    const net::Caps& caps = t->caps();
    if (eager_limit_ > caps.max_msg_size - kHeader) eager_limit_ = caps.max_msg_size - kHeader;
    if (caps.send_queue != 0) send_queue = send_queue == 0 ? caps.send_queue : std::min(send_queue, caps.send_queue);
  }
  if (credits_max_ == 0) credits_max_ = send_queue != 0 ? send_queue : 256;
  credits_.store(static_cast<std::int64_t>(credits_max_), std::memory_order_relaxed);
  // Fragments carry messages up to FERRY_FRAGMENT_MAX (or the packet's eager limit, if larger),
  // never past an explicit rendezvous threshold; 32-bit offsets on the wire.
  std::size_t limit = std::max(eager_limit_, config.fragment_max);
  if (config.rdv_threshold != 0) limit = std::min(limit, config.rdv_threshold);
  limit = std::min<std::size_t>(limit, std::numeric_limits<std::uint32_t>::max());
  links_.reserve(transports_.size());
  for (const auto& t : transports_) {
    const net::Caps& caps = t->caps();
    Link l{t.get(), &caps, nullptr, nullptr, 0, 0, 0};
    if (config.fragment == FragmentMode::automatic && caps.inject_size >= kMinFragmentInject &&
        kHeader + limit > caps.inject_size) {
      l.fragment_payload = std::min(caps.inject_size, kMaxFragmentFrame) - kFragmentHeader;
      l.fragment_limit = limit;
      fragment_limit_ = std::max(fragment_limit_, limit);
      partials_.reserve(64);
    }
    // The packet slab is registered once per transport; the desc matters only under local_registration.
    l.pool_registration = t->register_memory(pool_->slab(), pool_->slab_bytes(), net::Access::send | net::Access::recv);
    l.pool_desc = caps.local_registration ? l.pool_registration->desc() : nullptr;
    links_.push_back(l);
  }
  route_.resize(route.size(), nullptr);
  for (std::size_t r = 0; r < route.size(); ++r) route_[r] = &links_[static_cast<std::size_t>(route[r])];
}

DeviceImpl::~DeviceImpl() {
  // Cancel what the transports still hold, then give the packets back so the pool can go.
  for (Link& l : links_) l.transport->cancel_all();
  matching_.drain([](Packet* r) { r->pool->put_shared(r); },
                  [](Packet* m) {
                    recv_blocks::give(m->arrived.heap);
                    m->pool->put_shared(m);
                  });
  for (Partial& m : partials_) recv_blocks::give(m.heap);
  for (Packet* p = backlog_head_; p != nullptr; p = p->next) {
    if (p->backlog.frame != p->data()) std::free(p->backlog.frame);
  }
  for (Link& l : links_) l.transport->deregister(l.pool_registration);
  // transports_ close in their destructors before pool_ frees the slab (declaration order).
}

void DeviceImpl::start() {
  std::lock_guard<SpinLock> guard(poll_lock_);
  for (Link& l : links_) {
    repost(l);
    if (l.posted_recvs == 0) {
      throw Error("device " + std::to_string(index_) + ": could not post any receive buffer on " + l.caps->name);
    }
  }
}

std::string DeviceImpl::transport_names() const {
  std::string out;
  for (const Link& l : links_) out += (out.empty() ? "" : "+") + l.caps->name;
  return out;
}

// ---- checks -----------------------------------------------------------------------------

namespace {
void check_remote(const char* call, int rank, int device, const RemoteKey& key, std::size_t offset, std::size_t size);
}  // namespace

// The checks are inline compares; only the throwing halves are out of line (and cold), so
// the fast path pays a few predictable branches.
namespace {

[[noreturn, gnu::cold, gnu::noinline]] void throw_transport(const Link& link, const char* call, int rc, int rank) {
  throw Error(net::error_text(call, rc) + " to rank " + std::to_string(rank) + " over " + link.caps->name);
}

[[noreturn, gnu::cold, gnu::noinline]] void throw_target(const char* call, std::uint16_t id, std::size_t max) {
  throw Error(std::string(call) + ": target=" + std::to_string(id) + " is out of range; FERRY_MAX_TARGETS=" +
              std::to_string(max));
}

[[noreturn, gnu::cold, gnu::noinline]] void throw_finalized(const char* call) {
  throw Error(std::string(call) + ": called after the runtime was finalized");
}

[[noreturn, gnu::cold, gnu::noinline]] void throw_rank(const char* call, int rank, int size) {
  throw Error(std::string(call) + ": rank=" + std::to_string(rank) + " is out of range; the job has " +
              std::to_string(size) + " ranks (0.." + std::to_string(size - 1) + ")");
}

[[noreturn, gnu::cold, gnu::noinline]] void throw_buffer(const char* call, const char* name, const void* buffer,
                                                         std::size_t size) {
  if (buffer == nullptr) throw Error(std::string(call) + ": " + name + "=null with size=" + str(size));
  throw Error(std::string(call) + ": size=" + str(size) + " is too large");
}

[[noreturn, gnu::cold, gnu::noinline]] void throw_tag(const char* call, Tag tag) {
  throw Error(std::string(call) + ": tag=" + std::to_string(tag) + " is out of range; tags are 0.." +
              std::to_string(max_tag));
}

inline void check_buffer(const char* call, const char* name, const void* buffer, std::size_t size) {
  if (__builtin_expect((buffer == nullptr && size != 0) || size > kMaxSize, 0)) throw_buffer(call, name, buffer, size);
}

inline void check_tag(const char* call, Tag tag) {
  if (__builtin_expect(tag > max_tag, 0)) throw_tag(call, tag);
}

}  // namespace

inline void DeviceImpl::check_alive(const char* call) const {
  if (__builtin_expect(finalized_.load(std::memory_order_relaxed), 0)) throw_finalized(call);
}

inline void DeviceImpl::check_rank(const char* call, int rank) const {
  if (__builtin_expect(rank < 0 || rank >= runtime_.size(), 0)) throw_rank(call, rank, runtime_.size());
}

inline void DeviceImpl::check(const AmArgs& a) const {
  check_alive("post_am");
  check_rank("post_am", a.rank);
  check_buffer("post_am", "buffer", a.buffer, a.size);
  check_tag("post_am", a.tag);
  check_target("post_am", a.target.id);
}

inline std::size_t DeviceImpl::check(const AmIovecArgs& a) const {
  check_alive("post_am_iovec");
  check_rank("post_am_iovec", a.rank);
  check_buffer("post_am_iovec", "eager.buffer", a.eager.buffer, a.eager.size);
  check_tag("post_am_iovec", a.tag);
  check_target("post_am_iovec", a.target.id);
  std::size_t total = 0;
  for (std::size_t i = 0; i < a.parts.size(); ++i) {
    check_buffer("post_am_iovec", ("parts[" + str(i) + "].buffer").c_str(), a.parts[i].buffer, a.parts[i].size);
    if (total + a.parts[i].size < total) throw Error("post_am_iovec: the parts' sizes overflow");
    total += a.parts[i].size;
  }
  check_iovec_fits(a);
  return total;
}

inline void DeviceImpl::check(const SendArgs& a) const {
  check_alive("post_send");
  check_rank("post_send", a.rank);
  check_buffer("post_send", "buffer", a.buffer, a.size);
  check_tag("post_send", a.tag);
}

inline void DeviceImpl::check(const RecvArgs& a) const {
  check_alive("post_recv");
  if (a.rank != any_source) check_rank("post_recv", a.rank);
  check_buffer("post_recv", "buffer", a.buffer, a.size);
  if (a.tag != any_tag) check_tag("post_recv", a.tag);
}

inline std::uint64_t DeviceImpl::check(const PutArgs& a) const {
  check_alive("post_put");
  check_rank("post_put", a.rank);
  check_buffer("post_put", "buffer", a.buffer, a.size);
  check_remote("post_put", a.rank, index_, a.remote, a.offset, a.size);
  return notify_data(a);
}

inline void DeviceImpl::check(const GetArgs& a) const {
  check_alive("post_get");
  check_rank("post_get", a.rank);
  check_buffer("post_get", "buffer", a.buffer, a.size);
  check_remote("post_get", a.rank, index_, a.remote, a.offset, a.size);
}

template <class A>
void DeviceImpl::validate(const A& args) const {
  (void)check(args);
}

template void DeviceImpl::validate(const AmArgs&) const;
template void DeviceImpl::validate(const AmIovecArgs&) const;
template void DeviceImpl::validate(const SendArgs&) const;
template void DeviceImpl::validate(const RecvArgs&) const;
template void DeviceImpl::validate(const PutArgs&) const;
template void DeviceImpl::validate(const GetArgs&) const;

inline void DeviceImpl::check_target(const char* call, std::uint16_t id) const {
  if (__builtin_expect(id >= runtime_.max_targets(), 0)) throw_target(call, id, runtime_.max_targets());
}

// ---- credits and the deferred list ---------------------------------------------------

bool DeviceImpl::take_credit() noexcept {
  if (credits_.fetch_sub(1, std::memory_order_relaxed) > 0) return true;
  credits_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

void DeviceImpl::return_credit() noexcept { credits_.fetch_add(1, std::memory_order_relaxed); }

void DeviceImpl::defer(std::function<bool()> step) {
  std::lock_guard<std::mutex> guard(deferred_mutex_);
  deferred_.push_back(std::move(step));
  deferred_count_.store(deferred_.size(), std::memory_order_relaxed);
}

void DeviceImpl::run_deferred() {
  // Relaxed: a stale zero only postpones the work to the next progress call.
  if (deferred_count_.load(std::memory_order_relaxed) == 0) return;
  std::vector<std::function<bool()>> work;
  {
    std::unique_lock<std::mutex> guard(deferred_mutex_, std::try_to_lock);
    if (!guard.owns_lock()) return;
    work.swap(deferred_);
    deferred_count_.store(0, std::memory_order_relaxed);
  }
  std::vector<std::function<bool()>> again;
  for (auto& step : work) {
    if (!step()) again.push_back(std::move(step));
  }
  if (!again.empty()) {
    std::lock_guard<std::mutex> guard(deferred_mutex_);
    for (auto& step : again) deferred_.push_back(std::move(step));
    deferred_count_.store(deferred_.size(), std::memory_order_relaxed);
  }
}

// ---- sending packets -------------------------------------------------------------------

// Sends p's first `length` payload bytes to `rank`. The packet is consumed on every path.
Status DeviceImpl::send_packet(Packet* p, int rank, std::size_t length) {
  Link& l = link(rank);
  if (length <= l.caps->inject_size) {
    const int rc = l.transport->inject(rank, p->data(), length);
    pool_->put(p);
    if (rc == 0) return Status::make_done();
    if (rc == -EAGAIN) return Status::make_retry(RetryReason::provider);
    throw_transport(l, "inject", rc, rank);
  }
  if (!take_credit()) {
    pool_->put(p);
    return Status::make_retry(RetryReason::send_queue);
  }
  p->send.rank = rank;
  p->ctx.set_kind(CtxKind::send_packet);  // release: after every field the completion reads
  const int rc = l.transport->send(rank, p->data(), length, l.pool_desc, &p->ctx);
  if (rc == 0) return Status::make_done();
  return_credit();
  pool_->put(p);
  if (rc == -EAGAIN) return Status::make_retry(RetryReason::provider);
  throw_transport(l, "send", rc, rank);
}

namespace {

Packet* fill_header(Packet* p, MsgKind kind, std::uint16_t target, int src, Tag tag, std::uint32_t aux = 0) {
  encode(p->data(), WireHeader{kind, 0, target, src, tag, aux});
  return p;
}

}  // namespace

Status DeviceImpl::post_am(const AmArgs& a) {
  check(a);
  if (!backlog_clear()) return Status::make_retry(RetryReason::provider);
  Link& l = link(a.rank);
  if (l.fragmented(a.size)) return post_fragments(l, MsgKind::am, a.target.id, a.tag, a.rank, a.buffer, a.size);
  if (a.size > eager_limit_) {
    return post_rendezvous(OpKind::am, a.rank, a.tag, a.target.id, a.buffer, a.size, a.local, a.context);
  }
  if (kHeader + a.size <= kStackInject && kHeader + a.size <= l.caps->inject_size) {
    return inject_small(l, MsgKind::am, a.target.id, a.tag, a.rank, a.buffer, a.size);
  }
  Packet* p = pool_->get();
  if (p == nullptr) return Status::make_retry(RetryReason::packet_pool);
  fill_header(p, MsgKind::am, a.target.id, runtime_.rank(), a.tag);
  if (a.size != 0) std::memcpy(p->data() + kHeader, a.buffer, a.size);
  return send_packet(p, a.rank, kHeader + a.size);
}

std::size_t DeviceImpl::iovec_eager_limit(std::size_t parts) const noexcept {
  const std::size_t overhead = kHeader + sizeof(RtsBody) + parts * sizeof(RtsPart);
  return overhead >= config_.packet_size ? 0 : config_.packet_size - overhead;
}

// Small messages the provider injects (copies at once) need no packet: header and payload are
// assembled on the stack, so the pool is not touched at all.
Status DeviceImpl::inject_small(Link& l, MsgKind kind, std::uint16_t target, Tag tag, int rank, const void* buffer,
                                std::size_t size) {
  alignas(16) unsigned char frame[kStackInject];
  encode(frame, WireHeader{kind, 0, target, runtime_.rank(), tag, 0});
  if (size != 0) std::memcpy(frame + kHeader, buffer, size);
  const int rc = l.transport->inject(rank, frame, kHeader + size);
  if (rc == 0) return Status::make_done();
  if (rc == -EAGAIN) return Status::make_retry(RetryReason::provider);
  throw_transport(l, "inject", rc, rank);
}

// The pieces go straight from the caller's buffer; only a tail the provider refuses is copied
// (into the packet taken up front, so an empty pool is a retry before anything is sent).
Status DeviceImpl::post_fragments(Link& l, MsgKind kind, std::uint16_t target, Tag tag, int rank, const void* buffer,
                                  std::size_t size) {
  Packet* spare = pool_->get();
  if (spare == nullptr) return Status::make_retry(RetryReason::packet_pool);
  const std::uint32_t id = next_fragment_id_.fetch_add(1, std::memory_order_relaxed);  // a name, orders nothing
  alignas(16) unsigned char frame[kMaxFragmentFrame];
  encode(frame, WireHeader{MsgKind::frag, static_cast<std::uint8_t>(kind), target, runtime_.rank(), tag, id});
  const auto* src = static_cast<const unsigned char*>(buffer);
  const std::size_t payload = l.fragment_payload;
  for (std::size_t off = 0; off < size; off += payload) {
    const std::size_t n = std::min(payload, size - off);
    encode(frame + kHeader, FragBody{static_cast<std::uint32_t>(off), static_cast<std::uint32_t>(size)});
    std::memcpy(frame + kFragmentHeader, src + off, n);
    const int rc = l.transport->inject(rank, frame, kFragmentHeader + n);
    if (rc == 0) continue;
    if (rc != -EAGAIN || off == 0) {
      pool_->put(spare);
      if (rc == -EAGAIN) return Status::make_retry(RetryReason::provider);
      throw_transport(l, "inject", rc, rank);
    }
    // The provider took the first pieces: the rest must follow them, so it joins the backlog.
    // Layout: [frame header][remaining bytes], in the spare packet or, for a message larger
    // than a packet, a heap block; each later piece's header is written just in front of its
    // bytes, over bytes already sent.
    unsigned char* d = spare->data();
    if (kFragmentHeader + (size - off) > spare->capacity) {
      d = static_cast<unsigned char*>(std::malloc(kFragmentHeader + (size - off)));
      if (d == nullptr) {
        pool_->put(spare);
        throw Error("post: cannot allocate " + str(size - off) + " bytes for a message's pieces the provider refused");
      }
    }
    std::memcpy(d, frame, kHeader);
    std::memcpy(d + kFragmentHeader, src + off, size - off);
    spare->backlog = BacklogTail{d, rank, static_cast<std::uint32_t>(size), static_cast<std::uint32_t>(size - off), 0};
    spare->next = nullptr;
    {
      // Counted under the lock, with the link: counted after the unlock, a flusher's decrement
      // for another tail could bring the count to zero while this tail still waits, and this
      // thread's next message would overtake it. Relaxed: the lock publishes the packet, and
      // the only reader that must see this increment is this thread.
      std::lock_guard<SpinLock> guard(backlog_lock_);
      if (backlog_tail_ != nullptr) backlog_tail_->next = spare; else backlog_head_ = spare;
      backlog_tail_ = spare;
      backlog_count_.fetch_add(1, std::memory_order_relaxed);
    }
    return Status::make_done();
  }
  pool_->put(spare);
  return Status::make_done();
}

bool DeviceImpl::flush_backlog() {
  std::unique_lock<SpinLock> guard(backlog_lock_, std::try_to_lock);
  if (!guard.owns_lock()) return false;
  while (Packet* packet = backlog_head_) {
    BacklogTail* p = &packet->backlog;
    unsigned char* d = p->frame;
    Link& l = link(p->rank);
    while (p->remaining() != 0) {
      const std::size_t n = std::min<std::size_t>(l.fragment_payload, p->remaining());
      unsigned char* piece = d + p->sent;  // its bytes start at piece + kFragmentHeader
      if (p->sent != 0) std::memcpy(piece, d, kHeader);  // sent >= fragment_payload > kHeader: no overlap
      encode(piece + kHeader, FragBody{p->offset(), p->size});
      const int rc = l.transport->inject(p->rank, piece, kFragmentHeader + n);
      if (rc == -EAGAIN) return false;
      if (rc != 0) {
        // The peer is unreachable: the rest of this message cannot be delivered. Said, not hidden.
        FERRY_LOG_AT(error, runtime_.rank(), index_, "dropped the rest of a %zu-byte message to rank %d: %s",
                     static_cast<std::size_t>(p->size), p->rank, net::error_text("inject", rc).c_str());
        break;
      }
      p->sent += static_cast<std::uint32_t>(n);
    }
    backlog_head_ = packet->next;
    if (backlog_head_ == nullptr) backlog_tail_ = nullptr;
    if (d != packet->data()) std::free(d);
    pool_->put(packet);
    backlog_count_.fetch_sub(1, std::memory_order_release);
  }
  return true;
}

bool DeviceImpl::post_barrier_step(int rank, std::uint32_t step) {
  Packet* p = pool_->get();
  if (p == nullptr) return false;
  fill_header(p, MsgKind::barrier, 0, runtime_.rank(), step);
  return !send_packet(p, rank, kHeader).is_retry();
}

Status DeviceImpl::post_send(const SendArgs& a) {
  check(a);
  if (!backlog_clear()) return Status::make_retry(RetryReason::provider);
  Link& l = link(a.rank);
  if (l.fragmented(a.size)) return post_fragments(l, MsgKind::msg, 0, a.tag, a.rank, a.buffer, a.size);
  if (a.size > eager_limit_) {
    return post_rendezvous(OpKind::send, a.rank, a.tag, 0, a.buffer, a.size, a.local, a.context);
  }
  if (kHeader + a.size <= kStackInject && kHeader + a.size <= l.caps->inject_size) {
    return inject_small(l, MsgKind::msg, 0, a.tag, a.rank, a.buffer, a.size);
  }
  Packet* p = pool_->get();
  if (p == nullptr) return Status::make_retry(RetryReason::packet_pool);
  fill_header(p, MsgKind::msg, 0, runtime_.rank(), a.tag);
  if (a.size != 0) std::memcpy(p->data() + kHeader, a.buffer, a.size);
  return send_packet(p, a.rank, kHeader + a.size);
}

// Registers the sender's buffer and sends an RTS; the receiver reads and answers with FIN.
Status DeviceImpl::post_rendezvous(OpKind op, int rank, Tag tag, std::uint16_t target, const void* buffer,
                                   std::size_t size, CompletionObject* local, void* context) {
  Packet* p = pool_->get();
  if (p == nullptr) return Status::make_retry(RetryReason::packet_pool);
  auto* send = new SendOp{};
  send->op = op;
  send->rank = rank;
  send->tag = tag;
  send->size = size;
  send->local = local;
  send->context = context;
  Link& l = link(rank);
  send->transport = l.transport;
  try {
    send->registrations.push_back(l.transport->register_memory(buffer, size, net::Access::remote_read | net::Access::send));
  } catch (...) {
    pool_->put(p);
    delete send;
    throw;
  }
  net::Registration* mr = send->registrations[0];
  fill_header(p, op == OpKind::am ? MsgKind::rts_am : MsgKind::rts_msg, target, runtime_.rank(), tag);
  encode(p->data() + kHeader,
         RtsBody{size, l.caps->rma_virtual_address ? reinterpret_cast<std::uint64_t>(buffer) : 0, mr->key(),
                 reinterpret_cast<std::uint64_t>(send)});
  open_ops_.fetch_add(1, std::memory_order_relaxed);
  send->ready.store(true, std::memory_order_release);
  const Status s = send_packet(p, rank, kHeader + sizeof(RtsBody));
  if (s.is_retry()) {
    open_ops_.fetch_sub(1, std::memory_order_relaxed);
    l.transport->deregister(mr);
    delete send;
    return s;
  }
  return Status::make_posted();
}

Status DeviceImpl::post_am_iovec(const AmIovecArgs& a) {
  const std::size_t total = check(a);
  const std::size_t need = kHeader + sizeof(RtsBody) + a.eager.size + a.parts.size() * sizeof(RtsPart);
  Packet* p = pool_->get();
  if (p == nullptr) return Status::make_retry(RetryReason::packet_pool);
  auto* send = new SendOp{};
  send->op = OpKind::am;
  send->rank = a.rank;
  send->tag = a.tag;
  send->size = a.eager.size + total;
  send->local = a.local;
  send->context = a.context;
  Link& l = link(a.rank);
  send->transport = l.transport;
  unsigned char* at = p->data() + kHeader + sizeof(RtsBody);
  if (a.eager.size != 0) std::memcpy(at, a.eager.buffer, a.eager.size);
  at += a.eager.size;
  try {
    for (const IoPart& part : a.parts) {
      std::uint64_t key = 0;
      if (part.size != 0) {
        send->registrations.push_back(
            l.transport->register_memory(part.buffer, part.size, net::Access::remote_read | net::Access::send));
        key = send->registrations.back()->key();
      }
      encode(at, RtsPart{part.size, l.caps->rma_virtual_address ? reinterpret_cast<std::uint64_t>(part.buffer) : 0, key});
      at += sizeof(RtsPart);
    }
  } catch (...) {
    for (net::Registration* r : send->registrations) l.transport->deregister(r);
    delete send;
    pool_->put(p);
    throw;
  }
  fill_header(p, MsgKind::rts_iovec, a.target.id, runtime_.rank(), a.tag, static_cast<std::uint32_t>(a.parts.size()));
  encode(p->data() + kHeader, RtsBody{a.eager.size, 0, 0, reinterpret_cast<std::uint64_t>(send)});
  open_ops_.fetch_add(1, std::memory_order_relaxed);
  send->ready.store(true, std::memory_order_release);
  const Status s = send_packet(p, a.rank, need);
  if (s.is_retry()) {
    open_ops_.fetch_sub(1, std::memory_order_relaxed);
    for (net::Registration* r : send->registrations) l.transport->deregister(r);
    delete send;
    return s;
  }
  return Status::make_posted();
}

// ---- receiving ---------------------------------------------------------------------------

Status DeviceImpl::post_recv(const RecvArgs& a) {
  check(a);
  const RecvDescriptor spec{{a.rank, a.tag}, a.buffer, a.size, a.local, a.context};
  const auto res = matching_.add_recv(a.rank, a.tag, [&]() -> Packet* {
    Packet* r = recv_descriptors_->get();
    if (r != nullptr) r->recv = spec;
    return r;
  });
  Packet* m = res.message;
  if (m == nullptr) {
    return res.queued != nullptr ? Status::make_posted() : Status::make_retry(RetryReason::packet_pool);
  }
  const auto h = decode<WireHeader>(m->data());
  if (h.kind == MsgKind::rts_msg) {
    start_rendezvous_recv(m, &spec);
    return Status::make_posted();
  }
  // An eager message was already here: copy it out and finish now.
  const std::size_t have = message_size(m);
  if (have > a.size) {  // truncation is reported through the completion object
    deliver_message(spec, m);
    return Status::make_posted();
  }
  if (have != 0) std::memcpy(a.buffer, message_payload(m), have);
  Status s = Status::make_done();
  s.rank = h.src;
  s.tag = h.tag;
  s.size = have;
  release_message(m);
  return s;
}

// Copies an eager message into a matched receive and signals it. Consumes the message.
void DeviceImpl::deliver_message(const RecvDescriptor& recv, Packet* message) {
  const auto h = decode<WireHeader>(message->data());
  const std::size_t have = message_size(message);
  Completion c;
  c.op = OpKind::recv;
  c.rank = h.src;
  c.tag = h.tag;
  c.context = recv.context;
  c.size = have <= recv.size ? have : recv.size;
  if (have > recv.size) c.error = -EMSGSIZE;
  if (c.size != 0) std::memcpy(recv.buffer, message_payload(message), c.size);
  release_message(message);
  signal_local(recv.local, std::move(c));
}

const unsigned char* DeviceImpl::message_payload(Packet* m) noexcept {
  return m->arrived.heap != nullptr ? m->arrived.heap : m->data() + kHeader;
}

std::size_t DeviceImpl::message_size(const Packet* m) noexcept {
  return m->arrived.heap != nullptr ? m->arrived.heap_size : m->arrived.length - kHeader;
}

void DeviceImpl::release_message(Packet* m) noexcept {
  if (m->arrived.heap != nullptr) recv_blocks::give(m->arrived.heap);
  pool_->put(m);
}

namespace {

// Splits [local, local+size) read from (addr, key) into chunks of at most `max` bytes.
void add_chunks(std::vector<Chunk>& out, void* owner, CtxKind kind, unsigned char* local, void* desc,
                std::size_t size, std::uint64_t addr, std::uint64_t key, std::size_t max) {
  for (std::size_t off = 0; off < size; off += max) {
    Chunk c{};
    c.ctx.set_kind(kind);
    c.owner = owner;
    c.local = local + off;
    c.desc = desc;
    c.size = size - off < max ? size - off : max;
    c.remote_addr = addr + off;
    c.key = key;
    out.push_back(c);
  }
}

}  // namespace

// Issues a RecvOp's reads as credits allow; true when all are issued.
static bool issue_reads(DeviceImpl& dev, RecvOp* op) {
  net::Transport* t = op->link->transport;
  while (op->issued < op->chunks.size()) {
    Chunk& c = op->chunks[op->issued];
    if (!dev.take_credit()) return false;
    const int rc = t->get(op->rank, c.local, c.size, c.desc, c.remote_addr, c.key, &c.ctx);
    if (rc == -EAGAIN) {
      dev.return_credit();
      return false;
    }
    if (rc != 0) {
      dev.return_credit();
      FERRY_LOG_AT(error, dev.runtime().rank(), dev.index(), "%s reading %zu bytes from rank %d",
                   net::error_text("get", rc).c_str(), c.size, op->rank);
      op->error = rc;
      ++op->completed;  // treat as finished-with-error so the op can complete
    }
    ++op->issued;
  }
  return true;
}

// Sends a FIN; false when it must be tried again later.
static bool send_fin(DeviceImpl& dev, int rank, std::uint64_t send_op, int src) {
  Packet* p = dev.pool().get();
  if (p == nullptr) return false;
  encode(p->data(), WireHeader{MsgKind::fin, 0, 0, src, 0, 0});
  encode(p->data() + kHeader, FinBody{send_op});
  try {
    return !dev.send_packet(p, rank, kHeader + sizeof(FinBody)).is_retry();
  } catch (const std::exception& e) {
    FERRY_LOG_AT(error, src, dev.index(), "cannot send a rendezvous FIN to rank %d: %s", rank, e.what());
    return true;
  }
}

// Finishes a RecvOp whose reads are all complete: deliver, FIN, free.
static void finish_recv_op(DeviceImpl& dev, RecvOp* op) {
  for (net::Registration* r : op->registrations) op->link->transport->deregister(r);
  op->registrations.clear();
  Completion c;
  c.rank = op->rank;
  c.tag = op->tag;
  c.size = op->size;
  c.error = op->error;
  const int src = dev.runtime().rank();
  const int rank = op->rank;
  const std::uint64_t send_op = op->send_op;
  switch (op->goal) {
    case RecvOp::Goal::user_recv:
      c.op = OpKind::recv;
      c.context = op->context;
      signal_local(op->local, std::move(c));
      break;
    case RecvOp::Goal::am:
      c.op = OpKind::remote_am;
      c.buffer = std::move(op->parts[0]);
      dev.runtime().deliver(op->target, std::move(c));
      break;
    case RecvOp::Goal::iovec:
      c.op = OpKind::remote_am;
      c.buffer = std::move(op->eager);
      c.parts = std::move(op->parts);
      dev.runtime().deliver(op->target, std::move(c));
      break;
  }
  delete op;
  dev.open_ops().fetch_sub(1, std::memory_order_relaxed);
  if (!send_fin(dev, rank, send_op, src)) {
    dev.defer([&dev, rank, send_op, src] { return send_fin(dev, rank, send_op, src); });
  }
}

// Starts reading the message an RTS announces. `recv` is the matched user receive (rts_msg)
// or null (rts_am, rts_iovec). Consumes the RTS packet. Called by progress or by post_recv.
void DeviceImpl::start_rendezvous_recv(Packet* rts, const RecvDescriptor* recv) {
  const auto h = decode<WireHeader>(rts->data());
  const auto body = decode<RtsBody>(rts->data() + kHeader);
  auto* op = new RecvOp{};
  op->device = this;
  op->rank = h.src;
  op->tag = h.tag;
  op->target = h.target;
  op->send_op = body.send_op;
  Link& l = link(h.src);
  op->link = &l;
  const std::size_t max = l.caps->max_rma_size;
  // Under local_registration each destination needs its own registration and descriptor.
  auto reg_local = [&](void* dst, std::size_t n) -> void* {
    if (!l.caps->local_registration || n == 0) return nullptr;
    op->registrations.push_back(l.transport->register_memory(dst, n, net::Access::recv));
    return op->registrations.back()->desc();
  };
  try {
    switch (h.kind) {
      case MsgKind::rts_msg: {
        op->goal = RecvOp::Goal::user_recv;
        op->local = recv->local;
        op->context = recv->context;
        op->size = body.size <= recv->size ? body.size : recv->size;
        if (body.size > recv->size) op->error = -EMSGSIZE;
        void* desc = reg_local(recv->buffer, op->size);
        add_chunks(op->chunks, op, CtxKind::rdv_read, static_cast<unsigned char*>(recv->buffer), desc, op->size,
                   body.addr, body.key, max);
        break;
      }
      case MsgKind::rts_am: {
        op->goal = RecvOp::Goal::am;
        op->size = body.size;
        void* dst = recv_blocks::take(body.size);
        if (dst == nullptr) throw Error("rendezvous: cannot allocate " + str(body.size) + " bytes for an active message");
        op->parts.emplace_back(dst, body.size, &recv_blocks::release, nullptr);
        void* desc = reg_local(dst, body.size);
        add_chunks(op->chunks, op, CtxKind::rdv_read, static_cast<unsigned char*>(dst), desc, body.size, body.addr,
                   body.key, max);
        break;
      }
      case MsgKind::rts_iovec: {
        op->goal = RecvOp::Goal::iovec;
        const unsigned char* at = rts->data() + kHeader + sizeof(RtsBody);
        const std::size_t eager = body.size;
        op->size = eager;
        const unsigned char* table = at + eager;
        for (std::uint32_t i = 0; i < h.aux; ++i) {
          const auto part = decode<RtsPart>(table + i * sizeof(RtsPart));
          void* dst = part.size != 0 ? recv_blocks::take(part.size) : nullptr;
          if (part.size != 0 && dst == nullptr) throw Error("rendezvous: cannot allocate " + str(part.size) + " bytes");
          op->parts.emplace_back(dst, part.size, &recv_blocks::release, nullptr);
          op->size += part.size;
          void* desc = reg_local(dst, part.size);
          add_chunks(op->chunks, op, CtxKind::rdv_read, static_cast<unsigned char*>(dst), desc, part.size, part.addr,
                     part.key, max);
        }
        // The eager part stays in the RTS packet, handed over as the completion's buffer.
        op->eager = Buffer(rts->data() + kHeader + sizeof(RtsBody), eager, &release_rts_payload, pool_.get());
        rts = nullptr;
        break;
      }
      default:
        break;
    }
  } catch (const std::exception& e) {
    FERRY_LOG_AT(error, runtime_.rank(), index_, "cannot receive a rendezvous from rank %d: %s", h.src, e.what());
    op->error = -ENOMEM;
    op->chunks.clear();  // nothing to read: complete with the error (the sender still gets its FIN)
  }
  if (rts != nullptr) pool_->put(rts);
  open_ops_.fetch_add(1, std::memory_order_relaxed);
  if (op->chunks.empty()) {
    finish_recv_op(*this, op);
    return;
  }
  defer([this, op] {
    if (!issue_reads(*this, op)) return false;
    if (op->completed == op->chunks.size()) finish_recv_op(*this, op);
    return true;
  });
}

inline void DeviceImpl::on_recv(Link& l, Packet* p, std::size_t length) {
  --l.posted_recvs;
  // The header comes from another process: its kind and sender are checked before use (the
  // sender indexes the route table).
  const std::int32_t src = length >= kHeader ? decode<WireHeader>(p->data()).src : -1;
  if (length < kHeader || length > p->capacity || !valid_kind(p->data()[0]) || src < 0 || src >= runtime_.size()) {
    FERRY_LOG_AT(warn, runtime_.rank(), index_, "dropped a malformed packet of %zu bytes", length);
    pool_->put(p);
    return;
  }
  p->arrived.length = static_cast<std::uint32_t>(length);
  if (p->data()[0] == static_cast<std::uint8_t>(MsgKind::frag)) {
    on_fragment(p, length);
    return;
  }
  on_packet(p);
}

void DeviceImpl::on_fragment(Packet* p, std::size_t length) {
  unsigned char* d = p->data();
  const auto h = decode<WireHeader>(d);
  // Too short to hold a FragBody: offset > total marks it malformed below.
  const auto f = length >= kFragmentHeader ? decode<FragBody>(d + kHeader) : FragBody{1, 0};
  const std::size_t n = length >= kFragmentHeader ? length - kFragmentHeader : 0;
  const auto kind = static_cast<MsgKind>(h.reserved);
  const std::size_t limit = std::max<std::size_t>(p->capacity - kHeader, fragment_limit_);
  if ((kind != MsgKind::am && kind != MsgKind::msg) || f.total > limit || f.offset > f.total ||
      n > f.total - f.offset) {
    FERRY_LOG_AT(warn, runtime_.rank(), index_, "dropped a malformed fragment of %zu bytes from rank %d", length, h.src);
    pool_->put(p);
    return;
  }
  for (Partial& m : partials_) {
    if (m.src != h.src || m.id != h.aux) continue;
    std::memcpy((m.heap != nullptr ? m.heap : m.packet->data() + kHeader) + f.offset, d + kFragmentHeader, n);
    pool_->put(p);
    m.received += static_cast<std::uint32_t>(n);
    if (m.received < f.total) return;
    Packet* whole = m.packet;
    unsigned char* heap = m.heap;
    m = partials_.back();
    partials_.pop_back();
    if (heap != nullptr) {
      on_heap_message(whole, heap, f.total);
      return;
    }
    whole->arrived.length = static_cast<std::uint32_t>(kHeader + f.total);
    on_packet(whole);
    return;
  }
  if (f.total > p->capacity - kHeader) {
    // Larger than a packet: the payload gathers in a heap block, the packet keeps the header.
    auto* heap = static_cast<unsigned char*>(recv_blocks::take(f.total));
    if (heap == nullptr) {
      FERRY_LOG_AT(error, runtime_.rank(), index_, "dropped a %u-byte message from rank %d: out of memory", f.total, h.src);
      pool_->put(p);
      return;
    }
    std::memcpy(heap + f.offset, d + kFragmentHeader, n);
    encode(d, WireHeader{kind, 0, h.target, h.src, h.tag, 0});
    partials_.push_back(Partial{h.src, h.aux, p, heap, static_cast<std::uint32_t>(n)});
    return;
  }
  // The first piece to arrive: its packet becomes the message (header of the message's own
  // kind, payload at its offset), so reassembly takes no buffer of its own.
  std::memmove(d + kHeader + f.offset, d + kFragmentHeader, n);
  encode(d, WireHeader{kind, 0, h.target, h.src, h.tag, 0});
  if (n == f.total) {
    p->arrived.length = static_cast<std::uint32_t>(kHeader + n);
    on_packet(p);
    return;
  }
  partials_.push_back(Partial{h.src, h.aux, p, nullptr, static_cast<std::uint32_t>(n)});
}

// A tagged message (msg or rts_msg, its arrived.from set) meets its receive, or waits in the
// matching engine for one.
inline void DeviceImpl::match_message(Packet* p, MsgKind kind) {
  Packet* r = matching_.add_message(p);
  if (r == nullptr) return;  // unexpected: the packet waits in the matching engine
  const RecvDescriptor spec = r->recv;
  recv_descriptors_->put(r);
  if (kind == MsgKind::msg) deliver_message(spec, p); else start_rendezvous_recv(p, &spec);
}

void DeviceImpl::on_heap_message(Packet* p, unsigned char* heap, std::size_t size) {
  const auto h = decode<WireHeader>(p->data());
  if (h.kind == MsgKind::am) {
    Completion c;
    c.op = OpKind::remote_am;
    c.rank = h.src;
    c.tag = h.tag;
    c.size = size;
    c.buffer = Buffer(heap, size, &recv_blocks::release, nullptr);
    pool_->put(p);
    runtime_.deliver(h.target, std::move(c));
    return;
  }
  p->arrived = ArrivedMessage{static_cast<std::uint32_t>(kHeader), MatchKey{h.src, h.tag}, heap, size};
  match_message(p, MsgKind::msg);
}

void DeviceImpl::on_packet(Packet* p) {
  const auto h = decode<WireHeader>(p->data());
  switch (h.kind) {
    case MsgKind::am: {
      Completion c;
      c.op = OpKind::remote_am;
      c.rank = h.src;
      c.tag = h.tag;
      c.size = p->arrived.length - kHeader;
      c.buffer = Buffer(p->data() + kHeader, c.size, &release_am_payload, pool_.get());
      // A delivered payload keeps its packet until the application drops it. When the
      // application holds so many that the pool could not refill the posted receives, the
      // payload moves to the heap and the packet returns at once: otherwise a receiver that is
      // slow to consume (or is in finalize) would leave its device no receive buffers and every
      // sender to it retrying forever. Rare by construction; the common case is one load.
      if (__builtin_expect(pool_->available_approx() < config_.prepost, 0)) c.buffer = copy_out(std::move(c.buffer));
      runtime_.deliver(h.target, std::move(c));
      return;
    }
    case MsgKind::msg:
    case MsgKind::rts_msg:
      p->arrived.from = MatchKey{h.src, h.tag};
      p->arrived.heap = nullptr;  // the payload, if any, follows the header
      match_message(p, h.kind);
      return;
    case MsgKind::rts_am:
    case MsgKind::rts_iovec:
      start_rendezvous_recv(p, nullptr);
      return;
    case MsgKind::barrier:
      pool_->put(p);
      runtime_.barrier_arrived(h.tag);
      return;
    case MsgKind::frag:  // on_recv hands fragments to on_fragment, which never passes one on
      pool_->put(p);
      return;
    case MsgKind::fin: {
      const auto fin = decode<FinBody>(p->data() + kHeader);
      pool_->put(p);
      auto* send = reinterpret_cast<SendOp*>(fin.send_op);
      (void)send->ready.load(std::memory_order_acquire);
      for (net::Registration* r : send->registrations) send->transport->deregister(r);
      Completion c;
      c.op = send->op;
      c.rank = send->rank;
      c.tag = send->tag;
      c.size = send->size;
      c.context = send->context;
      CompletionObject* local = send->local;
      delete send;
      open_ops_.fetch_sub(1, std::memory_order_relaxed);
      signal_local(local, std::move(c));
      return;
    }
  }
}

void DeviceImpl::on_notification(const net::Event& e) {
  Completion c;
  c.op = OpKind::remote_put;
  // With 8 bytes of remote data the writer's rank travels in the data (some providers, e.g.
  // rxm, give no source address for RMA completions); with 4 bytes the transport names it.
  c.rank = e.rank >= 0 ? e.rank : static_cast<int>(e.data >> 32);
  c.tag = static_cast<Tag>(e.data & 0xFFFF);
  c.size = e.length;
  runtime_.deliver(static_cast<std::uint16_t>((e.data >> 16) & 0xFFFF), std::move(c));
}

// ---- RMA ------------------------------------------------------------------------------------

namespace {

void check_remote(const char* call, int rank, int device, const RemoteKey& key, std::size_t offset, std::size_t size) {
  if (key.rank < 0 && key.size == 0) throw Error(std::string(call) + ": remote key is empty (never set from a MemoryRegion)");
  if (key.rank != rank) {
    throw Error(std::string(call) + ": remote key belongs to rank " + std::to_string(key.rank) + ", not rank=" +
                std::to_string(rank));
  }
  if (key.device != device) {
    throw Error(std::string(call) + ": remote key was registered on device " + std::to_string(key.device) +
                ", but the operation uses device " + std::to_string(device));
  }
  if (offset > key.size || size > key.size - offset) {
    throw Error(std::string(call) + ": offset=" + str(offset) + " + size=" + str(size) +
                " is outside the remote region of " + str(key.size) + " bytes");
  }
}

}  // namespace

static bool issue_rma(DeviceImpl& dev, RmaOp* op) {
  net::Transport* t = op->link->transport;
  const std::size_t n = op->chunks.size();
  while (op->issued < n) {
    const bool last = op->issued == n - 1;
    // A notifying put writes its last chunk with data only once every other chunk completed.
    if (last && op->notify && op->completed < n - 1) return false;
    Chunk& c = op->chunks[op->issued];
    if (!dev.take_credit()) return false;
    int rc;
    if (op->op == OpKind::get) {
      rc = t->get(op->rank, c.local, c.size, c.desc, c.remote_addr, c.key, &c.ctx);
    } else if (last && op->notify) {
      rc = t->put_data(op->rank, c.local, c.size, c.desc, op->notify_data, c.remote_addr, c.key, &c.ctx);
    } else {
      rc = t->put(op->rank, c.local, c.size, c.desc, c.remote_addr, c.key, &c.ctx);
    }
    if (rc == -EAGAIN) {
      dev.return_credit();
      return false;
    }
    if (rc != 0) {
      dev.return_credit();
      op->error = rc;
      ++op->completed;
    }
    ++op->issued;
  }
  return true;
}

static void finish_rma_op(DeviceImpl& dev, RmaOp* op) {
  release_registration(op->link->transport, op->registration);
  Completion c;
  c.op = op->op;
  c.rank = op->rank;
  c.size = op->size;
  c.context = op->context;
  c.error = op->error;
  CompletionObject* local = op->local;
  delete op;
  dev.open_ops().fetch_sub(1, std::memory_order_relaxed);
  signal_local(local, std::move(c));
}

namespace {

struct RmaRequest {
  OpKind op;
  int rank;
  unsigned char* local;
  std::size_t size;
  const RemoteKey& remote;
  std::size_t offset;
  CompletionObject* local_comp;
  void* context;
  bool notify;
  std::uint64_t notify_data;
};

[[noreturn, gnu::cold, gnu::noinline]] void throw_rma(const Link& l, const char* call, int rc, int rank) {
  throw Error(net::error_text(call, rc) + " to rank " + std::to_string(rank) + " over " + l.caps->name);
}

}  // namespace

static Status post_rma(DeviceImpl& dev, const RmaRequest& r) {
  Link& l = dev.link(r.rank);
  const net::Caps& caps = *l.caps;
  net::Transport* t = l.transport;
  const std::uint64_t addr = (caps.rma_virtual_address ? r.remote.base : 0) + r.offset;
  const net::Access access = r.op == OpKind::get ? net::Access::recv : net::Access::send;
  // Tiny puts need no context and no completion.
  if (r.op == OpKind::put && !r.notify && r.size <= caps.inject_size) {
    const int rc = t->inject_put(r.rank, r.local, r.size, addr, r.remote.key);
    if (rc == 0) return Status::make_done();
    if (rc == -EAGAIN) return Status::make_retry(RetryReason::provider);
    throw_rma(l, "inject_put", rc, r.rank);
  }
  if (r.size <= caps.max_rma_size) {
    // One transfer: its state rides in a packet, so nothing is allocated.
    Packet* p = dev.pool().get();
    if (p == nullptr) return Status::make_retry(RetryReason::packet_pool);
    net::Registration* mr = nullptr;
    if (caps.local_registration && r.size != 0) mr = t->register_memory(r.local, r.size, access);
    if (!dev.take_credit()) {
      release_registration(t, mr);
      dev.pool().put(p);
      return Status::make_retry(RetryReason::send_queue);
    }
    p->rma = RmaSingle{r.op, r.rank, r.size, r.local_comp, r.context, mr};
    p->ctx.set_kind(CtxKind::rma_single);  // release: after every field the completion reads
    void* desc = mr != nullptr ? mr->desc() : nullptr;
    int rc;
    if (r.op == OpKind::get) {
      rc = t->get(r.rank, r.local, r.size, desc, addr, r.remote.key, &p->ctx);
    } else if (r.notify) {
      rc = t->put_data(r.rank, r.local, r.size, desc, r.notify_data, addr, r.remote.key, &p->ctx);
    } else {
      rc = t->put(r.rank, r.local, r.size, desc, addr, r.remote.key, &p->ctx);
    }
    if (rc == 0) return Status::make_posted();
    dev.return_credit();
    release_registration(t, mr);
    dev.pool().put(p);
    if (rc == -EAGAIN) return Status::make_retry(RetryReason::provider);
    throw_rma(l, r.op == OpKind::get ? "get" : "put", rc, r.rank);
  }
  // Larger than one transfer: chunks, issued by progress.
  auto* op = new RmaOp{};
  op->op = r.op;
  op->rank = r.rank;
  op->size = r.size;
  op->local = r.local_comp;
  op->context = r.context;
  op->notify = r.notify;
  op->notify_data = r.notify_data;
  op->link = &l;
  try {
    if (caps.local_registration) op->registration = t->register_memory(r.local, r.size, access);
  } catch (...) {
    delete op;
    throw;
  }
  add_chunks(op->chunks, op, CtxKind::rma_chunk, r.local, op->registration != nullptr ? op->registration->desc() : nullptr,
             r.size, addr, r.remote.key, caps.max_rma_size);
  dev.open_ops().fetch_add(1, std::memory_order_relaxed);
  dev.defer([&dev, op] {
    issue_rma(dev, op);
    return op->issued == op->chunks.size();
  });
  return Status::make_posted();
}

// Checks a put's notification and returns its remote CQ data (0 without notification).
std::uint64_t DeviceImpl::notify_data(const PutArgs& a) const {
  if (!a.notify) return 0;
  if (a.notify_target.id >= runtime_.max_targets()) {
    throw Error("post_put: notify_target=" + std::to_string(a.notify_target.id) + " is out of range; FERRY_MAX_TARGETS=" +
                str(runtime_.max_targets()));
  }
  if (a.notify_tag > 0xFFFF) throw Error("post_put: notify_tag=" + std::to_string(a.notify_tag) + " is out of range 0..65535");
  const net::Caps& caps = *route_[static_cast<std::size_t>(a.rank)]->caps;
  if (caps.remote_data_bytes < 4) {
    throw Error("post_put: notify needs 4 bytes of remote data; transport " + caps.name + " offers " +
                str(caps.remote_data_bytes));
  }
  std::uint64_t data = (static_cast<std::uint64_t>(a.notify_target.id) << 16) | a.notify_tag;
  if (caps.remote_data_bytes >= 8) data |= static_cast<std::uint64_t>(runtime_.rank()) << 32;
  return data;
}

// Checks that an iovec message's descriptor fits one packet.
void DeviceImpl::check_iovec_fits(const AmIovecArgs& a) const {
  const std::size_t need = kHeader + sizeof(RtsBody) + a.eager.size + a.parts.size() * sizeof(RtsPart);
  if (need > config_.packet_size) {
    throw Error("post_am_iovec: eager.size=" + str(a.eager.size) + " with " + str(a.parts.size()) + " parts needs " +
                str(need) + " bytes; a packet holds " + str(config_.packet_size) + " (FERRY_PACKET_SIZE)");
  }
}

Status DeviceImpl::post_put(const PutArgs& a) {
  const std::uint64_t data = check(a);
  return post_rma(*this, RmaRequest{OpKind::put, a.rank, static_cast<unsigned char*>(const_cast<void*>(a.buffer)), a.size,
                                    a.remote, a.offset, a.local, a.context, a.notify, data});
}

Status DeviceImpl::post_get(const GetArgs& a) {
  check(a);
  if (a.size == 0) return Status::make_done();
  return post_rma(*this, RmaRequest{OpKind::get, a.rank, static_cast<unsigned char*>(a.buffer), a.size, a.remote, a.offset,
                                    a.local, a.context, false, 0});
}

MemoryRegion DeviceImpl::register_memory(void* data, std::size_t size) {
  check_alive("register_memory");
  check_buffer("register_memory", "data", data, size);
  if (size == 0) throw Error("register_memory: size=0; a region needs at least one byte");
  auto r = std::make_unique<RegionImpl>();
  r->device = this;
  r->data = data;
  r->size = size;
  const net::Access access = net::Access::send | net::Access::recv | net::Access::remote_read | net::Access::remote_write;
  for (Link& l : links_) {
    r->registrations.emplace_back(l.transport, l.transport->register_memory(data, size, access));
    // The key peers name the region by is the one of a transport that uses keys (a network
    // backend); shared memory addresses regions by their virtual address alone.
    if (r->registrations.size() == 1 || r->registrations.back().second->key() != 0) {
      r->key = r->registrations.back().second->key();
    }
  }
  return MemoryRegion(std::move(r));
}

// ---- progress ---------------------------------------------------------------------------------

void DeviceImpl::repost(Link& l) {
  while (l.posted_recvs < config_.prepost) {
    Packet* p = pool_->get();
    if (p == nullptr) return;  // the pool is dry: try again on the next progress
    p->ctx.set_kind(CtxKind::recv_packet);
    const int rc = l.transport->post_recv(p->data(), config_.packet_size, l.pool_desc, &p->ctx);
    if (rc != 0) {
      pool_->put(p);
      if (rc != -EAGAIN) FERRY_LOG_AT(error, runtime_.rank(), index_, "%s", net::error_text("post_recv", rc).c_str());
      return;
    }
    ++l.posted_recvs;
  }
}

// Every event of every transport comes here, success and error alike: each kind of operation
// finishes in one place, with the error (if any) carried to whoever waits for it.
void DeviceImpl::on_event(Link& l, const net::Event& e) {
  if (e.remote_write) {
    if (e.error == 0) on_notification(e);
    // Only where a remote write uses up a posted receive does it carry that receive's packet.
    if (e.context != nullptr) {
      --l.posted_recvs;
      pool_->put(reinterpret_cast<Packet*>(e.context));
    }
    return;
  }
  OpContext* ctx = e.context;
  const int err = e.error;
  switch (ctx->kind()) {
    case CtxKind::recv_packet: {
      auto* p = reinterpret_cast<Packet*>(ctx);
      if (err == 0) {
        on_recv(l, p, e.length);
        return;
      }
      --l.posted_recvs;
      if (err != -ECANCELED) {
        FERRY_LOG_AT(error, runtime_.rank(), index_, "%s", net::error_text("receive", err).c_str());
      }
      pool_->put(p);
      return;
    }
    case CtxKind::send_packet: {
      auto* p = reinterpret_cast<Packet*>(ctx);
      return_credit();
      if (__builtin_expect(err != 0, 0)) {
        // An eager send already returned done: the caller cannot be told, so say it loudly.
        FERRY_LOG_AT(error, runtime_.rank(), index_, "a send to rank %d failed: %s", p->send.rank,
                     net::error_text("send", err).c_str());
      }
      pool_->put(p);
      return;
    }
    case CtxKind::rma_single: {
      auto* p = reinterpret_cast<Packet*>(ctx);
      const RmaSingle op = p->rma;
      return_credit();
      release_registration(l.transport, op.mr);
      Completion c;
      c.op = op.op;
      c.rank = op.rank;
      c.size = op.size;
      c.context = op.context;
      c.error = err;
      pool_->put(p);
      signal_local(op.local, std::move(c));
      return;
    }
    case CtxKind::rma_chunk: {
      auto* op = static_cast<RmaOp*>(reinterpret_cast<Chunk*>(ctx)->owner);
      return_credit();
      if (err != 0) op->error = err;
      if (++op->completed == op->chunks.size()) {
        finish_rma_op(*this, op);
      } else if (err == 0 && op->notify && op->issued < op->chunks.size()) {
        issue_rma(*this, op);  // the notifying chunk may be due now
      }
      return;
    }
    case CtxKind::rdv_read: {
      auto* op = static_cast<RecvOp*>(reinterpret_cast<Chunk*>(ctx)->owner);
      return_credit();
      if (err != 0) {
        op->error = err;
        FERRY_LOG_AT(error, runtime_.rank(), index_, "rendezvous read from rank %d failed: %s", op->rank,
                     net::error_text("get", err).c_str());
      }
      if (++op->completed == op->chunks.size() && op->issued == op->chunks.size()) finish_recv_op(*this, op);
      return;
    }
  }
}

bool DeviceImpl::progress() {
  if (!poll_lock_.try_lock()) return false;
  std::lock_guard<SpinLock> guard(poll_lock_, std::adopt_lock);
  net::Event events[kPollBatch];
  bool any = false;
  for (Link& l : links_) {
    const int n = l.transport->poll(events, kPollBatch);
    for (int i = 0; i < n; ++i) {
      const net::Event& e = events[i];
      // The common event, an arrived message, skips the general dispatch.
      if (__builtin_expect(!e.remote_write && e.error == 0 && e.context->kind() == CtxKind::recv_packet, 1)) {
        on_recv(l, reinterpret_cast<Packet*>(e.context), e.length);
      } else {
        on_event(l, e);
      }
    }
    any = any || n > 0;
  }
  run_deferred();
  // Relaxed: a stale zero only leaves the backlog to the next post or progress call.
  if (backlog_count_.load(std::memory_order_relaxed) != 0) flush_backlog();
  // Reposting costs one transport call per buffer. A poll that found work leaves it to the
  // next idle poll, so a reply is not held up by buffer bookkeeping (in a ping-pong the refill
  // runs while the peer computes its answer); at or below half the target it refills at once,
  // so a flood that never lets the device idle cannot drain the posted receives.
  for (Link& l : links_) {
    if (l.posted_recvs < config_.prepost && (!any || l.posted_recvs <= config_.prepost / 2)) repost(l);
  }
  return any;
}

std::size_t DeviceImpl::in_flight() const noexcept {
  return open_ops_.load(std::memory_order_relaxed) +
         (credits_max_ - static_cast<std::size_t>(credits_.load(std::memory_order_relaxed))) +
         deferred_count_.load(std::memory_order_relaxed) + backlog_count_.load(std::memory_order_relaxed);
}

}  // namespace ferry::detail
