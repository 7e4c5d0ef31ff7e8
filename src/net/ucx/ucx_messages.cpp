// ucx_messages.cpp — the UCX transport's message path: inject and send as eager active
// messages (an inject that cannot go inline from the bounce pool), the data callback that
// lends each arrived message to the core's sink or holds it, messages to this rank through the
// loopback ring, and poll, which drives the worker, lends what waits and hands out events.
// Kept in one file so the per-message path compiles as one unit with the inline helpers of
// ucx_transport.hpp.
#include "net/ucx/ucx_transport.hpp"

namespace ferry::net::ucx {

int UcxTransport::inject(int rank, const void* buf, std::size_t len) {
  if (__builtin_expect(rank == rank_, 0)) return loop_inject(buf, len);
  const PostHold hold(*this, rank);
  ucp_ep_h ep = hold.get();
  if (__builtin_expect(ep == nullptr, 0)) {
    if (const int rc = reach_held(rank, ep); rc != 0) return rc;
  }
  ucp_request_param_t p;
  p.op_attr_mask = UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL | UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_EAGER;
  void* r = ucp_am_send_nbx(ep, kAmData, nullptr, 0, buf, len, &p);
  if (__builtin_expect(r == nullptr, 1)) return 0;
  if (UCS_PTR_STATUS(r) != UCS_ERR_NO_RESOURCE) return to_errno(UCS_PTR_STATUS(r));
  // Not inline: from a bounce buffer the send's callback returns.
  unsigned char* slot = nullptr;
  if (len > kInjectSize || (slot = bounce_copy(buf, len)) == nullptr) return -EAGAIN;
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = &UcxTransport::on_bounce_sent;
  p.user_data = slot;
  r = ucp_am_send_nbx(ep, kAmData, nullptr, 0, slot + kBounceHead, len, &p);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) {
    free_bounce_.try_push(slot);
    return r == nullptr ? 0 : to_errno(UCS_PTR_STATUS(r));
  }
  return 0;
}

int UcxTransport::send(int rank, const void* buf, std::size_t len, void*, OpContext* ctx) {
  if (__builtin_expect(rank == rank_, 0)) return loop_send(buf, len, ctx);
  const PostHold hold(*this, rank);
  ucp_ep_h ep = hold.get();
  if (__builtin_expect(ep == nullptr, 0)) {
    if (const int rc = reach_held(rank, ep); rc != 0) return rc;
  }
  ucp_request_param_t p = tracked(ctx, rank, op_send);
  p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_EAGER;
  return posted(ctx, rank, ucp_am_send_nbx(ep, kAmData, nullptr, 0, buf, len, &p));
}

int UcxTransport::poll(Event* events, int max) {
  lend_left_ = lend_limit();
  if (__builtin_expect(rma_.busy(), 0)) {
    {
      const detail::BiasedGuard guard(lock_);
      release_lent();  // before any return: the previous poll's loans end with this poll
    }
    const int n = rma_.abandon(events, max);
    if (n > 0) return n;
  }
  {
    const detail::BiasedGuard guard(lock_);
    release_lent();  // before the callback runs: it lends only while nothing is held
    UcxTransport* const outer = progressing_;
    progressing_ = this;  // the data callback lends to the sink only inside this call
    ucp_worker_progress(worker_);
    progressing_ = outer;
    if (__builtin_expect(!replies_.empty(), 0)) send_replies();
    if (__builtin_expect(answers_waiting_.load(std::memory_order_acquire), 0)) send_answers();
  }
  if (__builtin_expect(!pushes_.empty(), 0)) serve_pushes();
  int n = 0;
  // Held messages oldest first (arrival order, the order sent per sender), then messages to
  // this rank, within what is left of the lend budget; the rest wait for a later poll.
  while (n < max && lend_left_ > 0 && held_lent_ < held_.size()) {
    const Held& h = held_[held_lent_++];
    events[n++] = lent_event(h.data, h.length, -1);
    --lend_left_;
  }
  Loop m;
  // An empty ring: two loads of lines only pushes write.
  while (n < max && lend_left_ > 0 && loop_lent_.size() < loop_lent_.capacity() && loopback_.try_pop(m)) {
    loop_lent_.push_back(m);  // within the reserved room: no allocation
    events[n++] = lent_event(m.data, m.length, rank_);
    --lend_left_;
  }
  while (n < max && events_.try_pop(events[n])) {
    if (settled(events[n])) ++n;
  }
  if (__builtin_expect(overflowing_.load(std::memory_order_acquire), 0) && n < max) {
    std::lock_guard<detail::SpinLock> g(overflow_lock_);
    std::size_t i = 0;
    while (n < max && i < overflow_.size()) {
      events[n] = overflow_[i++];
      if (settled(events[n])) ++n;
    }
    overflow_.erase(overflow_.begin(), overflow_.begin() + static_cast<std::ptrdiff_t>(i));
    if (overflow_.empty()) overflow_flag_clear();
  }
  return n;
}

