// ucx_keys.cpp — the UCX transport's registrations and remote keys: register_memory maps a
// range and packs its rkey under a key of this transport's table; the first RMA over a lane to
// (rank, key) asks the owner for the packed rkey (kAmKeyRequest, answered from its poll with
// kAmKeyReply) and caches it unpacked.
#include "net/ucx/ucx_transport.hpp"

#include "ferry/error.hpp"

namespace ferry::net::ucx {

namespace {

class UcxRegistration final : public Registration {
 public:
  UcxRegistration(ucp_context_h context, ucp_mem_h memh, std::uint64_t key) noexcept
      : context_(context), memh_(memh), key_(key) {}
  ~UcxRegistration() override { ucp_mem_unmap(context_, memh_); }
  std::uint64_t key() const noexcept override { return key_; }
  void* desc() const noexcept override { return nullptr; }

 private:
  ucp_context_h context_;
  ucp_mem_h memh_;
  std::uint64_t key_;
};

}  // namespace

Registration* UcxTransport::register_memory(const void* buf, std::size_t len, Access access) {
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = const_cast<void*>(buf);
  mp.length = len;
  ucp_mem_h memh = nullptr;
  ucs_status_t s = ucp_mem_map(context_, &mp, &memh);
  if (s != UCS_OK) {
    throw Error("ucx: registering " + std::to_string(len) + " bytes at " + std::to_string(reinterpret_cast<std::uintptr_t>(buf)) +
                ": " + ucs_error("ucp_mem_map", s));
  }
  void* packed = nullptr;
  std::size_t packed_len = 0;
  s = ucp_rkey_pack(context_, memh, &packed, &packed_len);
  if (s != UCS_OK) {
    ucp_mem_unmap(context_, memh);
    throw Error("ucx: registering " + std::to_string(len) + " bytes: " + ucs_error("ucp_rkey_pack", s));
  }
  if (packed_len == 0 || packed_len > kMaxPackedRkey) {
    ucp_rkey_buffer_release(packed);
    ucp_mem_unmap(context_, memh);
    throw Error("ucx: registering " + std::to_string(len) + " bytes: a packed rkey of " + std::to_string(packed_len) +
                " bytes (ferry sends at most " + std::to_string(kMaxPackedRkey) + ")");
  }
  const std::uint64_t key = next_key_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<detail::SpinLock> g(packed_lock_);
    packed_.emplace(key, Region{reinterpret_cast<std::uintptr_t>(buf), len, access,
                                std::string(static_cast<const char*>(packed), packed_len)});
  }
  ucp_rkey_buffer_release(packed);
  return new UcxRegistration(context_, memh, key);
}

void UcxTransport::deregister(Registration* r) noexcept {
  {
    std::lock_guard<detail::SpinLock> g(packed_lock_);
    packed_.erase(r->key());
  }
  delete r;
}

std::uint64_t UcxTransport::rkey_index(int rank, std::uint64_t key) noexcept {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(rank)) << 40) ^ key;
}

// 0 with the rkey, -EAGAIN while it is being fetched, -EINVAL when the owner has none.
// ep: the caller's hold on rank's endpoint.
int UcxTransport::find_rkey(int rank, ucp_ep_h ep, std::uint64_t key, ucp_rkey_h* out) {
  const std::uint64_t k = rkey_index(rank, key);
  {
    std::lock_guard<detail::SpinLock> g(rkey_lock_);
    if (auto it = rkeys_.find(k); it != rkeys_.end()) {
      *out = it->second;
      return 0;
    }
    if (rank != rank_) {
      if (missing_.count(k) != 0) return -EINVAL;
      if (!requested_.insert(k).second) return -EAGAIN;
    }
  }
  if (rank == rank_) return own_rkey(ep, key, k, out);
  auto* req = new KeyRequest{rank_, 0, key};
  ucp_request_param_t p;
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_EAGER;
  p.cb.send = [](void* r, ucs_status_t, void* u) {
    delete static_cast<KeyRequest*>(u);
    ucp_request_free(r);
  };
  p.user_data = req;
  void* r = ucp_am_send_nbx(ep, kAmKeyRequest, req, sizeof(*req), nullptr, 0, &p);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) {
    delete req;
    if (r != nullptr) {
      std::lock_guard<detail::SpinLock> g(rkey_lock_);
      requested_.erase(k);
      return to_errno(UCS_PTR_STATUS(r));
    }
  }
  return -EAGAIN;
}

