// ucx_transport.cpp — the UCX transport's setup and lifetime: the worker and its handlers, the
// address, endpoints to every peer at start-up or each on its first post (with each one's RMA
// path: lane, active messages or cross-memory attach), close, and a peer's failure (design in
// ucx_transport.hpp).
#include "net/ucx/ucx_transport.hpp"

#include <charconv>
#include <thread>

#include "ferry/error.hpp"
#include "net/util/cma.hpp"

namespace ferry::net::ucx {

UcxTransport::UcxTransport(Context& context, const TransportParams& p)
    : context_(context.get()), rank_(p.rank), multi_(!p.serialized), lock_(multi_ ? &worker_lock_ : nullptr), away_(p.away), copy_(p.copy), events_(kEventRing), bounce_slots_(std::clamp<std::size_t>(p.bounce_slots, 1, kMaxBounceSlots)),
      free_bounce_(bounce_slots_), bounce_(new unsigned char[bounce_slots_ * kBounceSlot]),
      copy_slot_size_(std::max(p.packet_size, kInjectSize)) {
  copy_free_.reserve(kCopyKeep);
  loop_lent_.reserve(kLoopback);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // under lockless, worker_lock_ serialises
  const ucs_status_t s = ucp_worker_create(context_, &wp, &worker_);
  if (s != UCS_OK) throw Error("FERRY_TRANSPORT=ucx: " + ucs_error("ucp_worker_create", s));
  for (std::size_t i = 0; i < bounce_slots_; ++i) {
    unsigned char* slot = bounce_.get() + i * kBounceSlot;
    UcxTransport* self = this;
    std::memcpy(slot, &self, sizeof(self));
    free_bounce_.try_push(slot);
  }
  set_am_handler(kAmKeyRequest, &UcxTransport::on_key_request);
  set_am_handler(kAmKeyReply, &UcxTransport::on_key_reply);
  set_am_handler(kAmNotify, &UcxTransport::on_notify);
  set_am_handler(kAmData, &UcxTransport::on_data);
  set_am_handler(kAmPut, &UcxTransport::on_put);
  set_am_handler(kAmGet, &UcxTransport::on_get);
  set_am_handler(kAmGetReply, &UcxTransport::on_get_reply);
  set_am_handler(kAmPutAck, &UcxTransport::on_put_ack);
  set_am_handler(kAmGetPush, &UcxTransport::on_get_push);
  set_am_handler(kAmPushDone, &UcxTransport::on_push_done);
  caps_.name = "ucx";
  caps_.delivers_inline = lock_ == nullptr;  // lockless holds the worker lock in the callback: see the header
  caps_.inject_size = kInjectSize;
  caps_.max_msg_size = std::size_t{1} << 30;
  caps_.max_rma_size = std::size_t{1} << 30;
  caps_.remote_data_bytes = 8;
  caps_.send_queue = kSendQueue;
  caps_.rma_virtual_address = true;
  caps_.local_registration = false;
  caps_.remote_data_consumes_recv = false;
  caps_.reports_source = false;  // the data callback does not learn the sender (no UCP header)
  caps_.pushed_get = true;       // to peers reached by cross-memory attach (get_pushed)
  caps_.receives = Receives::lent;  // where UCX (or the held copy, or the sender's buffer) has it
}

std::string UcxTransport::address() const {
  ucp_address_t* a = nullptr;
  std::size_t len = 0;
  const detail::BiasedGuard guard(lock_);
  const ucs_status_t s = ucp_worker_get_address(worker_, &a, &len);
  if (s != UCS_OK) throw Error("FERRY_TRANSPORT=ucx: " + ucs_error("ucp_worker_get_address", s));
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * len);
  const auto* b = reinterpret_cast<const unsigned char*>(a);
  for (std::size_t i = 0; i < len; ++i) {
    out.push_back(hex[b[i] >> 4]);
    out.push_back(hex[b[i] & 15]);
  }
  ucp_worker_release_address(worker_, a);
  // Then "/pid/address/value" of the probe word peers on this host read by cross-memory
  // attach to learn whether they may (and that the pid is this process in their namespace).
  out += "/" + std::to_string(::getpid()) + "/" + std::to_string(reinterpret_cast<std::uintptr_t>(&probe_word_)) + "/" +
         std::to_string(probe_word_);
  return out;
}

void UcxTransport::connect(const std::vector<std::string>& addresses) {
  const detail::BiasedGuard guard(lock_);
  make_tables(addresses.size());
  for (std::size_t r = 0; r < addresses.size(); ++r) {
    if (!addresses[r].empty()) make_endpoint(r, addresses[r]);
  }
}

