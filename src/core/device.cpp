#include "core/device.hpp"

#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "common/log.hpp"
#include "core/recv_blocks.hpp"
#include "core/runtime_impl.hpp"
#include "core/wire.hpp"
#include "ferry/error.hpp"

static_assert(sizeof(fi_context2) <= ferry::detail::OpContext::kBackendBytes);

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
  std::vector<fid_mr*> mrs;
};

// One RMA transfer of at most max_msg_size bytes.
struct Chunk {
  OpContext ctx;  // first: libfabric's context
  void* owner;    // RecvOp* or RmaOp*
  unsigned char* local;
  void* desc;  // FI_MR_LOCAL descriptor of `local`, or null
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
  std::vector<fid_mr*> mrs;   // FI_MR_LOCAL registrations of the destinations
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
  fid_mr* mr = nullptr;
  std::vector<Chunk> chunks;
  std::size_t issued = 0;
  std::size_t completed = 0;
};

RegionImpl::~RegionImpl() { net::close_mr(mr); }

// ---- setup ----------------------------------------------------------------------------

DeviceImpl::DeviceImpl(RuntimeImpl& runtime, int index, net::Fabric& fabric, const Config& config)
    : runtime_(runtime),
      index_(index),
      caps_(fabric.caps()),
      config_(config),
      pool_(std::make_unique<PacketPool>(config.packets, config.packet_size)),
      recv_descriptors_(std::make_unique<PacketPool>(config.recv_descriptors, 64)),
      endpoint_(fabric, 0),
      eager_limit_(config.packet_size - kHeader),
      credits_max_(config.send_credits != 0 ? config.send_credits
                                            : (caps_.tx_size != 0 ? caps_.tx_size : 256)),
      credits_(static_cast<std::int64_t>(credits_max_)) {
  if (config.rdv_threshold != 0 && config.rdv_threshold < eager_limit_) eager_limit_ = config.rdv_threshold;
  if (eager_limit_ > caps_.max_msg_size - kHeader) eager_limit_ = caps_.max_msg_size - kHeader;
  // Fragments carry messages up to FERRY_FRAGMENT_MAX (or the packet's eager limit, if larger),
  // never past an explicit rendezvous threshold; 32-bit offsets on the wire.
  std::size_t limit = std::max(eager_limit_, config.fragment_max);
  if (config.rdv_threshold != 0) limit = std::min(limit, config.rdv_threshold);
  limit = std::min<std::size_t>(limit, std::numeric_limits<std::uint32_t>::max());
  if (config.fragment == FragmentMode::automatic && caps_.inject_size >= kMinFragmentInject && kHeader + limit > caps_.inject_size) {
    fragment_payload_ = std::min(caps_.inject_size, kMaxFragmentFrame) - kFragmentHeader;
    fragment_limit_ = limit;
    partials_.reserve(64);
  }
  // The packet slab is registered once; the descriptor matters only under FI_MR_LOCAL.
  pool_mr_ = endpoint_.register_memory(pool_->slab(), pool_->slab_bytes(), FI_SEND | FI_RECV);
  pool_desc_ = caps_.mr_local ? fi_mr_desc(pool_mr_) : nullptr;
}

DeviceImpl::~DeviceImpl() {
  // Cancel what the provider still holds, then give the packets back so the pool can go.
  fi_cancel(&endpoint_.ep()->fid, nullptr);
  matching_.drain([](Packet* r) { r->pool->put_shared(r); },
                  [](Packet* m) {
                    recv_blocks::give(m->arrived.heap);
                    m->pool->put_shared(m);
                  });
  for (Partial& m : partials_) recv_blocks::give(m.heap);
  for (Packet* p = backlog_head_; p != nullptr; p = p->next) {
    if (p->backlog.frame != p->data()) std::free(p->backlog.frame);
  }
  net::close_mr(pool_mr_);
  // endpoint_ closes in its destructor before pool_ frees the slab (declaration order).
}

