#include "core/device.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include "common/log.hpp"
#include "common/small_copy.hpp"
#include "core/recv_blocks.hpp"
#include "core/wire.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {

namespace {

constexpr std::size_t kMaxSize = std::size_t{1} << 62;  // beyond this, size arithmetic is suspect

std::string str(std::size_t v) { return std::to_string(v); }

// Returns the packet behind an active-message payload handed to the caller.
void release_am_payload(void* pool, void* payload) noexcept {
  static_cast<PacketPool*>(pool)->put(Packet::from_data(static_cast<unsigned char*>(payload) - kHeader));
}

void release_malloc(void*, void* data) noexcept { std::free(data); }

// The payload of `b` in heap memory, b's own memory released; b itself if memory is short.
[[gnu::cold, gnu::noinline]] Buffer copy_out(Buffer&& b) noexcept {
  void* heap = std::malloc(b.size() != 0 ? b.size() : 1);
  if (heap == nullptr) return std::move(b);
  if (b.size() != 0) std::memcpy(heap, b.data(), b.size());
  return Buffer(heap, b.size(), &release_malloc, nullptr);
}

}  // namespace

RegionImpl::~RegionImpl() {
  for (auto& [transport, registration] : registrations) transport->deregister(registration);
}


// ---- setup ----------------------------------------------------------------------------

DeviceImpl::DeviceImpl(const DeviceParts& parts, int index, const Config& config,
                       std::vector<std::unique_ptr<net::Transport>> transports, const std::vector<int>& route)
    : DeviceContext(parts, index, config, std::move(transports), route),
      recv_descriptors_(std::make_unique<PacketPool>(config.recv_descriptors, 64)),
      fragments_(*this),
      rendezvous_(*this),
      rma_(*this) {
  spare_target_ = static_cast<int>(std::min<std::size_t>(config.prepost, kPollBatch));
  for (Link& l : links_) (void)l.transport->deliver_inline(net::InlineSink{&DeviceImpl::on_inline, this, &l});
}

// on_inline's fast path: a well-formed active message for an object that takes messages one at
// a time (a Handler) is signalled straight from here, without the stage; its packet, unless
// the handler kept the payload, returns to the pool once the handler (and its answer) is done.
// False, with nothing changed, for anything else: the general path then takes it (and drops a
// malformed one with its warning).
// Inlined into on_inline, its only caller: one call and frame less per message.
[[gnu::always_inline]] inline bool DeviceImpl::signal_inline(Link& l, Packet* p, std::size_t length) {
  if (length < kHeader || length > p->capacity || p->data()[0] != static_cast<std::uint8_t>(MsgKind::am)) return false;
  const auto h = decode<WireHeader>(p->data());
  if (h.src < 0 || h.src >= size_ || route_[static_cast<std::size_t>(h.src)] != &l) return false;
  CompletionObject* const target = targets_.exposed_at_once(h.target);
  if (target == nullptr) return false;  // not exposed yet, or one that batches
  --l.posted_recvs;
  p->arrived.length = static_cast<std::uint32_t>(length);
  Completion& c = staged_[0];  // the stage is empty: its first slot is free
  fill_am(c, p, h);
  target->signal(std::move(c));
  c.buffer.reset();
  return true;
}

