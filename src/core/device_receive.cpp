// device_receive.cpp — the receive path: progress and its polls, the inline sink, every
// transport event's dispatch, arrived messages (staged active messages, matching, fragments'
// wholes), receive buffers and spare packets. One translation unit so that the always_inline
// steps (signal_inline, on_lent, lent_packet, on_recv, fill_am, on_am) stay inlined into their
// callers.
#include "core/device.hpp"

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <typeinfo>
#include <utility>

#include "common/log.hpp"
#include "common/small_copy.hpp"
#include "core/recv_blocks.hpp"
#include "core/wire.hpp"

namespace ferry::detail {

namespace {

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

// ---- arrived messages ----------------------------------------------------------------------

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

// `payload`: where a fragment's payload bytes are (in the packet, or lent by the transport).
// Always inlined into progress(): with the keepalive's mark, GCC 12 stopped inlining it, and
// the call cost 15 instructions per 8 B active message over ferry's shm (callgrind-am.sh:
// receiver 606.9 without the mark, 622.0 with it out of line, 610.9 inlined).
// kFits: the caller has checked length <= p->capacity (on_lent, before copying).
template <bool kFits>
[[gnu::always_inline]] inline void DeviceImpl::on_recv(Link& l, Packet* p, std::size_t length, const unsigned char* payload) {
  // The header comes from another process: its kind and sender are checked before use (the
  // sender indexes the route table).
  // min_length covers the kind and the header (every packet is longer than a header, so src
  // reads the packet's own bytes even when the message is shorter; then it is not used).
  const std::int32_t src = decode<WireHeader>(p->data()).src;
  // A rank reached through another transport cannot have sent this: its name is false.
  if ((!kFits && length > p->capacity) || length < min_length(p->data()[0]) ||
      static_cast<std::uint32_t>(src) >= static_cast<std::uint32_t>(size_) || route_[static_cast<std::size_t>(src)] != &l) {
    drop_malformed(p, length);
    return;
  }
  note_sender(l, src);
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

// A lent message is still in memory its sender can write: the headers are copied into the
// packet first and checked there; only payload bytes are read from the loan. Inlined into
// progress, where nearly every message of a lent transport comes.
[[gnu::always_inline]] inline void DeviceImpl::on_lent(Link& l, std::size_t length, const unsigned char* lent) {
  const unsigned char* payload = nullptr;
  Packet* p = lent_packet(l, length, lent, payload);
  if (p != nullptr) on_recv<true>(l, p, length, payload);
}

// A spare packet holding a lent message's copy (a fragment's headers only: `payload` is then
// its payload in the loan, else in the packet), its length checked against the capacity. Null,
// the message dropped and counted, when it is too long, when its kind changed while it was
// read, or when the transport lent past set_lend_limit.
[[gnu::always_inline]] inline Packet* DeviceImpl::lent_packet(Link& l, std::size_t length, const unsigned char* lent,
                                                              const unsigned char*& payload) {
  if (__builtin_expect(spare_count_ == 0, 0)) {  // a transport that lent past set_lend_limit
    FERRY_LOG_AT(error, rank_, index_, "%s lent a message of %zu bytes past its limit: dropped", l.caps->name.c_str(), length);
    count_malformed();
    return nullptr;
  }
  Packet* p = spare_[static_cast<std::size_t>(--spare_count_)];
  payload = p->data() + kFragmentHeader;
  if (__builtin_expect(length > p->capacity, 0)) {
    drop_malformed(p, length);  // nothing copied
    return nullptr;
  }
  if (length >= kFragmentHeader && lent[0] == static_cast<std::uint8_t>(MsgKind::frag)) {
    // Only the headers: the payload goes from the loan to the message being gathered.
    std::memcpy(p->data(), lent, kFragmentHeader);
    payload = lent + kFragmentHeader;
    // The kind byte was read twice; if the sender changed it between, the packet is dropped.
    if (p->data()[0] != static_cast<std::uint8_t>(MsgKind::frag)) {
      drop_malformed(p, length);
      return nullptr;
    }
  } else {
    copy_small(p->data(), lent, length);
  }
  return p;
}

void DeviceImpl::drop_malformed(Packet* p, std::size_t length) noexcept {
  const std::int32_t src = length >= kHeader ? decode<WireHeader>(p->data()).src : -1;
  FERRY_LOG_AT(warn, rank_, index_, "dropped a malformed packet of %zu bytes (from rank %d, said the packet)", length, src);
  count_malformed();
  pool_->put(p);
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
  // Built in place: the slot's buffer is empty, so assigning a new one (a reset check, then a
  // temporary's fields copied and cleared) would be wasted work.
  if (__builtin_expect(static_cast<bool>(c.buffer), 0)) c.buffer.reset();
  std::destroy_at(&c.buffer);
  std::construct_at(&c.buffer, p->data() + kHeader, c.size, &release_am_payload, pool_.get());
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
    case MsgKind::atomic:
      atomics_.on_request(p);
      return;
    case MsgKind::atomic_reply:
      atomics_.on_reply(p);
      return;
  }
}

// ---- the inline sink ----------------------------------------------------------------------
// After on_recv: GCC 12 left on_recv<true> out of line (20 instructions per message,
// results/callgrind-am-20261202) when its first use came before the template's definition.

// on_inline's fast path: a well-formed active message for an object that takes messages one at
// a time (a Handler) is signalled straight from here, without the stage; its packet, unless
// the handler kept the payload, returns to the pool once the handler (and its answer) is done.
// False, with nothing changed, for anything else: the general path then takes it (and drops a
// malformed one with its warning). `lent`: p is a spare packet holding a lent message's copy,
// not a posted receive.
// Inlined into on_inline, its only caller: one call and frame less per message.
[[gnu::always_inline]] inline bool DeviceImpl::signal_inline(Link& l, Packet* p, std::size_t length, bool lent) {
  if (length < kHeader || length > p->capacity || p->data()[0] != static_cast<std::uint8_t>(MsgKind::am)) return false;
  const auto h = decode<WireHeader>(p->data());
  if (h.src < 0 || h.src >= size_ || route_[static_cast<std::size_t>(h.src)] != &l) return false;
  note_sender(l, h.src);
  CompletionObject* const target = targets_.exposed_at_once(h.target);
  if (target == nullptr) return false;  // not exposed yet, or one that batches
  if (!lent) --l.posted_recvs;
  p->arrived.length = static_cast<std::uint32_t>(length);
  Completion& c = staged_[0];  // the stage is empty: its first slot is free
  fill_am(c, p, h);
  target->signal(std::move(c));
  c.buffer.reset();
  return true;
}

// A message a transport delivers from inside its poll (Caps::delivers_inline): the poll's
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
      // Copied into a spare packet (the transport lends no more per poll than the device has
      // spares), then the same fast path as a posted receive's packet.
      const unsigned char* payload = nullptr;
      Packet* p = d->lent_packet(l, e.length, e.lent, payload);
      if (p == nullptr) return;
      if (d->staged_count_ == 0 && d->signal_inline(l, p, e.length, true)) return;
      d->on_recv<true>(l, p, e.length, payload);
    } else {
      auto* p = reinterpret_cast<Packet*>(e.context);
      if (d->staged_count_ == 0 && d->signal_inline(l, p, e.length, false)) return;
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

// ---- progress ---------------------------------------------------------------------------------

int DeviceImpl::top_up_spares() noexcept {
  // Short only when the pool is dry: a lent message then waits in its transport meanwhile.
  spare_count_ += static_cast<int>(pool_->get_many(spare_.data() + spare_count_,
                                                   static_cast<std::size_t>(spare_target_ - spare_count_)));
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
  bool lends = false;
  for (Link& l : links_) {
    lends = lends || l.lends;
    if (!l.lends && l.posted_recvs < config_.prepost && (!any || l.posted_recvs <= config_.prepost / 2)) repost(l);
  }
  // Spare packets are refilled here too, as posted receives are, not only before the next
  // poll: the packets this poll's events returned (a send to this rank completes only once its
  // loan ends, a poll after it was lent) then go to the spares before the caller's next post
  // can take them. Left to the next poll, a thread that alternates posting and progress took
  // each one back for a send to its own rank, which waits for a spare to be lent: with a tiny
  // pool no spare was left and nothing moved again (mp_ucx_sm_backpressure).
  if (lends && spare_count_ < spare_target_) (void)top_up_spares();
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
  // (that would be inside the next message's delivery, before its handler runs). ferry's own
  // queue moves every completion (one type check per batch saves a pass over the stage).
  if (typeid(*target) == typeid(CompletionQueue)) return;
  for (std::uint32_t i = 0; i < n; ++i) {
    if (staged_[i].buffer) staged_[i].buffer.reset();  // one a signal() did not take
  }
}

}  // namespace ferry::detail