bool UcxTransport::connect_on_demand(const std::vector<bool>& reached, AddressLookup lookup) {
  const detail::BiasedGuard guard(lock_);
  make_tables(reached.size());
  on_demand_.assign(reached.size(), false);
  for (std::size_t r = 0; r < reached.size(); ++r) {
    if (!reached[r]) continue;
    if (r < away_.size() && away_[r]) {
      on_demand_[r] = true;
      continue;
    }
    std::string address;
    int rc;
    while ((rc = lookup(static_cast<int>(r), address)) == -EAGAIN) std::this_thread::yield();  // start-up: nobody else reads long
    if (rc != 0) throw Error("ucx: rank " + std::to_string(r) + "'s address could not be read");
    make_endpoint(r, address);
  }
  lookup_ = std::move(lookup);
  return true;
}

void UcxTransport::make_tables(std::size_t n) {
  eps_ = std::vector<std::atomic<ucp_ep_h>>(n);
  am_rma_ = std::vector<std::atomic<char>>(n);
  cma_pid_ = std::vector<std::atomic<pid_t>>(n);
  pieces_to_.assign(n, 0);
  gone_ = std::make_unique<std::atomic<bool>[]>(n);
}

void UcxTransport::make_endpoint(std::size_t r, const std::string& whole) {
  const std::string text = whole.substr(0, whole.find('/'));
  if (text.size() % 2 != 0) throw Error("ucx: rank " + std::to_string(r) + "'s worker address has odd length");
  std::vector<unsigned char> bytes(text.size() / 2);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const int hi = nibble(text[2 * i]), lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) throw Error("ucx: rank " + std::to_string(r) + "'s worker address is not hexadecimal");
    bytes[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.address = reinterpret_cast<const ucp_address_t*>(bytes.data());
  const bool peer_mode = r < away_.size() && away_[r];
  ep.err_mode = peer_mode ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  if (peer_mode) {
    ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.err_handler.cb = &UcxTransport::on_ep_error;
    ep.err_handler.arg = this;
  }
  ucp_ep_h handle = nullptr;
  const ucs_status_t s = ucp_ep_create(worker_, &ep, &handle);
  if (s != UCS_OK) throw Error("ucx: endpoint to rank " + std::to_string(r) + ": " + ucs_error("ucp_ep_create", s));
  // UCX's own RMA only where the endpoint has an RMA lane; elsewhere UCX would emulate it
  // in software, with an abort when a requester dies (am_rma.hpp).
  const bool over_am = !has_rma_lane(handle);
  pid_t pid = 0;
  try {
    if (over_am && !peer_mode && copy_ != ShmCopy::copy) pid = cma_peer(static_cast<int>(r), whole);
  } catch (...) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* req = ucp_ep_close_nbx(handle, &p);
    if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
    throw;
  }
  am_rma_[r].store(over_am ? 1 : 0, std::memory_order_relaxed);
  cma_pid_[r].store(pid, std::memory_order_relaxed);
  if (static_cast<int>(r) != rank_) connected_.fetch_add(1, std::memory_order_relaxed);
  eps_[r].store(handle, std::memory_order_release);
}

int UcxTransport::reach_held(int rank, ucp_ep_h& ep) noexcept {
  const auto r = static_cast<std::size_t>(rank);
  if (!lookup_ || r >= on_demand_.size() || !on_demand_[r] || gone_[r].load(std::memory_order_relaxed) || closed_) {
    return -EHOSTDOWN;
  }
  std::string address;
  if (const int rc = lookup_(rank, address); rc != 0) return rc == -EAGAIN ? rc : -EHOSTDOWN;
  try {
    make_endpoint(r, address);
  } catch (const std::exception& e) {
    FERRY_LOG(error, "ucx: connecting rank %d: %s", rank, e.what());
    gone_[r].store(true, std::memory_order_relaxed);  // not tried again: the post fails as to a failed peer
    return -EHOSTDOWN;
  }
  ep = ep_of(rank);
  return 0;
}

void UcxTransport::close() noexcept {
  const detail::BiasedGuard guard(lock_);
  close_held();
}

std::string UcxTransport::describe_peer(int rank) const {
  if (rank < 0 || static_cast<std::size_t>(rank) >= eps_.size()) return caps_.name;
  const PostHold hold(*this, rank);
  if (hold.get() == nullptr) return caps_.name;
  const char* rma = cma_pid(rank) != 0 ? "; RMA: cross-memory attach" : am_rma(rank) ? "; RMA: over active messages" : "";
  return caps_.name + ": " + lanes_of(hold.get()) + rma;
}

