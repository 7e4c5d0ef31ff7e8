// ucx_rma.cpp — the UCX transport's RMA posts: to a peer reached by cross-memory attach one
// copy at post time; to one with an RMA lane UCX's put and get, a put completing with a flush
// of the endpoint (put_data's notification after it, kAmNotify); to others over active
// messages (ucx_rma_over_am.cpp).
#include "net/ucx/ucx_transport.hpp"

#include "net/util/cma.hpp"

namespace ferry::net::ucx {

int UcxTransport::put(int rank, const void* buf, std::size_t len, void*, std::uint64_t addr, std::uint64_t key,
                      OpContext* ctx) {
  return put_flushed(rank, buf, len, addr, key, ctx, op_put, 0);
}

int UcxTransport::put_data(int rank, const void* buf, std::size_t len, void*, std::uint64_t data, std::uint64_t addr,
                           std::uint64_t key, OpContext* ctx) {
  return put_flushed(rank, buf, len, addr, key, ctx, op_put_data, data);
}

int UcxTransport::inject_put(int rank, const void* buf, std::size_t len, std::uint64_t addr, std::uint64_t key) {
  // A cross-memory-attach copy does not touch the worker: it runs outside the worker lock.
  if (am_rma(rank) && cma_pid(rank) != 0) {
    if (ep_of(rank) == nullptr) return -EHOSTDOWN;
    return len > kInjectSize ? -EMSGSIZE : cma_write(cma_pid(rank), buf, len, addr);
  }
  const PostHold hold(*this, rank);
  ucp_ep_h ep = hold.get();
  if (__builtin_expect(ep == nullptr, 0)) {
    if (const int rc = reach_held(rank, ep); rc != 0) return rc;
  }
  if (am_rma(rank)) return am_put(rank, ep, buf, len, addr, key, nullptr, op_put, 0);
  ucp_rkey_h rkey = nullptr;
  if (const int rc = find_rkey(rank, ep, key, &rkey); rc != 0) return rc;
  unsigned char* slot = nullptr;
  if (len > kInjectSize || (slot = bounce_copy(buf, len)) == nullptr) return -EAGAIN;
  ucp_request_param_t p;
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &UcxTransport::on_bounce_sent;
  p.user_data = slot;
  void* r = ucp_put_nbx(ep, slot + kBounceHead, len, addr, rkey, &p);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) {
    free_bounce_.try_push(slot);
    return r == nullptr ? 0 : to_errno(UCS_PTR_STATUS(r));
  }
  return 0;
}

int UcxTransport::get(int rank, void* buf, std::size_t len, void*, std::uint64_t addr, std::uint64_t key,
                      OpContext* ctx) {
  if (am_rma(rank) && cma_pid(rank) != 0) {  // outside the worker lock, as in inject_put
    if (ep_of(rank) == nullptr) return -EHOSTDOWN;
    start_local(ctx, rank, op_get);
    push(completed(ctx, rank, cma_read(cma_pid(rank), buf, len, addr)));
    return 0;
  }
  const PostHold hold(*this, rank);
  ucp_ep_h ep = hold.get();
  if (__builtin_expect(ep == nullptr, 0)) {
    if (const int rc = reach_held(rank, ep); rc != 0) return rc;
  }
  if (am_rma(rank)) return am_get(rank, ep, buf, len, addr, key, ctx);
  ucp_rkey_h rkey = nullptr;
  if (const int rc = find_rkey(rank, ep, key, &rkey); rc != 0) return rc;
  ucp_request_param_t p = tracked(ctx, rank, op_get);
  return posted(ctx, rank, ucp_get_nbx(ep, buf, len, addr, rkey, &p));
}

// A rendezvous read into one of the core's receive blocks: to a peer this rank reaches by
// cross-memory attach, the target writes the bytes (one process_vm_writev, which pins the
// block's few huge pages rather than the source's many small ones; see net/shm/README.md);
// to others, and to this rank itself (UCX's `self` transport would run the request's callback
// inside this call, beside the poll that owns pushes_), a get.
int UcxTransport::get_pushed(int rank, void* buf, std::size_t len, void* desc, std::uint64_t addr, std::uint64_t key,
                             OpContext* ctx) {
  if (rank == rank_ || !am_rma(rank) || cma_pid(rank) == 0 || len == 0) return get(rank, buf, len, desc, addr, key, ctx);
  const PostHold hold(*this, rank);
  ucp_ep_h ep = hold.get();
  if (__builtin_expect(ep == nullptr, 0)) {
    if (const int rc = reach_held(rank, ep); rc != 0) return rc;
  }
  return am_get(rank, ep, buf, len, addr, key, ctx, true);
}

