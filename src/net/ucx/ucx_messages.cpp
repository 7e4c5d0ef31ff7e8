// ucx_messages.cpp — the UCX transport's message path: inject and send as eager active
// messages (an inject that cannot go inline from the bounce pool), posted receives and the
// data callback that fills them, messages to this rank through the loopback ring, and poll,
// which drives the worker and hands out events. Kept in one file so the per-message path
// compiles as one unit with the inline helpers of ucx_transport.hpp.
#include "net/ucx/ucx_transport.hpp"

namespace ferry::net::ucx {

int UcxTransport::inject(int rank, const void* buf, std::size_t len) {
  if (__builtin_expect(rank == rank_, 0)) return loop_inject(buf, len);
  const PostHold hold(*this, rank);
  ucp_ep_h ep = hold.get();
  if (__builtin_expect(ep == nullptr, 0)) return -EHOSTDOWN;
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
  if (__builtin_expect(ep == nullptr, 0)) return -EHOSTDOWN;
  ucp_request_param_t p = tracked(ctx, rank, op_send);
  p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_EAGER;
  return posted(ctx, rank, ucp_am_send_nbx(ep, kAmData, nullptr, 0, buf, len, &p));
}

// The oldest held message, if any, fills the receive at once; otherwise it waits for the
// data callback (on_data).
int UcxTransport::post_recv(void* buf, std::size_t len, void*, OpContext* ctx) {
  OpState& st = state(ctx);
  st.transport = this;
  st.rank = -1;
  st.kind = op_recv;
  st.next = nullptr;
  st.buffer = buf;
  st.data = len;
  st.length = 0;
  st.error = 0;
  done_flag(st).store(0, std::memory_order_relaxed);  // read by the poll, on this thread
  if (__builtin_expect(!held_.empty(), 0)) {
    const Held taken = held_.front();
    held_.pop_front();
    fill(ctx, taken.data, taken.length);
    const detail::BiasedGuard guard(lock_);
    release(taken);
  } else if (fill_ == nullptr) {
    fill_ = ctx;
  }
  if (recv_tail_ != nullptr) state(recv_tail_).next = ctx; else recv_head_ = ctx;
  recv_tail_ = ctx;
  return 0;
}

bool UcxTransport::deliver_inline(const InlineSink& sink) {
  if (lock_ != nullptr) return false;  // lockless: see the header comment
  sink_ = sink;
  return true;
}

int UcxTransport::poll(Event* events, int max) {
  if (__builtin_expect(rma_.busy(), 0)) {
    const int n = rma_.abandon(events, max);
    if (n > 0) return n;
  }
  {
    const detail::BiasedGuard guard(lock_);
    UcxTransport* const outer = progressing_;
    progressing_ = this;  // the data callback hands messages over only inside this call
    ucp_worker_progress(worker_);
    progressing_ = outer;
    if (__builtin_expect(!replies_.empty(), 0)) send_replies();
    if (__builtin_expect(answers_waiting_.load(std::memory_order_acquire), 0)) send_answers();
  }
  if (__builtin_expect(!pushes_.empty(), 0)) serve_pushes();
  if (fill_ != nullptr) drain_loopback();  // an empty ring: two loads of lines only pushes write
  int n = 0;
  // Receives in posting order, which is the order the data callback filled them (arrival
  // order, the order sent per sender); a done receive behind one not done waits for it.
  while (n < max && recv_head_ != nullptr && done_flag(state(recv_head_)).load(std::memory_order_acquire) != 0) {
    OpContext* c = recv_head_;
    const OpState& st = state(c);
    recv_head_ = st.next;
    if (recv_head_ == nullptr) recv_tail_ = nullptr;
    Event& e = events[n++];
    e = completed(c, st.rank, st.error);
    e.length = st.length;
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
  // Messages that arrive from now on are dropped: the posted buffers are about to go.
  receiving_ = false;
  fill_ = recv_head_ = recv_tail_ = nullptr;
  for (const Held& h : held_) release(h);
  held_.clear();
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

// A ferry message, whole (its sender sends eagerly): into the oldest posted receive, or held
// until one is posted.
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
  if (__builtin_expect(t->fill_ != nullptr, 1)) {
    OpContext* c = t->fill_;
    t->fill_ = state(c).next;  // before fill(): once done, the poll may hand c back to the core
    t->fill(c, data, length);
    // Inside poll, with every earlier receive already handed over (the order stays the
    // poll's): to the core at once (deliver_inline), not at the end of the poll.
    if (t->sink_.deliver != nullptr && progressing_ == t && t->recv_head_ == c) {
      const OpState& st = state(c);
      t->recv_head_ = st.next;
      if (t->recv_head_ == nullptr) t->recv_tail_ = nullptr;
      Event e = completed(c, st.rank, st.error);
      e.length = st.length;
      t->sink_.deliver(t->sink_.owner, t->sink_.link, e);
    }
    return UCS_OK;
  }
  if (!t->receiving_) return UCS_OK;  // torn down: dropped
  // No receive posted: held, as UCX's own descriptor where UCX allows it, else as a copy.
  const bool keep = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0;
  unsigned char* copy = nullptr;
  try {
    if (!keep) {
      copy = new unsigned char[std::max<std::size_t>(length, 1)];
      if (length != 0) std::memcpy(copy, data, length);
    }
    t->held_.push_back(Held{keep ? data : copy, length, !keep});
  } catch (...) {
    delete[] copy;
    FERRY_LOG(error, "ucx: a message of %zu bytes was lost (out of memory while no receive was posted)", length);
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