// This rank's own registration: its rkey unpacked at once, not asked for. (A request to
// this rank would go over UCX's self transport, which runs the request's handler inside the
// send, on the posting thread, beside the poll lock holder that owns replies_.)
int UcxTransport::own_rkey(ucp_ep_h ep, std::uint64_t key, std::uint64_t k, ucp_rkey_h* out) {
  std::string packed;
  {
    std::lock_guard<detail::SpinLock> g(packed_lock_);
    const auto it = packed_.find(key);
    if (it == packed_.end()) return -EINVAL;
    packed = it->second.packed;
  }
  ucp_rkey_h rkey = nullptr;
  if (ucp_ep_rkey_unpack(ep, packed.data(), &rkey) != UCS_OK) return -EINVAL;
  std::lock_guard<detail::SpinLock> g(rkey_lock_);
  const auto [it, fresh] = rkeys_.emplace(k, rkey);
  if (!fresh) ucp_rkey_destroy(rkey);  // another thread unpacked it first
  *out = it->second;
  return 0;
}

ucs_status_t UcxTransport::on_key_request(void* arg, const void* header, std::size_t header_length, void*, std::size_t,
                                          const ucp_am_recv_param_t*) {
  auto* t = static_cast<UcxTransport*>(arg);
  if (header_length != sizeof(KeyRequest)) return UCS_OK;  // not ferry's: ignored
  KeyRequest q;
  std::memcpy(&q, header, sizeof(q));
  if (q.from < 0 || static_cast<std::size_t>(q.from) >= t->eps_.size()) return UCS_OK;
  t->replies_.push_back(Reply{q.from, q.key});
  return UCS_OK;
}

// After progress (not inside a callback): answers the rkey requests.
void UcxTransport::send_replies() {
  std::vector<Reply> replies;
  replies.swap(replies_);
  for (const Reply& q : replies) {
    ucp_ep_h ep = ep_of(q.to);
    if (ep == nullptr) {  // a requester not yet connected is connected back
      const int rc = reach_held(q.to, ep);
      if (rc == -EAGAIN) replies_.push_back(q);  // the bootstrap is busy: the next poll tries again
      if (rc != 0) continue;                     // else failed meanwhile: nobody to answer
    }
    auto* out = new ReplyMessage;
    out->head = KeyReply{rank_, 0, q.key};
    {
      std::lock_guard<detail::SpinLock> g(packed_lock_);
      if (auto it = packed_.find(q.key); it != packed_.end()) {
        out->head.found = 1;
        out->packed = it->second.packed;
      }
    }
    ucp_request_param_t p;
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_EAGER;
    p.cb.send = [](void* r, ucs_status_t, void* u) {
      delete static_cast<ReplyMessage*>(u);
      ucp_request_free(r);
    };
    p.user_data = out;
    void* r = ucp_am_send_nbx(ep, kAmKeyReply, &out->head, sizeof(out->head), out->packed.data(), out->packed.size(), &p);
    if (r == nullptr || UCS_PTR_IS_ERR(r)) delete out;
  }
}

ucs_status_t UcxTransport::on_key_reply(void* arg, const void* header, std::size_t header_length, void* data,
                                        std::size_t length, const ucp_am_recv_param_t* param) {
  auto* t = static_cast<UcxTransport*>(arg);
  if (header_length != sizeof(KeyReply) || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) return UCS_OK;
  KeyReply q;
  std::memcpy(&q, header, sizeof(q));
  if (q.from < 0 || static_cast<std::size_t>(q.from) >= t->eps_.size()) return UCS_OK;
  const std::uint64_t k = rkey_index(q.from, q.key);
  ucp_rkey_h rkey = nullptr;
  ucp_ep_h ep = t->ep_of(q.from);
  // The packed rkey is opaque to ferry; its size at least is checked before UCX reads it.
  const bool ok = q.found != 0 && ep != nullptr && length != 0 && length <= kMaxPackedRkey &&
                  ucp_ep_rkey_unpack(ep, data, &rkey) == UCS_OK;
  std::lock_guard<detail::SpinLock> g(t->rkey_lock_);
  t->requested_.erase(k);
  if (ok) {
    t->rkeys_.emplace(k, rkey);
  } else {
    t->missing_.insert(k);
  }
  return UCS_OK;
}

}  // namespace ferry::net::ucx