// put and put_data: the put, then a flush of the endpoint whose completion is the event (the
// data is then at the target); put_data's flush also sends the notification.
int UcxTransport::put_flushed(int rank, const void* buf, std::size_t len, std::uint64_t addr, std::uint64_t key,
                              OpContext* ctx, OpKindUcx kind, std::uint64_t data) {
  if (am_rma(rank) && cma_pid(rank) != 0) {
    if (ep_of(rank) == nullptr) return -EHOSTDOWN;
    // The bytes are at the target when the write returns (copied outside the worker lock, as
    // in inject_put); put_data's notification follows, a send under the lock.
    OpState& st = start_local(ctx, rank, kind);
    st.data = data;
    st.length = len;
    const int rc = cma_write(cma_pid(rank), buf, len, addr);
    if (rc != 0) {
      push(completed(ctx, rank, rc));
      return 0;
    }
    const detail::BiasedGuard guard(lock_);
    flushed(ctx, UCS_OK);  // finds the endpoint gone if the peer failed meanwhile
    return 0;
  }
  const PostHold hold(*this, rank);
  ucp_ep_h ep = hold.get();
  if (__builtin_expect(ep == nullptr, 0)) {
    if (const int rc = reach_held(rank, ep); rc != 0) return rc;
  }
  if (am_rma(rank)) return am_put(rank, ep, buf, len, addr, key, ctx, kind, data);
  ucp_rkey_h rkey = nullptr;
  if (const int rc = find_rkey(rank, ep, key, &rkey); rc != 0) return rc;
  OpState& st = start_local(ctx, rank, kind);
  st.data = data;
  st.length = len;
  ucp_request_param_t p;
  p.op_attr_mask = 0;
  void* r = ucp_put_nbx(ep, buf, len, addr, rkey, &p);
  if (UCS_PTR_IS_ERR(r)) return to_errno(UCS_PTR_STATUS(r));
  rma_.track(ctx, rank);
  if (r != nullptr) ucp_request_free(r);  // released by UCX when done; the flush below waits for it
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &UcxTransport::on_flushed;
  p.user_data = ctx;
  r = ucp_ep_flush_nbx(ep, &p);
  if (r == nullptr) {
    flushed(ctx, UCS_OK);
    return 0;
  }
  if (UCS_PTR_IS_ERR(r)) {
    flushed(ctx, UCS_PTR_STATUS(r));
    return 0;
  }
  return 0;
}

void UcxTransport::on_flushed(void* request, ucs_status_t status, void* user) {
  if (tearing_down_ != nullptr) {
    ucp_request_free(request);
    return;
  }
  auto* ctx = static_cast<OpContext*>(user);
  state(ctx).transport->flushed(ctx, status);
  ucp_request_free(request);
}

void UcxTransport::flushed(OpContext* ctx, ucs_status_t status) noexcept {
  OpState& st = state(ctx);
  const int rank = st.rank;
  if (status == UCS_OK && st.kind == op_put_data) {
    ucp_ep_h ep = ep_of(rank);
    auto* n = new (std::nothrow) Notify{rank_, 0, st.data, st.length};
    if (ep == nullptr || n == nullptr) {
      delete n;
      status = UCS_ERR_CANCELED;
    } else {
      ucp_request_param_t p;
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_AM_SEND_FLAG_EAGER;
      p.cb.send = [](void* r, ucs_status_t, void* u) {
        delete static_cast<Notify*>(u);
        ucp_request_free(r);
      };
      p.user_data = n;
      void* r = ucp_am_send_nbx(ep, kAmNotify, n, sizeof(*n), nullptr, 0, &p);
      if (r == nullptr || UCS_PTR_IS_ERR(r)) delete n;
      if (UCS_PTR_IS_ERR(r)) status = UCS_PTR_STATUS(r);
    }
  }
  push(completed(ctx, rank, to_errno(status)));
}

ucs_status_t UcxTransport::on_notify(void* arg, const void* header, std::size_t header_length, void*, std::size_t,
                                     const ucp_am_recv_param_t*) {
  auto* t = static_cast<UcxTransport*>(arg);
  if (header_length != sizeof(Notify)) return UCS_OK;
  Notify n;
  std::memcpy(&n, header, sizeof(n));
  if (n.from < 0 || static_cast<std::size_t>(n.from) >= t->eps_.size()) return UCS_OK;
  Event e = completed(nullptr, n.from, 0);
  e.remote_write = true;
  e.data = n.data;
  e.length = static_cast<std::size_t>(n.length);
  t->push(e);
  return UCS_OK;
}

}  // namespace ferry::net::ucx