void DeviceImpl::connect(const std::vector<std::string>& addresses) {
  endpoint_.insert_addresses(addresses);
  std::lock_guard<SpinLock> guard(poll_lock_);
  repost();
  if (posted_recvs_ == 0) throw Error("device " + std::to_string(index_) + ": could not post any receive buffer");
}

// ---- checks -----------------------------------------------------------------------------

namespace {
void check_remote(const char* call, int rank, int device, const RemoteKey& key, std::size_t offset, std::size_t size);
}  // namespace

// The checks are inline compares; only the throwing halves are out of line (and cold), so
// the fast path pays a few predictable branches.
namespace {

[[noreturn, gnu::cold, gnu::noinline]] void throw_provider(const char* call, ssize_t rc, int rank) {
  throw Error(net::fi_error(call, rc) + " to rank " + std::to_string(rank));
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
  fid_ep* ep = endpoint_.ep();
  if (length <= caps_.inject_size) {
    const ssize_t rc = fi_inject(ep, p->data(), length, static_cast<fi_addr_t>(rank));
    pool_->put(p);
    if (rc == 0) return Status::make_done();
    if (rc == -FI_EAGAIN) return Status::make_retry(RetryReason::provider);
    throw_provider("fi_inject", rc, rank);
  }
  if (!take_credit()) {
    pool_->put(p);
    return Status::make_retry(RetryReason::send_queue);
  }
  p->send.rank = rank;
  p->ctx.set_kind(CtxKind::send_packet);  // release: after every field the completion reads
  const ssize_t rc = fi_send(ep, p->data(), length, pool_desc_, static_cast<fi_addr_t>(rank), p->ctx.backend);
  if (rc == 0) return Status::make_done();
  return_credit();
  pool_->put(p);
  if (rc == -FI_EAGAIN) return Status::make_retry(RetryReason::provider);
  throw_provider("fi_send", rc, rank);
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
  if (fragmented(a.size)) return post_fragments(MsgKind::am, a.target.id, a.tag, a.rank, a.buffer, a.size);
  if (a.size > eager_limit_) {
    return post_rendezvous(OpKind::am, a.rank, a.tag, a.target.id, a.buffer, a.size, a.local, a.context);
  }
  if (kHeader + a.size <= kStackInject && kHeader + a.size <= caps_.inject_size) {
    return inject_small(MsgKind::am, a.target.id, a.tag, a.rank, a.buffer, a.size);
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
Status DeviceImpl::inject_small(MsgKind kind, std::uint16_t target, Tag tag, int rank, const void* buffer,
                                std::size_t size) {
  alignas(16) unsigned char frame[kStackInject];
  encode(frame, WireHeader{kind, 0, target, runtime_.rank(), tag, 0});
  if (size != 0) std::memcpy(frame + kHeader, buffer, size);
  const ssize_t rc = fi_inject(endpoint_.ep(), frame, kHeader + size, static_cast<fi_addr_t>(rank));
  if (rc == 0) return Status::make_done();
  if (rc == -FI_EAGAIN) return Status::make_retry(RetryReason::provider);
  throw_provider("fi_inject", rc, rank);
}

// The pieces go straight from the caller's buffer; only a tail the provider refuses is copied
// (into the packet taken up front, so an empty pool is a retry before anything is sent).
Status DeviceImpl::post_fragments(MsgKind kind, std::uint16_t target, Tag tag, int rank, const void* buffer,
                                  std::size_t size) {
  Packet* spare = pool_->get();
  if (spare == nullptr) return Status::make_retry(RetryReason::packet_pool);
  const std::uint32_t id = next_fragment_id_.fetch_add(1, std::memory_order_relaxed);  // a name, orders nothing
  alignas(16) unsigned char frame[kMaxFragmentFrame];
  encode(frame, WireHeader{MsgKind::frag, static_cast<std::uint8_t>(kind), target, runtime_.rank(), tag, id});
  const auto* src = static_cast<const unsigned char*>(buffer);
  fid_ep* ep = endpoint_.ep();
  for (std::size_t off = 0; off < size; off += fragment_payload_) {
    const std::size_t n = std::min(fragment_payload_, size - off);
    encode(frame + kHeader, FragBody{static_cast<std::uint32_t>(off), static_cast<std::uint32_t>(size)});
    std::memcpy(frame + kFragmentHeader, src + off, n);
    const ssize_t rc = fi_inject(ep, frame, kFragmentHeader + n, static_cast<fi_addr_t>(rank));
    if (rc == 0) continue;
    if (rc != -FI_EAGAIN || off == 0) {
      pool_->put(spare);
      if (rc == -FI_EAGAIN) return Status::make_retry(RetryReason::provider);
      throw_provider("fi_inject", rc, rank);
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
  fid_ep* ep = endpoint_.ep();
  while (Packet* packet = backlog_head_) {
    BacklogTail* p = &packet->backlog;
    unsigned char* d = p->frame;
    while (p->remaining() != 0) {
      const std::size_t n = std::min<std::size_t>(fragment_payload_, p->remaining());
      unsigned char* piece = d + p->sent;  // its bytes start at piece + kFragmentHeader
      if (p->sent != 0) std::memcpy(piece, d, kHeader);  // sent >= fragment_payload_ > kHeader: no overlap
      encode(piece + kHeader, FragBody{p->offset(), p->size});
      const ssize_t rc = fi_inject(ep, piece, kFragmentHeader + n, static_cast<fi_addr_t>(p->rank));
      if (rc == -FI_EAGAIN) return false;
      if (rc != 0) {
        // The peer is unreachable: the rest of this message cannot be delivered. Said, not hidden.
        FERRY_LOG_AT(error, runtime_.rank(), index_, "dropped the rest of a %zu-byte message to rank %d: %s",
                     static_cast<std::size_t>(p->size), p->rank, net::fi_error("fi_inject", rc).c_str());
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
  if (fragmented(a.size)) return post_fragments(MsgKind::msg, 0, a.tag, a.rank, a.buffer, a.size);
  if (a.size > eager_limit_) {
    return post_rendezvous(OpKind::send, a.rank, a.tag, 0, a.buffer, a.size, a.local, a.context);
  }
  if (kHeader + a.size <= kStackInject && kHeader + a.size <= caps_.inject_size) {
    return inject_small(MsgKind::msg, 0, a.tag, a.rank, a.buffer, a.size);
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
  try {
    send->mrs.push_back(endpoint_.register_memory(buffer, size, FI_REMOTE_READ | FI_SEND));
  } catch (...) {
    pool_->put(p);
    delete send;
    throw;
  }
  fid_mr* mr = send->mrs[0];
  fill_header(p, op == OpKind::am ? MsgKind::rts_am : MsgKind::rts_msg, target, runtime_.rank(), tag);
  encode(p->data() + kHeader,
         RtsBody{size, caps_.mr_virt_addr ? reinterpret_cast<std::uint64_t>(buffer) : 0, fi_mr_key(mr),
                 reinterpret_cast<std::uint64_t>(send)});
  open_ops_.fetch_add(1, std::memory_order_relaxed);
  send->ready.store(true, std::memory_order_release);
  const Status s = send_packet(p, rank, kHeader + sizeof(RtsBody));
  if (s.is_retry()) {
    open_ops_.fetch_sub(1, std::memory_order_relaxed);
    net::close_mr(mr);
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
  unsigned char* at = p->data() + kHeader + sizeof(RtsBody);
  if (a.eager.size != 0) std::memcpy(at, a.eager.buffer, a.eager.size);
  at += a.eager.size;
  try {
    for (const IoPart& part : a.parts) {
      std::uint64_t key = 0;
      if (part.size != 0) {
        send->mrs.push_back(endpoint_.register_memory(part.buffer, part.size, FI_REMOTE_READ | FI_SEND));
        key = fi_mr_key(send->mrs.back());
      }
      encode(at, RtsPart{part.size, caps_.mr_virt_addr ? reinterpret_cast<std::uint64_t>(part.buffer) : 0, key});
      at += sizeof(RtsPart);
    }
  } catch (...) {
    for (fid_mr* mr : send->mrs) net::close_mr(mr);
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
    for (fid_mr* mr : send->mrs) net::close_mr(mr);
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
  if (have > recv.size) c.error = -FI_ETRUNC;
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
  fid_ep* ep = dev.endpoint().ep();
  while (op->issued < op->chunks.size()) {
    Chunk& c = op->chunks[op->issued];
    if (!dev.take_credit()) return false;
    const ssize_t rc = fi_read(ep, c.local, c.size, c.desc, static_cast<fi_addr_t>(op->rank), c.remote_addr, c.key, c.ctx.backend);
    if (rc == -FI_EAGAIN) {
      dev.return_credit();
      return false;
    }
    if (rc != 0) {
      dev.return_credit();
      FERRY_LOG_AT(error, dev.runtime().rank(), dev.index(), "%s reading %zu bytes from rank %d",
                   net::fi_error("fi_read", rc).c_str(), c.size, op->rank);
      op->error = static_cast<int>(rc);
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
  for (fid_mr* mr : op->mrs) net::close_mr(mr);
  op->mrs.clear();
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
  const std::size_t max = caps_.max_msg_size;
  // Under FI_MR_LOCAL each destination needs its own registration and descriptor.
  auto reg_local = [&](void* dst, std::size_t n) -> void* {
    if (!caps_.mr_local || n == 0) return nullptr;
    op->mrs.push_back(endpoint_.register_memory(dst, n, FI_READ));
    return fi_mr_desc(op->mrs.back());
  };
  try {
    switch (h.kind) {
      case MsgKind::rts_msg: {
        op->goal = RecvOp::Goal::user_recv;
        op->local = recv->local;
        op->context = recv->context;
        op->size = body.size <= recv->size ? body.size : recv->size;
        if (body.size > recv->size) op->error = -FI_ETRUNC;
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
    op->error = -FI_ENOMEM;
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

void DeviceImpl::on_recv(Packet* p, const fi_cq_data_entry& e, std::uint64_t src) {
  (void)src;
  --posted_recvs_;
  if (e.len < kHeader || !valid_kind(p->data()[0])) {
    FERRY_LOG_AT(warn, runtime_.rank(), index_, "dropped a malformed packet of %zu bytes", static_cast<std::size_t>(e.len));
    pool_->put(p);
    return;
  }
  p->arrived.length = static_cast<std::uint32_t>(e.len);
  if (p->data()[0] == static_cast<std::uint8_t>(MsgKind::frag)) {
    on_fragment(p, e.len);
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
      for (fid_mr* mr : send->mrs) net::close_mr(mr);
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

void DeviceImpl::on_notification(const fi_cq_data_entry& e, std::uint64_t src) {
  Completion c;
  c.op = OpKind::remote_put;
  // With 8 bytes of CQ data the writer's rank travels in the data (some providers, e.g. rxm,
  // give no source address for RMA completions); with 4 bytes FI_SOURCE must supply it.
  c.rank = caps_.source ? static_cast<int>(src) : static_cast<int>(e.data >> 32);
  c.tag = static_cast<Tag>(e.data & 0xFFFF);
  c.size = e.len;
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
  fid_ep* ep = dev.endpoint().ep();
  const std::size_t n = op->chunks.size();
  while (op->issued < n) {
    const bool last = op->issued == n - 1;
    // A notifying put writes its last chunk with data only once every other chunk completed.
    if (last && op->notify && op->completed < n - 1) return false;
    Chunk& c = op->chunks[op->issued];
    if (!dev.take_credit()) return false;
    ssize_t rc;
    const auto to = static_cast<fi_addr_t>(op->rank);
    if (op->op == OpKind::get) {
      rc = fi_read(ep, c.local, c.size, c.desc, to, c.remote_addr, c.key, c.ctx.backend);
    } else if (last && op->notify) {
      rc = fi_writedata(ep, c.local, c.size, c.desc, op->notify_data, to, c.remote_addr, c.key, c.ctx.backend);
    } else {
      rc = fi_write(ep, c.local, c.size, c.desc, to, c.remote_addr, c.key, c.ctx.backend);
    }
    if (rc == -FI_EAGAIN) {
      dev.return_credit();
      return false;
    }
    if (rc != 0) {
      dev.return_credit();
      op->error = static_cast<int>(rc);
      ++op->completed;
    }
    ++op->issued;
  }
  return true;
}

static void finish_rma_op(DeviceImpl& dev, RmaOp* op) {
  net::close_mr(op->mr);
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

}  // namespace

static Status post_rma(DeviceImpl& dev, const RmaRequest& r) {
  const net::Caps& caps = dev.caps();
  const std::uint64_t addr = (caps.mr_virt_addr ? r.remote.base : 0) + r.offset;
  fid_ep* ep = dev.endpoint().ep();
  const auto to = static_cast<fi_addr_t>(r.rank);
  // Tiny puts need no context and no completion.
  if (r.op == OpKind::put && !r.notify && r.size <= caps.inject_size) {
    const ssize_t rc = fi_inject_write(ep, r.local, r.size, to, addr, r.remote.key);
    if (rc == 0) return Status::make_done();
    if (rc == -FI_EAGAIN) return Status::make_retry(RetryReason::provider);
    throw Error(net::fi_error("fi_inject_write", rc) + " to rank " + std::to_string(r.rank));
  }
  if (r.size <= caps.max_msg_size) {
    // One transfer: its state rides in a packet, so nothing is allocated.
    Packet* p = dev.pool().get();
    if (p == nullptr) return Status::make_retry(RetryReason::packet_pool);
    fid_mr* mr = nullptr;
    if (caps.mr_local && r.size != 0) {
      mr = dev.endpoint().register_memory(r.local, r.size, r.op == OpKind::get ? FI_READ : FI_WRITE);
    }
    if (!dev.take_credit()) {
      net::close_mr(mr);
      dev.pool().put(p);
      return Status::make_retry(RetryReason::send_queue);
    }
    p->rma = RmaSingle{r.op, r.rank, r.size, r.local_comp, r.context, reinterpret_cast<net::Registration*>(mr)};
    p->ctx.set_kind(CtxKind::rma_single);  // release: after every field the completion reads
    void* desc = mr != nullptr ? fi_mr_desc(mr) : nullptr;
    ssize_t rc;
    if (r.op == OpKind::get) {
      rc = fi_read(ep, r.local, r.size, desc, to, addr, r.remote.key, p->ctx.backend);
    } else if (r.notify) {
      rc = fi_writedata(ep, r.local, r.size, desc, r.notify_data, to, addr, r.remote.key, p->ctx.backend);
    } else {
      rc = fi_write(ep, r.local, r.size, desc, to, addr, r.remote.key, p->ctx.backend);
    }
    if (rc == 0) return Status::make_posted();
    dev.return_credit();
    net::close_mr(mr);
    dev.pool().put(p);
    if (rc == -FI_EAGAIN) return Status::make_retry(RetryReason::provider);
    throw Error(net::fi_error(r.op == OpKind::get ? "fi_read" : "fi_write", rc) + " to rank " + std::to_string(r.rank));
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
  try {
    if (caps.mr_local) op->mr = dev.endpoint().register_memory(r.local, r.size, r.op == OpKind::get ? FI_READ : FI_WRITE);
  } catch (...) {
    delete op;
    throw;
  }
  add_chunks(op->chunks, op, CtxKind::rma_chunk, r.local, op->mr != nullptr ? fi_mr_desc(op->mr) : nullptr, r.size,
             addr, r.remote.key, caps.max_msg_size);
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
  if (caps_.cq_data_size < 4) {
    throw Error("post_put: notify needs 4 bytes of remote CQ data; provider " + caps_.provider + " offers " +
                str(caps_.cq_data_size));
  }
  std::uint64_t data = (static_cast<std::uint64_t>(a.notify_target.id) << 16) | a.notify_tag;
  if (!caps_.source) data |= static_cast<std::uint64_t>(runtime_.rank()) << 32;
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
  r->mr = endpoint_.register_memory(data, size, FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE);
  return MemoryRegion(std::move(r));
}

// ---- progress ---------------------------------------------------------------------------------

void DeviceImpl::repost() {
  fid_ep* ep = endpoint_.ep();
  while (posted_recvs_ < config_.prepost) {
    Packet* p = pool_->get();
    if (p == nullptr) return;  // the pool is dry: try again on the next progress
    p->ctx.set_kind(CtxKind::recv_packet);
    const ssize_t rc = fi_recv(ep, p->data(), config_.packet_size, pool_desc_, FI_ADDR_UNSPEC, p->ctx.backend);
    if (rc != 0) {
      pool_->put(p);
      if (rc != -FI_EAGAIN) {
        FERRY_LOG_AT(error, runtime_.rank(), index_, "%s", net::fi_error("fi_recv", rc).c_str());
      }
      return;
    }
    ++posted_recvs_;
  }
}

void DeviceImpl::on_error(const fi_cq_err_entry& e) {
  auto* ctx = static_cast<OpContext*>(e.op_context);
  const int err = -static_cast<int>(e.err);
  if (ctx == nullptr) {
    FERRY_LOG_AT(error, runtime_.rank(), index_, "error completion %s", fi_strerror(static_cast<int>(e.err)));
    return;
  }
  switch (ctx->kind()) {
    case CtxKind::recv_packet: {
      auto* p = reinterpret_cast<Packet*>(ctx);
      --posted_recvs_;
      if (e.err != FI_ECANCELED) {
        FERRY_LOG_AT(error, runtime_.rank(), index_, "receive failed: %s", fi_strerror(static_cast<int>(e.err)));
      }
      pool_->put(p);
      return;
    }
    case CtxKind::send_packet: {
      // An eager send already returned done: the caller cannot be told, so say it loudly.
      auto* packet = reinterpret_cast<Packet*>(ctx);
      const EagerSend* p = &packet->send;
      return_credit();
      FERRY_LOG_AT(error, runtime_.rank(), index_, "a send to rank %d failed: %s", p->rank,
                   fi_strerror(static_cast<int>(e.err)));
      pool_->put(packet);
      return;
    }
    case CtxKind::rma_single: {
      auto* p = reinterpret_cast<Packet*>(ctx);
      const RmaSingle op = p->rma;
      return_credit();
      net::close_mr(reinterpret_cast<fid_mr*>(op.mr));
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
      auto* chunk = reinterpret_cast<Chunk*>(ctx);
      auto* op = static_cast<RmaOp*>(chunk->owner);
      return_credit();
      op->error = err;
      if (++op->completed == op->chunks.size()) finish_rma_op(*this, op);
      return;
    }
    case CtxKind::rdv_read: {
      auto* chunk = reinterpret_cast<Chunk*>(ctx);
      auto* op = static_cast<RecvOp*>(chunk->owner);
      return_credit();
      op->error = err;
      FERRY_LOG_AT(error, runtime_.rank(), index_, "rendezvous read from rank %d failed: %s", op->rank,
                   fi_strerror(static_cast<int>(e.err)));
      if (++op->completed == op->chunks.size() && op->issued == op->chunks.size()) finish_recv_op(*this, op);
      return;
    }
  }
}

bool DeviceImpl::progress() {
  if (!poll_lock_.try_lock()) return false;
  std::lock_guard<SpinLock> guard(poll_lock_, std::adopt_lock);
  fi_cq_data_entry entries[kPollBatch];
  fi_addr_t sources[kPollBatch];
  bool any = false;
  const ssize_t n = caps_.source ? fi_cq_readfrom(endpoint_.cq(), entries, kPollBatch, sources)
                                 : fi_cq_read(endpoint_.cq(), entries, kPollBatch);
  if (n > 0) {
    any = true;
    for (ssize_t i = 0; i < n; ++i) {
      const fi_cq_data_entry& e = entries[i];
      if ((e.flags & FI_REMOTE_CQ_DATA) != 0 && (e.flags & FI_REMOTE_WRITE) != 0) {
        on_notification(e, sources[i]);
        // Only under FI_RX_CQ_DATA does such a write consume a posted receive and carry its
        // context; otherwise op_context is the provider's own value (shm reports message ids
        // there) and must not be taken for a packet.
        if (caps_.rx_cq_data && e.op_context != nullptr) {
          --posted_recvs_;
          pool_->put(reinterpret_cast<Packet*>(e.op_context));
        }
        continue;
      }
      auto* ctx = static_cast<OpContext*>(e.op_context);
      if (ctx == nullptr) continue;
      switch (ctx->kind()) {
        case CtxKind::recv_packet:
          on_recv(reinterpret_cast<Packet*>(ctx), e, sources[i]);
          break;
        case CtxKind::send_packet:
          return_credit();
          pool_->put(reinterpret_cast<Packet*>(ctx));
          break;
        case CtxKind::rma_single: {
          auto* p = reinterpret_cast<Packet*>(ctx);
          const RmaSingle op = p->rma;
          return_credit();
          net::close_mr(reinterpret_cast<fid_mr*>(op.mr));
          Completion c;
          c.op = op.op;
          c.rank = op.rank;
          c.size = op.size;
          c.context = op.context;
          pool_->put(p);
          signal_local(op.local, std::move(c));
          break;
        }
        case CtxKind::rma_chunk: {
          auto* op = static_cast<RmaOp*>(reinterpret_cast<Chunk*>(ctx)->owner);
          return_credit();
          if (++op->completed == op->chunks.size()) {
            finish_rma_op(*this, op);
          } else if (op->notify && op->issued < op->chunks.size()) {
            issue_rma(*this, op);  // the notifying chunk may be due now
          }
          break;
        }
        case CtxKind::rdv_read: {
          auto* op = static_cast<RecvOp*>(reinterpret_cast<Chunk*>(ctx)->owner);
          return_credit();
          if (++op->completed == op->chunks.size() && op->issued == op->chunks.size()) finish_recv_op(*this, op);
          break;
        }
      }
    }
  } else if (n == -FI_EAVAIL) {
    fi_cq_err_entry err{};
    if (fi_cq_readerr(endpoint_.cq(), &err, 0) > 0) {
      any = true;
      on_error(err);
    }
  }
  run_deferred();
  // Relaxed: a stale zero only leaves the backlog to the next post or progress call.
  if (backlog_count_.load(std::memory_order_relaxed) != 0) flush_backlog();
  // Reposting costs one provider call per buffer. A poll that found work leaves it to the next
  // idle poll, so a reply is not held up by buffer bookkeeping (in a ping-pong the refill runs
  // while the peer computes its answer); at or below half the target it refills at once, so a
  // flood that never lets the device idle cannot drain the posted receives.
  if (posted_recvs_ < config_.prepost && (!any || posted_recvs_ <= config_.prepost / 2)) repost();
  return any;
}

std::size_t DeviceImpl::in_flight() const noexcept {
  return open_ops_.load(std::memory_order_relaxed) +
         (credits_max_ - static_cast<std::size_t>(credits_.load(std::memory_order_relaxed))) +
         deferred_count_.load(std::memory_order_relaxed) + backlog_count_.load(std::memory_order_relaxed);
}

}  // namespace ferry::detail