void UcxTransport::cancel_all() noexcept {
  const detail::BiasedGuard guard(lock_);
  cancel_all_held();
}

void UcxTransport::cancel_all_held() noexcept {
  // Messages that arrive from now on are dropped: the core takes no more.
  receiving_ = false;
  release_lent();
  while (!held_.empty()) {
    release(held_.front());
    held_.pop_front();
  }
}

void UcxTransport::on_sent(void* request, ucs_status_t status, void* user) {
  if (tearing_down_ != nullptr) {
    ucp_request_free(request);
    return;
  }
  auto* ctx = static_cast<OpContext*>(user);
  state(ctx).transport->push(completed(ctx, state(ctx).rank, to_errno(status)));
  ucp_request_free(request);
}

// A ferry message, whole (its sender sends eagerly): lent to the core's sink at once, or held
// until a poll lends it.
ucs_status_t UcxTransport::on_data(void* arg, const void*, std::size_t header_length, void* data, std::size_t length,
                                   const ucp_am_recv_param_t* param) {
  auto* t = static_cast<UcxTransport*>(arg);
  if (tearing_down_ != nullptr) return UCS_OK;
  if (__builtin_expect((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0 || header_length != 0, 0)) {
    // Not from a ferry peer, which sends eagerly and without a header: dropped, said once.
    if (!t->foreign_logged_.exchange(true, std::memory_order_relaxed)) {
      FERRY_LOG(warn, "ucx: dropped a message of %zu bytes that no ferry peer sends (%s, %zu header bytes)", length,
                (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0 ? "rendezvous" : "eager", header_length);
    }
    return UCS_OK;  // a rendezvous one is declined by returning (UCX answers its sender)
  }
  if (__builtin_expect(!t->receiving_, 0)) return UCS_OK;  // after cancel_all: dropped
  // Inside poll, with nothing held (a held message is older: the order stays the poll's) and
  // the budget not used up (the core has a spare packet for it): lent to the core where UCX
  // has it, readable until the sink returns, and nothing copied here.
  if (__builtin_expect(t->sink_.deliver != nullptr && progressing_ == t && t->held_.empty() && t->lend_left_ > 0, 1)) {
    --t->lend_left_;
    t->sink_.deliver(t->sink_.owner, t->sink_.link, lent_event(data, length, -1));
    return UCS_OK;
  }
  // Held, as UCX's own descriptor where UCX allows it, else as a copy.
  const bool keep = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0;
  const Held h = keep ? Held{data, length, Held::descriptor} : t->copy_of(data, length);
  if (__builtin_expect(h.data == nullptr || !t->held_.push_back(h), 0)) {
    if (!keep && h.data != nullptr) t->release(h);
    FERRY_LOG(error, "ucx: a message of %zu bytes was lost (out of memory while holding it)", length);
    return UCS_OK;
  }
  return keep ? UCS_INPROGRESS : UCS_OK;
}

void UcxTransport::on_bounce_sent(void* request, ucs_status_t, void* user) {
  auto* slot = static_cast<unsigned char*>(user);
  UcxTransport* t = nullptr;
  std::memcpy(&t, slot, sizeof(t));
  t->free_bounce_.try_push(slot);
  ucp_request_free(request);
}

}  // namespace ferry::net::ucx