void UcxTransport::close_held() noexcept {
  if (closed_) return;
  closed_ = true;
  if (lock_ != nullptr) FERRY_LOG(debug, "ucx: the worker lock was %sbiased to one thread at close", lock_->biased() ? "" : "no longer ");
  // Flush-close every endpoint (its queued sends leave), giving up after a deadline on a peer
  // that does not answer; then force-close what is left.
  std::vector<void*> closing;
  for (std::atomic<ucp_ep_h>& slot : eps_) {
    ucp_ep_h ep = slot.exchange(nullptr, std::memory_order_relaxed);
    if (ep == nullptr) continue;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = 0;
    void* r = ucp_ep_close_nbx(ep, &p);
    if (UCS_PTR_IS_PTR(r)) closing.push_back(r);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (void* r : closing) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS && std::chrono::steady_clock::now() < deadline) {
      ucp_worker_progress(worker_);
    }
    if (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_request_cancel(worker_, r);
    ucp_request_free(r);
  }
  for (int i = 0; i < 100 && ucp_worker_progress(worker_) != 0; ++i) {
  }
  cancel_all_held();  // releases what arrived after the last receive
  for (auto& [k, rkey] : rkeys_) ucp_rkey_destroy(rkey);
  rkeys_.clear();
  // What is still queued (sends to a failed peer, whose endpoint UCX keeps until now) is
  // purged here, with callbacks: they must not touch contexts the core may have freed.
  tearing_down_ = this;
  ucp_worker_destroy(worker_);
  tearing_down_ = nullptr;
  worker_ = nullptr;
}

void UcxTransport::peer_failed(int rank) {
  if (rank < 0 || static_cast<std::size_t>(rank) >= eps_.size()) return;
  rma_.peer_failed(rank);
  gone_[static_cast<std::size_t>(rank)].store(true, std::memory_order_relaxed);  // before the null below
  {
    // No answer will come: the tracker reports their operations abandoned after its grace.
    std::lock_guard<detail::SpinLock> g(ops_.lock());
    ops_.each_to(rank, [&](RmaOps::Op& op) {
      op.awaiting = false;
      op.finished = true;
      ops_.uncount(&op);
      ops_.settle(&op);
    });
  }
  // Posts that loaded the endpoint under the worker lock finish with it before the lock
  // below is ours; later ones see no endpoint (PostHold).
  ucp_ep_h ep = eps_[static_cast<std::size_t>(rank)].exchange(nullptr, std::memory_order_acq_rel);
  if (ep == nullptr) return;
  const detail::BiasedGuard guard(lock_);
  // Force-closing makes UCX complete what is queued to the peer now (UCS_ERR_CANCELED) and
  // drops the endpoint before UCX finds it broken. (Keeping failed peers' endpoints open until
  // teardown instead let UCX abort the process, "Endpoint timeout", in the AMT failure test
  // over tcp.)
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* r = ucp_ep_close_nbx(ep, &p);
  if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
}

// Rank r's pid when this process may read and write its memory by cross-memory attach (the
// probe word named in its address reads back as the address says), else 0. The address
// comes from the bootstrap: its fields are checked, and one that does not parse is no CMA.
pid_t UcxTransport::cma_peer(int r, const std::string& address) const {
  std::uint64_t field[3] = {0, 0, 0};
  std::size_t at = address.find('/');
  bool ok = at != std::string::npos;
  for (int i = 0; ok && i < 3; ++i) {
    const char* begin = address.data() + at + 1;
    const char* end = address.data() + address.size();
    const auto [stop, ec] = std::from_chars(begin, end, field[i]);
    ok = ec == std::errc{} && stop != begin && (i == 2 ? stop == end : stop != end && *stop == '/');
    at = static_cast<std::size_t>(stop - address.data());
  }
  const auto pid = static_cast<pid_t>(field[0]);
  ok = ok && field[0] > 0 && static_cast<std::uint64_t>(pid) == field[0];
  const int rc = ok ? cma_probe(pid, field[1], field[2]) : -EINVAL;
  if (rc == 0) return pid;
  if (copy_ == ShmCopy::cma) {
    throw Error("FERRY_SHM_COPY=cma: ucx's cross-memory attach to rank " + std::to_string(r) + " failed (" +
                (ok ? std::string(std::strerror(-rc)) : "its address names no probe word") +
                "); FERRY_SHM_COPY=auto or copy works without it");
  }
  FERRY_LOG(info, "ucx: cross-memory attach to rank %d not available (%s): its RMA goes over active messages", r,
            ok ? std::strerror(-rc) : "no probe word");
  return 0;
}

int UcxTransport::nibble(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

void UcxTransport::set_am_handler(unsigned id, ucp_am_recv_callback_t cb) {
  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  hp.id = id;
  hp.cb = cb;
  hp.arg = this;
  const ucs_status_t s = ucp_worker_set_am_recv_handler(worker_, &hp);
  if (s != UCS_OK) throw Error("FERRY_TRANSPORT=ucx: " + ucs_error("ucp_worker_set_am_recv_handler", s));
}

void UcxTransport::on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* t = static_cast<UcxTransport*>(arg);
  for (std::size_t r = 0; r < t->eps_.size(); ++r) {
    if (t->ep_of(static_cast<int>(r)) != ep) continue;
    FERRY_LOG(warn, "ucx: the endpoint to rank %zu failed: %s", r, ucs_status_string(status));
  }
}

std::unique_ptr<Transport> make_transport(Context& context, const TransportParams& params) {
  return std::make_unique<UcxTransport>(context, params);
}

}  // namespace ferry::net::ucx