// A message a transport delivers from inside its poll (Transport::deliver_inline): the poll's
// fast path. An active message for an object that does not batch (a Handler) is signalled
// before the transport goes on, so a reply from the handler leaves inside the transport's
// callback; one for a CompletionQueue stays staged and goes with the rest of the poll's run.
// An exception must not unwind through the transport's (C) frames: it is kept, and progress
// rethrows it once the poll has returned.
void DeviceImpl::on_inline(void* device, void* link, const net::Event& e) noexcept {
  auto* d = static_cast<DeviceImpl*>(device);
  auto& l = *static_cast<Link*>(link);
  d->delivered_inline_ = true;
  d->inline_count_.store(d->inline_count_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  try {
    if (__builtin_expect(e.error != 0, 0)) {  // truncated: dropped and logged, as from the poll
      d->flush_staged();
      d->on_event(l, e);
      return;
    }
    if (e.lent != nullptr) {
      d->on_lent(l, e.length, e.lent);
    } else {
      auto* p = reinterpret_cast<Packet*>(e.context);
      if (d->staged_count_ == 0 && d->signal_inline(l, p, e.length)) return;
      --l.posted_recvs;
      d->on_recv(l, p, e.length, p->data() + kFragmentHeader);
    }
    if (d->staged_count_ != 0 && !d->staged_target_->batches()) d->flush_staged_slow();
  } catch (...) {
    if (d->inline_error_ == nullptr) {
      d->inline_error_ = std::current_exception();
    } else {
      d->log_dropped_inline_error();
    }
  }
}

// A second exception within one poll: progress rethrows only the first, so this one is said here.
void DeviceImpl::log_dropped_inline_error() noexcept {
  try {
    throw;
  } catch (const std::exception& e) {
    FERRY_LOG_AT(error, rank_, index_, "an exception while delivering a message (not rethrown: progress "
                 "rethrows the poll's first): %s", e.what());
  } catch (...) {
    FERRY_LOG_AT(error, rank_, index_, "an exception while delivering a message (not rethrown: progress "
                 "rethrows the poll's first), not a std::exception");
  }
}

DeviceImpl::~DeviceImpl() {
  // Cancel what the transports still hold, then give the packets back so the pool can go.
  for (Link& l : links_) l.transport->cancel_all();
  for (int i = 0; i < spare_count_; ++i) pool_->put_shared(spare_[static_cast<std::size_t>(i)]);
  matching_.drain([](Packet* r) { r->pool->put_shared(r); },
                  [](Packet* m) {
                    recv_blocks::give(m->arrived.heap);
                    m->pool->put_shared(m);
                  });
}

void DeviceImpl::start() {
  plan_fragments();
  std::lock_guard<SpinLock> guard(poll_lock_);
  for (Link& l : links_) {
    if (l.lends) {
      if (top_up_spares() == 0) throw Error("device " + std::to_string(index_) + ": no packet to receive into on " + l.caps->name);
      continue;
    }
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

std::string DeviceImpl::describe_peer(int rank) const {
  if (rank < 0 || static_cast<std::size_t>(rank) >= route_.size()) return "";
  return route_[static_cast<std::size_t>(rank)]->transport->describe_peer(rank);
}

// ---- checks -----------------------------------------------------------------------------

namespace {
void check_remote(const char* call, int rank, int device, const RemoteKey& key, std::size_t offset, std::size_t size);
}  // namespace

// The checks are inline compares; only the throwing halves are out of line (and cold), so
// the fast path pays a few predictable branches.
namespace {

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
  if (__builtin_expect(rank < 0 || rank >= size_, 0)) throw_rank(call, rank, size_);
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
  if (__builtin_expect(id >= targets_.max_targets(), 0)) throw_target(call, id, targets_.max_targets());
}

Status DeviceImpl::post_am(const AmArgs& a) {
  check(a);
  if (__builtin_expect(peer_down(a.rank), 0)) return Status::make_failed(a.rank);
  if (!fragments_.clear()) return Status::make_retry(RetryReason::transport);
  Link& l = link(a.rank);
  if (l.fragmented(a.size)) return fragments_.post(l, MsgKind::am, a.target.id, a.tag, a.rank, a.buffer, a.size);
  if (a.size > eager_limit_) {
    return rendezvous_.post(OpKind::am, a.rank, a.tag, a.target.id, a.buffer, a.size, a.local, a.context);
  }
  return post_eager(*this, l, MsgKind::am, a.target.id, a.tag, a.rank, a.buffer, a.size);
}

std::size_t DeviceImpl::iovec_eager_limit(std::size_t parts) const noexcept {
  const std::size_t overhead = kHeader + sizeof(RtsBody) + parts * sizeof(RtsPart);
  return overhead >= config_.packet_size ? 0 : config_.packet_size - overhead;
}

bool DeviceImpl::post_barrier_step(int rank, std::uint32_t step) {
  // Fragments waiting in the backlog go first, as before any post: a message sent before the
  // barrier then reaches its target before this step does (each link keeps order).
  if (!fragments_.clear()) return false;
  Packet* p = pool_->get();
  if (p == nullptr) return false;
  fill_header(p, MsgKind::barrier, 0, rank_, step);
  return !send_packet(p, rank, kHeader).is_retry();
}

Status DeviceImpl::post_send(const SendArgs& a) {
  check(a);
  if (__builtin_expect(peer_down(a.rank), 0)) return Status::make_failed(a.rank);
  if (!fragments_.clear()) return Status::make_retry(RetryReason::transport);
  Link& l = link(a.rank);
  if (l.fragmented(a.size)) return fragments_.post(l, MsgKind::msg, 0, a.tag, a.rank, a.buffer, a.size);
  if (a.size > eager_limit_) {
    return rendezvous_.post(OpKind::send, a.rank, a.tag, 0, a.buffer, a.size, a.local, a.context);
  }
  return post_eager(*this, l, MsgKind::msg, 0, a.tag, a.rank, a.buffer, a.size);
}

Status DeviceImpl::post_am_iovec(const AmIovecArgs& a) {
  const std::size_t total = check(a);
  if (peer_down(a.rank)) return Status::make_failed(a.rank);
  return rendezvous_.post_iovec(a, total);
}

// ---- receiving ---------------------------------------------------------------------------

Status DeviceImpl::post_recv(const RecvArgs& a) {
  check(a);
  const RecvDescriptor spec{{a.rank, a.tag}, a.buffer, a.size, a.local, a.context};
  // From a failed rank only a message that arrived before the failure can still match.
  const bool from_failed = a.rank != any_source && peer_down(a.rank);
  const auto res = matching_.add_recv(a.rank, a.tag, [&]() -> Packet* {
    if (from_failed) return nullptr;
    Packet* r = recv_descriptors_->get();
    if (r != nullptr) r->recv = spec;
    return r;
  });
  Packet* m = res.message;
  if (m == nullptr) {
    if (from_failed) return Status::make_failed(a.rank);
    if (res.queued == nullptr) return Status::make_retry(RetryReason::packet_pool);
    // Read after the matching lock (taken by fail_peer's sweep too): a receive queued for a
    // rank that failed meanwhile is failed here if the sweep ran before it was queued.
    if (__builtin_expect(a.rank != any_source && peer_down(a.rank), 0)) fail_recvs(a.rank);
    return Status::make_posted();
  }
  const auto h = decode<WireHeader>(m->data());
  if (h.kind == MsgKind::rts_msg) {
    rendezvous_.start_recv(m, &spec);
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

void DeviceImpl::fail_recvs(int rank) {
  matching_.take_recvs_from(rank, [&](Packet* r) {
    const RecvDescriptor d = r->recv;
    recv_descriptors_->put(r);
    Completion c;
    c.op = OpKind::recv;
    c.rank = rank;
    c.tag = d.want.tag;
    c.context = d.context;
    c.error = peer_failed_error;
    signal_local(d.local, std::move(c));
  });
}

void DeviceImpl::fail_peer(int rank) {
  for (Link& l : links_) l.transport->peer_failed(rank);
  fail_recvs(rank);
  rendezvous_.fail_peer(rank);
  fragments_.fail_peer(rank);
}

void DeviceImpl::check_failures() {
  failures_.check_peers();
  const std::uint32_t count = failures_.failure_count();
  if (count == failures_seen_) return;
  failures_seen_ = count;
  if (handled_.empty()) handled_.assign(static_cast<std::size_t>(size_), 0);
  for (int r = 0; r < size_; ++r) {
    if (handled_[static_cast<std::size_t>(r)] != 0 || !peer_down(r)) continue;
    handled_[static_cast<std::size_t>(r)] = 1;
    fail_peer(r);
  }
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

// A lent message is still in memory its sender can write: the headers are copied into the
// packet first and checked there; only payload bytes are read from the loan. Inlined into
// progress, where nearly every message of a lent transport comes.
[[gnu::always_inline]] inline void DeviceImpl::on_lent(Link& l, std::size_t length, const unsigned char* lent) {
  if (__builtin_expect(spare_count_ == 0, 0)) {  // a transport that lent past set_lend_limit
    FERRY_LOG_AT(error, rank_, index_, "%s lent a message of %zu bytes past its limit: dropped", l.caps->name.c_str(), length);
    count_malformed();
    return;
  }
  Packet* p = spare_[static_cast<std::size_t>(--spare_count_)];
  const unsigned char* payload = p->data() + kFragmentHeader;
  if (length > p->capacity) {
    length = p->capacity + 1;  // dropped by on_recv, nothing copied
  } else if (length >= kFragmentHeader && lent[0] == static_cast<std::uint8_t>(MsgKind::frag)) {
    // Only the headers: the payload goes from the loan to the message being gathered.
    std::memcpy(p->data(), lent, kFragmentHeader);
    payload = lent + kFragmentHeader;
    // The kind byte was read twice; if the sender changed it between, the packet is dropped.
    if (p->data()[0] != static_cast<std::uint8_t>(MsgKind::frag)) length = p->capacity + 1;
  } else {
    copy_small(p->data(), lent, length);
  }
  on_recv(l, p, length, payload);
}

// `payload`: where a fragment's payload bytes are (in the packet, or lent by the transport).
// Always inlined into progress(): with the keepalive's mark, GCC 12 stopped inlining it, and
// the call cost 15 instructions per 8 B active message over ferry's shm (callgrind-am.sh:
// receiver 606.9 without the mark, 622.0 with it out of line, 610.9 inlined).
[[gnu::always_inline]] inline void DeviceImpl::on_recv(Link& l, Packet* p, std::size_t length, const unsigned char* payload) {
  // The header comes from another process: its kind and sender are checked before use (the
  // sender indexes the route table).
  const std::int32_t src = length >= kHeader ? decode<WireHeader>(p->data()).src : -1;
  // A rank reached through another transport cannot have sent this: its name is false.
  if (length < kHeader || length > p->capacity || !valid_kind(p->data()[0]) || length < min_length(p->data()[0]) ||
      src < 0 || src >= size_ || route_[static_cast<std::size_t>(src)] != &l) {
    FERRY_LOG_AT(warn, rank_, index_, "dropped a malformed packet of %zu bytes (from rank %d, said the packet)",
                 length, src);
    count_malformed();
    pool_->put(p);
    return;
  }
  p->arrived.length = static_cast<std::uint32_t>(length);
  if (p->data()[0] == static_cast<std::uint8_t>(MsgKind::frag)) {
    const Fragments::Whole w = fragments_.on_fragment(p, length, payload);
    if (w.packet == nullptr) return;
    if (w.heap != nullptr) on_heap_message(w.packet, w.heap, w.size); else on_packet(w.packet);
    return;
  }
  if (p->data()[0] == static_cast<std::uint8_t>(MsgKind::am)) {
    on_am(p, decode<WireHeader>(p->data()));
    return;
  }
  on_packet(p);
}

// A tagged message (msg or rts_msg, its arrived.from set) meets its receive, or waits in the
// matching engine for one.
inline void DeviceImpl::match_message(Packet* p, MsgKind kind) {
  Packet* r = matching_.add_message(p);
  if (r == nullptr) return;  // unexpected: the packet waits in the matching engine
  const RecvDescriptor spec = r->recv;
  recv_descriptors_->put(r);
  if (kind == MsgKind::msg) deliver_message(spec, p); else rendezvous_.start_recv(p, &spec);
}

void DeviceImpl::on_heap_message(Packet* p, unsigned char* heap, std::size_t size) {
  flush_staged();
  const auto h = decode<WireHeader>(p->data());
  if (h.kind == MsgKind::am) {
    Completion c;
    c.op = OpKind::remote_am;
    c.rank = h.src;
    c.tag = h.tag;
    c.size = size;
    c.buffer = Buffer(heap, size, &recv_blocks::release, nullptr);
    pool_->put(p);
    targets_.deliver(h.target, std::move(c));
    return;
  }
  p->arrived = ArrivedMessage{static_cast<std::uint32_t>(kHeader), MatchKey{h.src, h.tag}, heap, size};
  match_message(p, MsgKind::msg);
}

// c: a fresh completion, or a stage slot another batch has moved from (its buffer empty, its
// parts empty or, in principle, merely valid: cleared here).
[[gnu::always_inline]] inline void DeviceImpl::fill_am(Completion& c, Packet* p, const WireHeader& h) {
  c.op = OpKind::remote_am;
  c.rank = h.src;
  c.tag = h.tag;
  c.size = p->arrived.length - kHeader;
  c.context = nullptr;
  c.error = 0;
  c.buffer = Buffer(p->data() + kHeader, c.size, &release_am_payload, pool_.get());
  if (__builtin_expect(!c.parts.empty(), 0)) c.parts.clear();
  // A delivered payload keeps its packet until the application drops it. When the
  // application holds so many that the pool could not refill the posted receives, the
  // payload moves to the heap and the packet returns at once: otherwise a receiver that is
  // slow to consume (or is in finalize) would leave its device no receive buffers and every
  // sender to it retrying forever. Rare by construction; the common case is one load.
  if (__builtin_expect(pool_->available_approx() < config_.prepost, 0)) c.buffer = copy_out(std::move(c.buffer));
}

// An active message joins the stage, inline in on_recv: the common message takes no call.
[[gnu::always_inline]] inline void DeviceImpl::on_am(Packet* p, const WireHeader& h) {
  CompletionObject* target = targets_.exposed(h.target);
  if (__builtin_expect(target == nullptr, 0)) {  // not exposed yet, or an id out of range
    deliver_unexposed(p, h);
    return;
  }
  if (target != staged_target_ || staged_count_ == kStageMax) flush_staged();
  fill_am(staged_[staged_count_], p, h);
  staged_target_ = target;
  ++staged_count_;
}

void DeviceImpl::deliver_unexposed(Packet* p, const WireHeader& h) {
  flush_staged();
  Completion c;
  fill_am(c, p, h);
  targets_.deliver(h.target, std::move(c));  // parks it, or drops it with a warning
}

void DeviceImpl::on_packet(Packet* p) {
  const auto h = decode<WireHeader>(p->data());
  if (h.kind != MsgKind::am) flush_staged();  // whatever this message signals comes after the staged
  switch (h.kind) {
    case MsgKind::am:
      on_am(p, h);
      return;
    case MsgKind::msg:
    case MsgKind::rts_msg:
      p->arrived.from = MatchKey{h.src, h.tag};
      p->arrived.heap = nullptr;  // the payload, if any, follows the header
      match_message(p, h.kind);
      return;
    case MsgKind::rts_am:
    case MsgKind::rts_iovec:
      rendezvous_.start_recv(p, nullptr);
      return;
    case MsgKind::barrier:
      pool_->put(p);
      barrier_.arrived(h.src, h.tag);
      return;
    case MsgKind::frag:  // on_recv hands fragments to on_fragment, which never passes one on
      pool_->put(p);
      return;
    case MsgKind::fin:
      rendezvous_.on_fin(p);
      return;
  }
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

// Checks a put's notification and returns its remote CQ data (0 without notification).
std::uint64_t DeviceImpl::notify_data(const PutArgs& a) const {
  if (!a.notify) return 0;
  if (a.notify_target.id >= targets_.max_targets()) {
    throw Error("post_put: notify_target=" + std::to_string(a.notify_target.id) + " is out of range; FERRY_MAX_TARGETS=" +
                str(targets_.max_targets()));
  }
  if (a.notify_tag > 0xFFFF) throw Error("post_put: notify_tag=" + std::to_string(a.notify_tag) + " is out of range 0..65535");
  const net::Caps& caps = *route_[static_cast<std::size_t>(a.rank)]->caps;
  if (caps.remote_data_bytes < 4) {
    throw Error("post_put: notify needs 4 bytes of remote data; transport " + caps.name + " offers " +
                str(caps.remote_data_bytes));
  }
  std::uint64_t data = (static_cast<std::uint64_t>(a.notify_target.id) << 16) | a.notify_tag;
  if (caps.remote_data_bytes >= 8) data |= static_cast<std::uint64_t>(rank_) << 32;
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
  if (__builtin_expect(peer_down(a.rank), 0)) return Status::make_failed(a.rank);
  return rma_.post(RmaRequest{OpKind::put, a.rank, static_cast<unsigned char*>(const_cast<void*>(a.buffer)), a.size,
                                    a.remote, a.offset, a.local, a.context, a.notify, data});
}

Status DeviceImpl::post_get(const GetArgs& a) {
  check(a);
  if (__builtin_expect(peer_down(a.rank), 0)) return Status::make_failed(a.rank);
  if (a.size == 0) return Status::make_done();
  return rma_.post(RmaRequest{OpKind::get, a.rank, static_cast<unsigned char*>(a.buffer), a.size, a.remote, a.offset,
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

int DeviceImpl::top_up_spares() noexcept {
  while (spare_count_ < spare_target_) {
    Packet* p = pool_->get();
    if (p == nullptr) break;  // the pool is dry: a lent message waits in its transport meanwhile
    spare_[static_cast<std::size_t>(spare_count_++)] = p;
  }
  return spare_count_;
}

void DeviceImpl::repost(Link& l) {
  while (l.posted_recvs < config_.prepost) {
    Packet* p = pool_->get();
    if (p == nullptr) return;  // the pool is dry: try again on the next progress
    p->ctx.set_kind(CtxKind::recv_packet);
    const int rc = l.transport->post_recv(p->data(), config_.packet_size, l.pool_desc, &p->ctx);
    if (rc != 0) {
      pool_->put(p);
      if (rc != -EAGAIN) FERRY_LOG_AT(error, rank_, index_, "%s", net::error_text("post_recv", rc).c_str());
      return;
    }
    ++l.posted_recvs;
  }
}

// Every event of every transport comes here, success and error alike: each kind of operation
// finishes in one place, with the error (if any) carried to whoever waits for it.
void DeviceImpl::on_event(Link& l, const net::Event& e) {
  if (e.lent != nullptr) {
    on_lent(l, e.length, e.lent);
    return;
  }
  if (e.remote_write) {
    if (e.error == 0) rma_.on_notification(e);
    // Only where a remote write uses up a posted receive does it carry that receive's packet.
    if (e.context != nullptr) {
      --l.posted_recvs;
      pool_->put(reinterpret_cast<Packet*>(e.context));
    }
    return;
  }
  OpContext* ctx = OpContext::of(e.context);
  const int err = e.error;
  switch (ctx->kind()) {
    case CtxKind::recv_packet: {
      auto* p = reinterpret_cast<Packet*>(ctx);
      --l.posted_recvs;
      if (err == 0) {
        on_recv(l, p, e.length, p->data() + kFragmentHeader);
        return;
      }
      if (err != -ECANCELED) {
        FERRY_LOG_AT(error, rank_, index_, "%s", net::error_text("receive", err).c_str());
      }
      pool_->put(p);
      return;
    }
    case CtxKind::send_packet: {
      auto* p = reinterpret_cast<Packet*>(ctx);
      return_credit();
      if (__builtin_expect(err != 0, 0)) {
        // An eager send already returned done: the caller cannot be told, so say it loudly.
        // To a failed peer that is expected, and the failure itself was reported once.
        if (peer_gone_error(err)) failures_.peer_failed(p->send.rank, net::error_text("send", err));
        if (!peer_down(p->send.rank)) {
          FERRY_LOG_AT(error, rank_, index_, "a send to rank %d failed: %s", p->send.rank,
                       net::error_text("send", err).c_str());
        }
      }
      // An abandoned packet never returns to the pool: the transport may still hold its context.
      if (!e.abandoned) pool_->put(p);
      return;
    }
    case CtxKind::rma_single:
      rma_.on_single(reinterpret_cast<Packet*>(ctx), l.transport, err, e.abandoned);
      return;
    case CtxKind::rma_chunk:
      rma_.on_chunk(reinterpret_cast<Chunk*>(ctx), err, e.abandoned);
      return;
    case CtxKind::rdv_read:
      rendezvous_.on_read(reinterpret_cast<Chunk*>(ctx), err, e.abandoned);
      return;
  }
}

namespace {

// The devices whose progress the calling thread is inside, innermost first: a chain of frames
// on its stack (a handler may progress another device). Two stores per progress call; read
// only by progressing_here.
struct ProgressFrame {
  const DeviceImpl* device;
  const ProgressFrame* outer;
};
[[gnu::tls_model("initial-exec")]] thread_local const ProgressFrame* tls_progress = nullptr;

class EnterProgress {
 public:
  explicit EnterProgress(const DeviceImpl* device) noexcept : frame_{device, tls_progress} { tls_progress = &frame_; }
  ~EnterProgress() { tls_progress = frame_.outer; }
  EnterProgress(const EnterProgress&) = delete;
  EnterProgress& operator=(const EnterProgress&) = delete;

 private:
  ProgressFrame frame_;
};

}  // namespace

bool DeviceImpl::progressing_here() const noexcept {
  for (const ProgressFrame* f = tls_progress; f != nullptr; f = f->outer) {
    if (f->device == this) return true;
  }
  return false;
}

bool DeviceImpl::progress() {
  if (!poll_lock_.try_lock()) return false;
  std::lock_guard<SpinLock> guard(poll_lock_, std::adopt_lock);
  const EnterProgress frame(this);
  // Uninitialized: a transport writes every field of the events it returns (Transport::poll).
  // Zeroing kPollBatch events (~900 bytes) cost ~46 instructions on every call, idle ones
  // included. The byte array's lifetime creates the events implicitly (Event is an aggregate).
  alignas(net::Event) std::byte event_bytes[sizeof(net::Event) * kPollBatch];
  net::Event* const events = std::launder(reinterpret_cast<net::Event*>(event_bytes));
  bool any = false;
  delivered_inline_ = false;
  // Rendezvous reads start here, before the poll, and only here: a synchronous get's
  // completion is then in this call's poll, so the application can return its receive block
  // before the next read takes one (see Rendezvous::kReadBudget).
  rendezvous_.begin_reads();
  run_deferred();
  rendezvous_.end_reads();
  for (Link& l : links_) {
    if (l.lends) l.transport->set_lend_limit(spare_count_ < spare_target_ ? top_up_spares() : spare_count_);
    const int n = l.transport->poll(events, kPollBatch);
    for (int i = 0; i < n; ++i) {
      const net::Event& e = events[i];
      // The common event, an arrived message, skips the general dispatch.
      if (e.lent != nullptr) {
        on_lent(l, e.length, e.lent);
      } else if (__builtin_expect(!e.remote_write && e.error == 0 && OpContext::of(e.context)->kind() == CtxKind::recv_packet, 1)) {
        auto* p = reinterpret_cast<Packet*>(e.context);
        --l.posted_recvs;
        on_recv(l, p, e.length, p->data() + kFragmentHeader);
      } else {
        flush_staged();
        on_event(l, e);
      }
    }
    flush_staged();
    any = any || n > 0;
    // After the poll's events, which would be lost otherwise.
    if (__builtin_expect(inline_error_ != nullptr, 0)) std::rethrow_exception(std::exchange(inline_error_, nullptr));
  }
  any = any || delivered_inline_;
  // One increment and one test per call; the peer check (a clock read) every 1024 calls. After
  // the poll, so what a failed peer sent before it died is taken in before its operations fail.
  const std::uint32_t calls = ++progress_calls_;
  if (__builtin_expect((calls & 1023) == 0, 0) || failures_.failure_count() != failures_seen_) check_failures();
  run_deferred();
  // Relaxed: a stale zero only leaves the backlog to the next post or progress call.
  if (fragments_.backlog() != 0) fragments_.flush();
  // Reposting costs one transport call per buffer. A poll that found work leaves it to the
  // next idle poll, so a reply is not held up by buffer bookkeeping (in a ping-pong the refill
  // runs while the peer computes its answer); at or below half the target it refills at once,
  // so a flood that never lets the device idle cannot drain the posted receives.
  for (Link& l : links_) {
    if (!l.lends && l.posted_recvs < config_.prepost && (!any || l.posted_recvs <= config_.prepost / 2)) repost(l);
  }
  return any;
}

void DeviceImpl::flush_staged_slow() noexcept {
  // Emptied before signalling, though nothing can stage meanwhile: a Handler's callback may
  // call progress, but the poll lock is a try-lock, so progress is not re-entered.
  CompletionObject* target = staged_target_;
  const std::uint32_t n = staged_count_;
  staged_target_ = nullptr;
  staged_count_ = 0;
  target->signal_batch(staged_.data(), n);
  // A payload a handler did not keep returns its packet now, not when the slot is next filled
  // (that would be inside the next message's delivery, before its handler runs).
  for (std::uint32_t i = 0; i < n; ++i) staged_[i].buffer.reset();
}

std::size_t DeviceImpl::in_flight() const noexcept { return context_in_flight() + fragments_.backlog(); }

}  // namespace ferry::detail
