// ucx_transport.cpp — one ferry device over one ucp_worker.
//
// Mapping
//  - Messages are UCP active messages of one id (kAmData), without a UCP header, sent eagerly
//    (UCP_AM_SEND_FLAG_EAGER): the receive callback copies each into the oldest posted buffer,
//    in arrival order, which is the order sent per sender. With no buffer posted the message
//    is held (UCX's descriptor where UCX lets it be kept, else a copy) until one is. ferry's
//    wire header names the sender, so receive events do not (caps().reports_source is false).
//    ferry's own protocols (eager, fragments, rendezvous) run on top, as over libfabric.
//  - Messages to this rank go around UCX, through a ring the poll drains into posted receives
//    (an inject's bytes in a bounce slot, a send's in its own buffer, completed on receipt):
//    UCX's `self` transport would run the receive callback inside the sender's call, on any
//    thread, so the posted receives would need a lock; this way only the poll lock holder
//    touches them.
//  - inject tries UCP's inline path (UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL: done in the call, or
//    UCS_ERR_NO_RESOURCE); where that is not possible it copies into a bounce buffer of a fixed
//    pool that the send's callback returns. An empty pool is -EAGAIN.
//  - RMA to a peer whose endpoint has no RMA lane (UCX's shared memory, tcp): ferry's own
//    protocol over active messages (am_rma.hpp): a put carries its bytes and is acknowledged
//    once written (put_data's target reports the remote write first); a get is a request the
//    target checks against its registrations and answers from its poll. UCX's emulation of
//    ucp_put_nbx/ucp_get_nbx there aborts the process when an answer cannot be sent.
//  - RMA to a peer with an RMA lane (InfiniBand, RoCE): register_memory maps the range
//    (ucp_mem_map) and packs its rkey; the key ferry hands to peers is the number of that
//    registration in this transport's table. The first RMA to (rank, key) asks the owner for
//    the packed rkey by an active message and answers -EAGAIN (the core retries); the reply,
//    handled in poll, unpacks it into a per-rank cache. put and put_data complete when an
//    endpoint flush after them completes, so their data is at the target; put_data then sends
//    its notification as an active message, which the target reports as a remote_write event.
//  - Events: UCX callbacks run inside ucp_worker_progress (the poll lock holder's poll); a post
//    that UCX completes at once reports from the posting thread. Both push onto one
//    multi-producer ring the poll drains (overflow, never expected: a spin-locked vector).
//    Where the worker has no lock of ferry's (every lock model but lockless), the data
//    callback hands a filled receive to the core at once (deliver_inline), so an
//    active-message handler runs, and its reply leaves, inside UCX's callback, before UCX
//    finishes its progress call (a filled receive behind one not yet handed over waits for the
//    poll instead, keeping the order). Under lockless it does not: the handler would run with
//    the worker lock held, and one that waits for a lock of the application's (or posts to
//    another device) while another thread holding that lock posts here would deadlock.
//  - Thread mode: UCS_THREAD_MODE_SERIALIZED. Under the lockless model, whose posts run
//    beside the poll, ferry's own biased lock guards every call into the worker (the thread
//    that drives the device alone takes it without an atomic; net/biased_lock.hpp); under the
//    models that let one thread at a time in, nothing does.
//  - Failure: ferry's liveness decides that a peer failed (heartbeats, the launcher);
//    peer_failed() force-closes its endpoint under the worker lock (PostHold), so UCX
//    completes everything queued to it with UCS_ERR_CANCELED, which the core counts as
//    peer-gone. Endpoints use UCX's peer error mode
//    only to peers on other hosts: in UCX 1.13 that mode leaves out the shared-memory
//    transports (and over tcp within a host it made the AMT failure test abort in 2 of 15
//    runs, in UCX's emulated answer to a dead peer's get request).
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <charconv>
#include <cstring>
#include <deque>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/log.hpp"
#include "common/mpmc_ring.hpp"
#include "common/small_copy.hpp"
#include "common/spinlock.hpp"
#include "ferry/error.hpp"
#include "net/abandon.hpp"
#include "net/biased_lock.hpp"
#include "net/shm/cma.hpp"
#include "net/ucx/am_rma.hpp"
#include "net/ucx/ucp.hpp"

namespace ferry::net::ucx {

namespace {

// Active message ids of the transport's own control traffic.
constexpr unsigned kAmKeyRequest = 1;  // header: KeyRequest; no data
constexpr unsigned kAmKeyReply = 2;    // header: KeyReply; data: the packed rkey
constexpr unsigned kAmNotify = 3;      // header: Notify; no data
constexpr unsigned kAmData = 4;        // no header; data: one ferry message

struct KeyRequest {
  std::int32_t from;
  std::uint32_t pad;
  std::uint64_t key;
};
struct KeyReply {
  std::int32_t from;
  std::int32_t found;  // 0: the owner has no such registration
  std::uint64_t key;
};
struct Notify {
  std::int32_t from;
  std::uint32_t pad;
  std::uint64_t data;
  std::uint64_t length;
};

constexpr std::size_t kInjectSize = 512;    // past UCX's inline path on shared memory (93 B), within tcp's (8 KiB)
constexpr std::size_t kMaxBounceSlots = 1024;  // bounce buffers for injects that cannot go inline
// A bounce slot: the owning transport (for the send's callback, whose user data is the slot),
// then the message.
constexpr std::size_t kBounceHead = 16;
constexpr std::size_t kBounceSlot = kBounceHead + kInjectSize;
constexpr std::size_t kEventRing = 8192;
constexpr std::size_t kLoopback = 1024;  // messages to this rank not yet received
constexpr std::size_t kMaxPackedRkey = 4096;  // a packed rkey holds a few bytes per memory domain
constexpr std::size_t kSendQueue = 1024;

// What a post keeps in its OpContext's backend bytes until its event.
class UcxTransport;
struct OpState {
  UcxTransport* transport;  // for the callbacks, whose user data is the context
  std::int32_t rank;
  std::int32_t kind;  // OpKindUcx
  std::uint64_t data;    // put_data: the notification's data; a receive: its buffer's capacity
  std::uint64_t length;  // put_data: bytes written; a receive: bytes received, once done
  void* buffer;          // a receive's buffer
  detail::OpContext* next;  // posted receives, in posting order (the poll lock holder's)
  std::int32_t error;       // a receive's outcome, once done
  // A receive's completion flag, through done_flag(). Written and read by the poll lock
  // holder only (the data callback runs inside its poll; messages to this rank go around UCX),
  // so the release/acquire pair (length and error, then done) orders nothing across threads;
  // on x86 it compiles to the plain store and load a relaxed pair would.
  std::int32_t done;
};
static_assert(sizeof(OpState) <= detail::OpContext::kBackendBytes);
enum OpKindUcx : std::int32_t { op_send = 0, op_recv = 1, op_put = 2, op_put_data = 3, op_get = 4 };

// A message that arrived while no receive was posted: UCX's descriptor (released with
// ucp_am_data_release) or ferry's copy.
struct Held {
  void* data;
  std::size_t length;
  bool copy;
};

inline OpState& state(detail::OpContext* c) noexcept { return *reinterpret_cast<OpState*>(c->backend); }
inline std::atomic_ref<std::int32_t> done_flag(OpState& st) noexcept { return std::atomic_ref<std::int32_t>(st.done); }

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

class UcxTransport final : public Transport {
 public:
  UcxTransport(Context& context, const TransportParams& p)
      : context_(context.get()), rank_(p.rank), multi_(!p.serialized), lock_(multi_ ? &worker_lock_ : nullptr), away_(p.away), copy_(p.copy), events_(kEventRing), bounce_slots_(std::clamp<std::size_t>(p.bounce_slots, 1, kMaxBounceSlots)),
        free_bounce_(bounce_slots_), bounce_(new unsigned char[bounce_slots_ * kBounceSlot]) {
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
  }

  ~UcxTransport() override { close(); }

  std::string address() const override {
    ucp_address_t* a = nullptr;
    std::size_t len = 0;
    const BiasedGuard guard(lock_);
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

  void connect(const std::vector<std::string>& addresses) override {
    const BiasedGuard guard(lock_);
    const std::vector<bool>& away = away_;
    eps_ = std::vector<std::atomic<ucp_ep_h>>(addresses.size());
    am_rma_.assign(addresses.size(), 0);
    cma_pid_.assign(addresses.size(), 0);
    pieces_to_.assign(addresses.size(), 0);
    for (std::size_t r = 0; r < addresses.size(); ++r) {
      const std::string& whole = addresses[r];
      if (whole.empty()) continue;
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
      const bool peer_mode = r < away.size() && away[r];
      ep.err_mode = peer_mode ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
      if (peer_mode) {
        ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.err_handler.cb = &UcxTransport::on_ep_error;
        ep.err_handler.arg = this;
      }
      ucp_ep_h handle = nullptr;
      const ucs_status_t s = ucp_ep_create(worker_, &ep, &handle);
      if (s != UCS_OK) throw Error("ucx: endpoint to rank " + std::to_string(r) + ": " + ucs_error("ucp_ep_create", s));
      eps_[r].store(handle, std::memory_order_relaxed);  // published to posts by the job's bootstrap fence
      // UCX's own RMA only where the endpoint has an RMA lane; elsewhere UCX would emulate it
      // in software, with an abort when a requester dies (am_rma.hpp).
      am_rma_[r] = has_rma_lane(handle) ? 0 : 1;
      if (am_rma_[r] != 0 && !peer_mode && copy_ != ShmCopy::copy) cma_pid_[r] = cma_peer(static_cast<int>(r), whole);
    }
  }

  // ---- messages ----

  int inject(int rank, const void* buf, std::size_t len) override {
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

  int send(int rank, const void* buf, std::size_t len, void*, detail::OpContext* ctx) override {
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
  int post_recv(void* buf, std::size_t len, void*, detail::OpContext* ctx) override {
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
      const BiasedGuard guard(lock_);
      release(taken);
    } else if (fill_ == nullptr) {
      fill_ = ctx;
    }
    if (recv_tail_ != nullptr) state(recv_tail_).next = ctx; else recv_head_ = ctx;
    recv_tail_ = ctx;
    return 0;
  }

  // ---- RMA ----

  int put(int rank, const void* buf, std::size_t len, void*, std::uint64_t addr, std::uint64_t key,
          detail::OpContext* ctx) override {
    return put_flushed(rank, buf, len, addr, key, ctx, op_put, 0);
  }
  int put_data(int rank, const void* buf, std::size_t len, void*, std::uint64_t data, std::uint64_t addr,
               std::uint64_t key, detail::OpContext* ctx) override {
    return put_flushed(rank, buf, len, addr, key, ctx, op_put_data, data);
  }
  int inject_put(int rank, const void* buf, std::size_t len, std::uint64_t addr, std::uint64_t key) override {
    // A cross-memory-attach copy does not touch the worker: it runs outside the worker lock.
    if (am_rma(rank) && cma_pid(rank) != 0) {
      if (ep_of(rank) == nullptr) return -EHOSTDOWN;
      return len > kInjectSize ? -EMSGSIZE : shm::cma_write(cma_pid(rank), buf, len, addr);
    }
    const PostHold hold(*this, rank);
    ucp_ep_h ep = hold.get();
    if (ep == nullptr) return -EHOSTDOWN;
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
  int get(int rank, void* buf, std::size_t len, void*, std::uint64_t addr, std::uint64_t key,
          detail::OpContext* ctx) override {
    if (am_rma(rank) && cma_pid(rank) != 0) {  // outside the worker lock, as in inject_put
      if (ep_of(rank) == nullptr) return -EHOSTDOWN;
      start_local(ctx, rank, op_get);
      push(completed(ctx, rank, shm::cma_read(cma_pid(rank), buf, len, addr)));
      return 0;
    }
    const PostHold hold(*this, rank);
    ucp_ep_h ep = hold.get();
    if (ep == nullptr) return -EHOSTDOWN;
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
  int get_pushed(int rank, void* buf, std::size_t len, void* desc, std::uint64_t addr, std::uint64_t key,
                 detail::OpContext* ctx) override {
    if (rank == rank_ || !am_rma(rank) || cma_pid(rank) == 0 || len == 0) return get(rank, buf, len, desc, addr, key, ctx);
    const PostHold hold(*this, rank);
    ucp_ep_h ep = hold.get();
    if (ep == nullptr) return -EHOSTDOWN;
    return am_get(rank, ep, buf, len, addr, key, ctx, true);
  }

  Registration* register_memory(const void* buf, std::size_t len, Access access) override {
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
  void deregister(Registration* r) noexcept override {
    {
      std::lock_guard<detail::SpinLock> g(packed_lock_);
      packed_.erase(r->key());
    }
    delete r;
  }

  // ---- progress ----

  bool deliver_inline(const InlineSink& sink) override {
    if (lock_ != nullptr) return false;  // lockless: see the header comment
    sink_ = sink;
    return true;
  }

  int poll(Event* events, int max) override {
    if (__builtin_expect(rma_.busy(), 0)) {
      const int n = rma_.abandon(events, max);
      if (n > 0) return n;
    }
    {
      const BiasedGuard guard(lock_);
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
      detail::OpContext* c = recv_head_;
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

  void cancel_all() noexcept override {
    const BiasedGuard guard(lock_);
    cancel_all_held();
  }

  void close() noexcept override {
    const BiasedGuard guard(lock_);
    close_held();
  }

  std::string describe_peer(int rank) const override {
    if (rank < 0 || static_cast<std::size_t>(rank) >= eps_.size()) return caps_.name;
    const PostHold hold(*this, rank);
    if (hold.get() == nullptr) return caps_.name;
    const char* rma = cma_pid(rank) != 0 ? "; RMA: cross-memory attach" : am_rma(rank) ? "; RMA: over active messages" : "";
    return caps_.name + ": " + lanes_of(hold.get()) + rma;
  }

 private:
  // cancel_all and close, with worker_lock_ held (or not needed).
  void cancel_all_held() noexcept {
    // Messages that arrive from now on are dropped: the posted buffers are about to go.
    receiving_ = false;
    fill_ = recv_head_ = recv_tail_ = nullptr;
    for (const Held& h : held_) release(h);
    held_.clear();
  }

  void close_held() noexcept {
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

 public:
  void peer_failed(int rank) override {
    if (rank < 0 || static_cast<std::size_t>(rank) >= eps_.size()) return;
    rma_.peer_failed(rank);
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
    const BiasedGuard guard(lock_);
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

 private:
  // A tracked completion (a queued send, an RMA operation) leaves the tracking; false when its
  // operation was reported abandoned already (the event is dropped).
  bool settled(const Event& e) noexcept {
    if (e.remote_write || e.context == nullptr) return true;
    const std::int32_t kind = state(e.context).kind;
    if (kind == op_recv) return true;
    return !rma_.settle(e.context);
  }

  // The start of a send or get, which completes through on_sent: the context's state, and its
  // tracking, before the post (the callback may run in the poll at once): one queued to a peer
  // that then fails is never completed by UCX without its peer error mode.
  ucp_request_param_t tracked(detail::OpContext* ctx, int rank, OpKindUcx kind) {
    begin_tracking(ctx, rank, kind);
    ucp_request_param_t p;
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &UcxTransport::on_sent;
    p.user_data = ctx;
    return p;
  }
  void begin_tracking(detail::OpContext* ctx, int rank, OpKindUcx kind) {
    start_local(ctx, rank, kind);
    rma_.track(ctx, rank);
  }
  // An operation's state; not tracked (one done in the post, or tracked later).
  OpState& start_local(detail::OpContext* ctx, int rank, OpKindUcx kind) noexcept {
    OpState& st = state(ctx);
    st.transport = this;
    st.rank = rank;
    st.kind = kind;
    return st;
  }
  // Its end: an immediate completion becomes an event, a refusal leaves the tracking.
  int posted(detail::OpContext* ctx, int rank, void* r) {
    if (r == nullptr) {
      rma_.untrack(ctx);
      push(completed(ctx, rank, 0));
      return 0;
    }
    if (UCS_PTR_IS_ERR(r)) {
      rma_.untrack(ctx);
      return to_errno(UCS_PTR_STATUS(r));
    }
    return 0;
  }

  ucp_ep_h ep_of(int rank) const noexcept { return eps_[static_cast<std::size_t>(rank)].load(std::memory_order_relaxed); }

  // A post's hold on the worker and a peer's endpoint, for the length of the post: under the
  // lockless model the worker lock, then the endpoint (one relaxed load). peer_failed nulls the
  // endpoint, then closes it under the same lock: a post that loaded it under the lock is done
  // with it before the close, and one whose lock comes after the close's release sees null
  // (the null store happens before it). Under the other models posts and peer_failed never
  // overlap (the lock model lets one thread in) and there is no lock. The cross-memory-attach
  // paths, which do not use the endpoint, only check it.
  class PostHold {
   public:
    PostHold(const UcxTransport& t, int rank) noexcept : guard_(t.lock_), ep_(t.ep_of(rank)) {}
    ucp_ep_h get() const noexcept { return ep_; }

   private:
    BiasedGuard guard_;
    ucp_ep_h ep_;
  };

  // Rank r's pid when this process may read and write its memory by cross-memory attach (the
  // probe word named in its address reads back as the address says), else 0. The address
  // comes from the bootstrap: its fields are checked, and one that does not parse is no CMA.
  pid_t cma_peer(int r, const std::string& address) const {
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
    const int rc = ok ? shm::cma_probe(pid, field[1], field[2]) : -EINVAL;
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

  static int nibble(char c) noexcept {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  }

  static Event completed(detail::OpContext* ctx, int rank, int error) noexcept {
    Event e;
    e.context = ctx;
    e.length = 0;
    e.data = 0;
    e.rank = rank;
    e.error = error;
    e.remote_write = false;
    e.lent = nullptr;
    e.abandoned = false;
    return e;
  }

  // Any thread. The ring holds every event unless it is full (more completions waiting than
  // kEventRing: never with the core's credits); then this and every later event, until the
  // poll empties it, go to the overflow vector, so one thread's events keep their order.
  void push(const Event& e) noexcept {
    if (__builtin_expect(!overflowing_.load(std::memory_order_acquire), 1) && events_.try_push(e)) return;
    std::lock_guard<detail::SpinLock> g(overflow_lock_);
    overflowing_.store(true, std::memory_order_release);
    try {
      overflow_.push_back(e);
    } catch (...) {
      FERRY_LOG(error, "ucx: an event was lost (out of memory)");
    }
  }
  void overflow_flag_clear() noexcept { overflowing_.store(false, std::memory_order_release); }

  void set_am_handler(unsigned id, ucp_am_recv_callback_t cb) {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = id;
    hp.cb = cb;
    hp.arg = this;
    const ucs_status_t s = ucp_worker_set_am_recv_handler(worker_, &hp);
    if (s != UCS_OK) throw Error("FERRY_TRANSPORT=ucx: " + ucs_error("ucp_worker_set_am_recv_handler", s));
  }

  // ---- callbacks (inside ucp_worker_progress) ----
  static void on_sent(void* request, ucs_status_t status, void* user) {
    if (tearing_down_ != nullptr) {
      ucp_request_free(request);
      return;
    }
    auto* ctx = static_cast<detail::OpContext*>(user);
    state(ctx).transport->push(completed(ctx, state(ctx).rank, to_errno(status)));
    ucp_request_free(request);
  }
  // A ferry message, whole (its sender sends eagerly): into the oldest posted receive, or held
  // until one is posted.
  static ucs_status_t on_data(void* arg, const void*, std::size_t header_length, void* data, std::size_t length,
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
      detail::OpContext* c = t->fill_;
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
  // A free bounce slot holding a copy of len (<= kInjectSize) bytes of buf, or null when none
  // is free.
  unsigned char* bounce_copy(const void* buf, std::size_t len) noexcept {
    unsigned char* slot = nullptr;
    if (!free_bounce_.try_pop(slot)) return nullptr;
    if (len != 0) std::memcpy(slot + kBounceHead, buf, len);  // buf may be null when len is 0
    return slot;
  }

  // ---- messages to this rank ----
  int loop_inject(const void* buf, std::size_t len) noexcept {
    unsigned char* slot = nullptr;
    if (len > kInjectSize) return -EMSGSIZE;
    if ((slot = bounce_copy(buf, len)) == nullptr) return -EAGAIN;
    if (loopback_.try_push(Loop{slot + kBounceHead, len, nullptr, slot})) return 0;
    free_bounce_.try_push(slot);
    return -EAGAIN;
  }
  int loop_send(const void* buf, std::size_t len, detail::OpContext* ctx) noexcept {
    start_local(ctx, rank_, op_send);
    return loopback_.try_push(Loop{buf, len, ctx, nullptr}) ? 0 : -EAGAIN;
  }
  // The poll lock holder, while receives are posted: each message fills the oldest.
  void drain_loopback() noexcept {
    Loop m;
    while (fill_ != nullptr && loopback_.try_pop(m)) {
      detail::OpContext* c = fill_;
      fill_ = state(c).next;
      fill(c, m.data, m.length);
      if (m.slot != nullptr) free_bounce_.try_push(m.slot);
      if (m.send != nullptr) push(completed(m.send, rank_, 0));
    }
  }

  // The poll lock holder: `length` bytes into receive c, which is done after it.
  void fill(detail::OpContext* c, const void* data, std::size_t length) noexcept {
    OpState& st = state(c);
    const std::size_t n = std::min<std::size_t>(length, st.data);
    detail::copy_small(st.buffer, data, n);  // a small message's few words inline, no call into libc
    st.length = n;
    st.error = length > st.data ? -EMSGSIZE : 0;
    done_flag(st).store(1, std::memory_order_release);
  }
  void release(const Held& h) noexcept {
    if (h.copy) delete[] static_cast<unsigned char*>(h.data); else ucp_am_data_release(worker_, h.data);
  }

  static void on_bounce_sent(void* request, ucs_status_t, void* user) {
    auto* slot = static_cast<unsigned char*>(user);
    UcxTransport* t = nullptr;
    std::memcpy(&t, slot, sizeof(t));
    t->free_bounce_.try_push(slot);
    ucp_request_free(request);
  }

  // ---- remote keys ----
  static std::uint64_t rkey_index(int rank, std::uint64_t key) noexcept {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(rank)) << 40) ^ key;
  }
  // 0 with the rkey, -EAGAIN while it is being fetched, -EINVAL when the owner has none.
  // ep: the caller's hold on rank's endpoint.
  int find_rkey(int rank, ucp_ep_h ep, std::uint64_t key, ucp_rkey_h* out) {
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
  int own_rkey(ucp_ep_h ep, std::uint64_t key, std::uint64_t k, ucp_rkey_h* out) {
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

  static ucs_status_t on_key_request(void* arg, const void* header, std::size_t header_length, void*, std::size_t,
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
  void send_replies() {
    std::vector<Reply> replies;
    replies.swap(replies_);
    for (const Reply& q : replies) {
      ucp_ep_h ep = ep_of(q.to);
      if (ep == nullptr) continue;
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
  static ucs_status_t on_key_reply(void* arg, const void* header, std::size_t header_length, void* data, std::size_t length,
                                   const ucp_am_recv_param_t* param) {
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

  // put and put_data: the put, then a flush of the endpoint whose completion is the event (the
  // data is then at the target); put_data's flush also sends the notification.
  int put_flushed(int rank, const void* buf, std::size_t len, std::uint64_t addr, std::uint64_t key,
                  detail::OpContext* ctx, OpKindUcx kind, std::uint64_t data) {
    if (am_rma(rank) && cma_pid(rank) != 0) {
      if (ep_of(rank) == nullptr) return -EHOSTDOWN;
      // The bytes are at the target when the write returns (copied outside the worker lock, as
      // in inject_put); put_data's notification follows, a send under the lock.
      OpState& st = start_local(ctx, rank, kind);
      st.data = data;
      st.length = len;
      const int rc = shm::cma_write(cma_pid(rank), buf, len, addr);
      if (rc != 0) {
        push(completed(ctx, rank, rc));
        return 0;
      }
      const BiasedGuard guard(lock_);
      flushed(ctx, UCS_OK);  // finds the endpoint gone if the peer failed meanwhile
      return 0;
    }
    const PostHold hold(*this, rank);
    ucp_ep_h ep = hold.get();
    if (ep == nullptr) return -EHOSTDOWN;
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
  static void on_flushed(void* request, ucs_status_t status, void* user) {
    if (tearing_down_ != nullptr) {
      ucp_request_free(request);
      return;
    }
    auto* ctx = static_cast<detail::OpContext*>(user);
    state(ctx).transport->flushed(ctx, status);
    ucp_request_free(request);
  }
  void flushed(detail::OpContext* ctx, ucs_status_t status) noexcept {
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
  static ucs_status_t on_notify(void* arg, const void* header, std::size_t header_length, void*, std::size_t,
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

  // ---- RMA over active messages (am_rma.hpp), to peers whose endpoint has no RMA lane ----
  bool am_rma(int rank) const noexcept { return am_rma_[static_cast<std::size_t>(rank)] != 0; }
  pid_t cma_pid(int rank) const noexcept { return cma_pid_[static_cast<std::size_t>(rank)]; }

  // put and put_data (ctx set), inject_put (ctx null: its bytes copied into the slot, no event).
  int am_put(int rank, ucp_ep_h ep, const void* buf, std::size_t len, std::uint64_t addr, std::uint64_t key,
             detail::OpContext* ctx, OpKindUcx kind, std::uint64_t data) {
    const bool inject = ctx == nullptr;
    unsigned char* bounce = nullptr;  // inject_put's bytes, returned to the pool when sent
    if (inject) {
      if (len > kInjectSize) return -EMSGSIZE;
      if ((bounce = bounce_copy(buf, len)) == nullptr) return -EAGAIN;
      buf = bounce + kBounceHead;
    }
    RmaOps::Op* op = nullptr;
    {
      std::lock_guard<detail::SpinLock> g(ops_.lock());
      op = ops_.claim(ctx, rank, !inject);
      if (op != nullptr) {
        const std::uint32_t flags = inject ? 0u : (put_ack | (kind == op_put_data ? put_notify : 0u));
        op->head.put = PutHeader{rank_, flags, op->id, addr, key, len, data};
        op->finished = inject;
        op->bounce = bounce;
      }
    }
    if (op == nullptr) {
      if (bounce != nullptr) free_bounce_.try_push(bounce);
      return -EAGAIN;
    }
    if (!inject) begin_tracking(ctx, rank, kind);
    ucp_request_param_t p;
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = rma_send_flags(rank, inject);
    p.cb.send = &UcxTransport::on_rma_sent;
    p.user_data = op;  // its slot stays while the send is outstanding
    return am_posted(op, ucp_am_send_nbx(ep, kAmPut, &op->head.put, sizeof(PutHeader), buf, len, &p));
  }
  int am_get(int rank, ucp_ep_h ep, void* buf, std::size_t len, std::uint64_t addr, std::uint64_t key,
             detail::OpContext* ctx, bool push = false) {
    RmaOps::Op* op = nullptr;
    {
      std::lock_guard<detail::SpinLock> g(ops_.lock());
      // At most kGetWindow bytes of gets in flight (at least one get): the core takes a receive
      // block per rendezvous read it starts, and a window of them all at once is memory out of
      // cache by the time the application reads it.
      if (ops_.getting != 0 && ops_.getting + len > kGetWindow) return -EAGAIN;
      op = ops_.claim(ctx, rank, true);
      if (op == nullptr) return -EAGAIN;
      ops_.getting += len;
      if (push) op->head.push = PushHeader{GetHeader{rank_, 0, op->id, addr, key, len}, reinterpret_cast<std::uintptr_t>(buf)};
      else op->head.get = GetHeader{rank_, 0, op->id, addr, key, len};
      op->buffer = buf;
      op->length = len;
      op->counted = true;
      op->pushed = push;
    }
    begin_tracking(ctx, rank, op_get);
    ucp_request_param_t p;
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_EAGER;
    p.cb.send = &UcxTransport::on_rma_sent;
    p.user_data = op;
    if (push) return am_posted(op, ucp_am_send_nbx(ep, kAmGetPush, &op->head.push, sizeof(PushHeader), nullptr, 0, &p));
    return am_posted(op, ucp_am_send_nbx(ep, kAmGet, &op->head.get, sizeof(GetHeader), nullptr, 0, &p));
  }
  // A refused send leaves no trace; one done at once is as if its callback ran.
  int am_posted(RmaOps::Op* op, void* r) {
    if (r == nullptr) {
      rma_sent(op, UCS_OK);
      return 0;
    }
    if (UCS_PTR_IS_ERR(r)) {
      detail::OpContext* ctx = nullptr;
      unsigned char* bounce = nullptr;
      {
        std::lock_guard<detail::SpinLock> g(ops_.lock());
        ctx = op->ctx;
        bounce = op->bounce;
        op->sending = op->awaiting = false;
        op->finished = true;
        ops_.settle(op);
      }
      if (bounce != nullptr) free_bounce_.try_push(bounce);
      if (ctx != nullptr) rma_.untrack(ctx);
      return to_errno(UCS_PTR_STATUS(r));
    }
    return 0;
  }
  static void on_rma_sent(void* request, ucs_status_t status, void* user) {
    if (tearing_down_ == nullptr) {
      auto* op = static_cast<RmaOps::Op*>(user);
      static_cast<UcxTransport*>(op->owner)->rma_sent(op, status);
    }
    ucp_request_free(request);
  }
  void rma_sent(RmaOps::Op* op, ucs_status_t status) noexcept {
    Event e;
    bool report = false;
    unsigned char* bounce = nullptr;
    {
      std::lock_guard<detail::SpinLock> g(ops_.lock());
      bounce = op->bounce;
      op->bounce = nullptr;
      op->sending = false;
      if (status != UCS_OK && !op->finished) {
        // Not delivered: no answer will come.
        op->finished = true;
        op->awaiting = false;
        e = completed(op->ctx, op->rank, to_errno(status));
        report = true;
      }
      ops_.settle(op);
    }
    if (bounce != nullptr) free_bounce_.try_push(bounce);
    if (report) push(e);
  }
  // How an RMA message's bytes travel: eagerly (copied through UCX's queues) to a peer on this
  // host, whose endpoint has no peer error mode: UCX's rendezvous there reads or writes the
  // other process's memory by cross-memory attach, and UCX 1.13 aborts when that process is
  // gone. To a peer on another host (peer error mode) as UCX chooses, zero-copy for large ones.
  std::uint32_t rma_send_flags(int rank, bool small) const noexcept {
    return small || !away(rank) ? UCP_AM_SEND_FLAG_EAGER : 0;
  }
  bool away(int rank) const noexcept {
    return static_cast<std::size_t>(rank) < away_.size() && away_[static_cast<std::size_t>(rank)];
  }
  // An answer's error from the wire: a negative errno value, or -EIO.
  static int wire_error(std::int32_t error) noexcept { return error <= 0 && error > -4096 ? error : -EIO; }

  static ucs_status_t on_put_ack(void* arg, const void* header, std::size_t header_length, void*, std::size_t,
                                 const ucp_am_recv_param_t*) {
    auto* t = static_cast<UcxTransport*>(arg);
    if (tearing_down_ != nullptr || header_length != sizeof(RmaReply)) return UCS_OK;
    RmaReply a;
    std::memcpy(&a, header, sizeof(a));
    Event e;
    {
      std::lock_guard<detail::SpinLock> g(t->ops_.lock());
      RmaOps::Op* op = t->ops_.find(a.id);
      // Stale or not ours. (An operation awaiting its answer has not reported: every path that
      // reports clears `awaiting`.)
      if (op == nullptr || op->rank != a.from || !op->awaiting || op->ctx == nullptr) return UCS_OK;
      op->awaiting = false;
      op->finished = true;
      e = completed(op->ctx, op->rank, wire_error(a.error));
      t->ops_.settle(op);
    }
    t->push(e);
    return UCS_OK;
  }
  // A get's answer: its bytes whole (rendezvous, or one eager message), or one of its pieces
  // (kGetPiece, in order); the get is done when every byte is in place.
  static ucs_status_t on_get_reply(void* arg, const void* header, std::size_t header_length, void* data, std::size_t length,
                                   const ucp_am_recv_param_t* param) {
    auto* t = static_cast<UcxTransport*>(arg);
    // Declining a rendezvous one is returning without receiving it (UCX answers its sender).
    if (tearing_down_ != nullptr || header_length != sizeof(RmaReply)) return UCS_OK;
    RmaReply a;
    std::memcpy(&a, header, sizeof(a));
    const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    detail::OpContext* ctx = nullptr;
    unsigned char* buffer = nullptr;
    int rank = -1;
    int error = wire_error(a.error);
    bool last = false;
    {
      std::lock_guard<detail::SpinLock> g(t->ops_.lock());
      RmaOps::Op* op = t->ops_.find(a.id);
      if (op == nullptr || op->rank != a.from || !op->awaiting || op->ctx == nullptr) return UCS_OK;  // stale or not ours
      ctx = op->ctx;
      rank = op->rank;
      buffer = static_cast<unsigned char*>(op->buffer);
      // The piece must continue the get where the last one ended and stay inside it (bytes
      // from the wire); a rendezvous answer is the whole.
      if (error == 0 && (a.offset != op->received || length > op->length - op->received || (rndv && length != op->length))) {
        error = -EIO;
      }
      if (error == 0 && !rndv) op->received += length;
      last = error != 0 || rndv || op->received == op->length;
      if (last) {
        op->awaiting = false;
        op->finished = true;
        t->ops_.settle(op);
      }
    }
    // The destination is the core's until the get's event, and only this callback writes it.
    if (error == 0 && !rndv && length != 0) std::memcpy(buffer + a.offset, data, length);
    if (!last) return UCS_OK;
    if (error != 0 || !rndv) {
      t->push(completed(ctx, rank, error));
      return UCS_OK;
    }
    // Rendezvous: UCX moves the bytes into the destination (zero-copy where it can).
    ucp_request_param_t p;
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv_am = &UcxTransport::on_get_data;
    p.user_data = ctx;
    void* r = ucp_am_recv_data_nbx(t->worker_, data, buffer, length, &p);
    if (r == nullptr) t->push(completed(ctx, rank, 0));
    else if (UCS_PTR_IS_ERR(r)) t->push(completed(ctx, rank, to_errno(UCS_PTR_STATUS(r))));
    return UCS_OK;
  }
  static void on_get_data(void* request, ucs_status_t status, std::size_t, void* user) {
    if (tearing_down_ == nullptr) {
      auto* ctx = static_cast<detail::OpContext*>(user);
      state(ctx).transport->push(completed(ctx, state(ctx).rank, to_errno(status)));
    }
    ucp_request_free(request);
  }

  // The target's side. A request names a registration of this rank's, a range and what it
  // wants; it is checked before any byte moves (a failed check answers -EINVAL).
  bool region_allows(std::uint64_t key, std::uint64_t addr, std::uint64_t length, Access want) {
    std::lock_guard<detail::SpinLock> g(packed_lock_);
    const auto it = packed_.find(key);
    if (it == packed_.end() || !has(it->second.access, want)) return false;
    const Region& r = it->second;
    return addr >= r.base && length <= r.length && addr - r.base <= r.length - length;
  }
  void refused_request(const char* what, int from, std::uint64_t key, std::uint64_t addr, std::uint64_t length) {
    if (refused_logged_.exchange(true, std::memory_order_relaxed)) return;
    FERRY_LOG(warn, "ucx: refused a %s from rank %d of %llu bytes at %#llx with key %llu: no such registration, range or access here (said once)",
              what, from, static_cast<unsigned long long>(length), static_cast<unsigned long long>(addr),
              static_cast<unsigned long long>(key));
  }
  static ucs_status_t on_put(void* arg, const void* header, std::size_t header_length, void* data, std::size_t length,
                             const ucp_am_recv_param_t* param) {
    auto* t = static_cast<UcxTransport*>(arg);
    if (tearing_down_ != nullptr || header_length != sizeof(PutHeader)) return UCS_OK;
    PutHeader h;
    std::memcpy(&h, header, sizeof(h));
    if (h.from < 0 || static_cast<std::size_t>(h.from) >= t->eps_.size()) return UCS_OK;
    if (length != h.length || !t->region_allows(h.key, h.addr, h.length, Access::remote_write)) {
      t->refused_request("put", h.from, h.key, h.addr, h.length);
      t->put_done(h, -EINVAL);
      return UCS_OK;
    }
    if (length == 0 || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
      if (length != 0) std::memcpy(reinterpret_cast<void*>(h.addr), data, length);
      t->put_done(h, 0);
      return UCS_OK;
    }
    auto* pending = new (std::nothrow) PendingPut{t, h};  // rendezvous-sized: one allocation is small beside it
    if (pending == nullptr) {
      t->put_done(h, -ENOMEM);
      return UCS_OK;
    }
    ucp_request_param_t p;
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv_am = &UcxTransport::on_put_data;
    p.user_data = pending;
    void* r = ucp_am_recv_data_nbx(t->worker_, data, reinterpret_cast<void*>(h.addr), length, &p);
    if (r == nullptr || UCS_PTR_IS_ERR(r)) {
      t->put_done(h, r == nullptr ? 0 : to_errno(UCS_PTR_STATUS(r)));
      delete pending;
    }
    return UCS_OK;
  }
  static void on_put_data(void* request, ucs_status_t status, std::size_t, void* user) {
    auto* pending = static_cast<PendingPut*>(user);
    if (tearing_down_ == nullptr) static_cast<UcxTransport*>(pending->transport)->put_done(pending->head, to_errno(status));
    delete pending;
    ucp_request_free(request);
  }
  // A put's bytes are in place (or refused): its notification, then its acknowledgement.
  void put_done(const PutHeader& h, int error) noexcept {
    if (error == 0 && (h.flags & put_notify) != 0) {
      Event e = completed(nullptr, h.from, 0);
      e.remote_write = true;
      e.data = h.data;
      e.length = static_cast<std::size_t>(h.length);
      push(e);
    }
    if ((h.flags & put_ack) != 0) answer(Answer{kAmPutAck, h.from, RmaReply{rank_, error, h.id, 0}, 0, 0});
  }
  // A get request's header (bytes from the wire): a sender that names no rank is ignored; a
  // range outside this rank's readable registrations is refused with -EINVAL in a `refusal`
  // message. True when the request may be served.
  bool get_allowed(const GetHeader& q, unsigned refusal) {
    if (q.from < 0 || static_cast<std::size_t>(q.from) >= eps_.size()) return false;
    if (region_allows(q.key, q.addr, q.length, Access::remote_read)) return true;
    refused_request("get", q.from, q.key, q.addr, q.length);
    answer(Answer{refusal, q.from, RmaReply{rank_, -EINVAL, q.id, 0}, 0, 0});
    return false;
  }
  static ucs_status_t on_get(void* arg, const void* header, std::size_t header_length, void*, std::size_t,
                             const ucp_am_recv_param_t*) {
    auto* t = static_cast<UcxTransport*>(arg);
    if (tearing_down_ != nullptr || header_length != sizeof(GetHeader)) return UCS_OK;
    GetHeader q;
    std::memcpy(&q, header, sizeof(q));
    if (!t->get_allowed(q, kAmGetReply)) return UCS_OK;
    t->answer(Answer{kAmGetReply, q.from, RmaReply{t->rank_, 0, q.id, 0}, q.addr, q.length});
    return UCS_OK;
  }
  // A pushed get: checked as a get; served by this poll after its progress (pushes_), or, where
  // this rank cannot write the requester's memory, answered as a get.
  static ucs_status_t on_get_push(void* arg, const void* header, std::size_t header_length, void*, std::size_t,
                                  const ucp_am_recv_param_t*) {
    auto* t = static_cast<UcxTransport*>(arg);
    if (tearing_down_ != nullptr || header_length != sizeof(PushHeader)) return UCS_OK;
    PushHeader h;
    std::memcpy(&h, header, sizeof(h));
    const GetHeader& q = h.get;
    if (!t->get_allowed(q, kAmPushDone)) return UCS_OK;
    if (q.from != t->rank_ && t->cma_pid(q.from) != 0) {  // never from this rank (get_pushed)
      try {
        t->pushes_.push_back(Push{q.from, q.id, q.addr, q.length, h.dest});
        return UCS_OK;
      } catch (...) {  // out of memory: answered with the bytes instead
      }
    }
    t->answer(Answer{kAmGetReply, q.from, RmaReply{t->rank_, 0, q.id, 0}, q.addr, q.length});
    return UCS_OK;
  }
  // The poll lock holder, outside the worker lock: each pushed get is one cross-memory-attach
  // write into the requester's memory (its address is the requester's own business: it can
  // only ask for bytes it may read to be written into its own process), then its answer.
  void serve_pushes() {
    for (const Push& q : pushes_) {
      const int rc = shm::cma_write(cma_pid(q.from), reinterpret_cast<const void*>(q.addr), q.length, q.dest);
      answer(Answer{kAmPushDone, q.from, RmaReply{rank_, rc, q.id, 0}, 0, 0});
    }
    pushes_.clear();
    const BiasedGuard guard(lock_);
    send_answers();
  }
  // The requester's: a pushed get is done (or failed) at the target.
  static ucs_status_t on_push_done(void* arg, const void* header, std::size_t header_length, void*, std::size_t length,
                                   const ucp_am_recv_param_t*) {
    auto* t = static_cast<UcxTransport*>(arg);
    if (tearing_down_ != nullptr || header_length != sizeof(RmaReply)) return UCS_OK;
    RmaReply a;
    std::memcpy(&a, header, sizeof(a));
    detail::OpContext* ctx = nullptr;
    int rank = -1;
    int error = wire_error(a.error);
    {
      std::lock_guard<detail::SpinLock> g(t->ops_.lock());
      RmaOps::Op* op = t->ops_.find(a.id);
      if (op == nullptr || op->rank != a.from || !op->awaiting || op->ctx == nullptr || !op->pushed) return UCS_OK;
      // Bytes from the wire: a done notice carries none, and comes instead of any piece.
      if (error == 0 && (length != 0 || a.offset != 0 || op->received != 0)) error = -EIO;
      ctx = op->ctx;
      rank = op->rank;
      op->awaiting = false;
      op->finished = true;
      t->ops_.settle(op);
    }
    t->push(completed(ctx, rank, error));
    return UCS_OK;
  }
  // Answers wait for the poll (callbacks may run on any thread, and send nothing themselves).
  void answer(const Answer& a) noexcept {
    std::lock_guard<detail::SpinLock> g(answers_lock_);
    try {
      answers_.push_back(a);
    } catch (...) {
      FERRY_LOG(error, "ucx: an answer to rank %d was lost (out of memory)", a.to);
      return;
    }
    answers_waiting_.store(true, std::memory_order_release);
  }
  // The poll lock holder, after progress; answers UCX cannot take now wait for the next poll,
  // in order. To a peer on this host each goes as eager messages (a get's bytes in kGetPiece
  // pieces), at most kPieces of them queued in UCX per peer, their headers from a pool that
  // grows to what is in flight: UCX's queue is not flooded by a window of large gets. To a peer
  // on another host as UCX chooses (large get answers by its zero-copy rendezvous). A send
  // that fails (the requester died) is UCX's error, not an abort.
  void send_answers() {
    {
      std::lock_guard<detail::SpinLock> g(answers_lock_);
      try {
        answers_backlog_.insert(answers_backlog_.end(), answers_.begin(), answers_.end());
      } catch (...) {
        FERRY_LOG(error, "ucx: %zu answers to peers were lost (out of memory)", answers_.size());
      }
      answers_.clear();
      answers_waiting_.store(false, std::memory_order_relaxed);  // under the lock, as the stores that set it
    }
    // In order; one that finds no room waits for the next poll (with every later one to its peer).
    std::size_t kept = 0;
    for (std::size_t i = 0; i < answers_backlog_.size(); ++i) {
      if (!send_answer(answers_backlog_[i])) answers_backlog_[kept++] = answers_backlog_[i];
    }
    answers_backlog_.resize(kept);
    if (kept != 0) answers_waiting_.store(true, std::memory_order_relaxed);  // the next poll tries again
  }
  // False when UCX has no room now (a's offset says how far it got).
  bool send_answer(Answer& a) {
    ucp_ep_h ep = ep_of(a.to);
    if (ep == nullptr) return true;  // failed meanwhile: nobody to answer
    ucp_request_param_t p;
    if (away(a.to) && a.am == kAmGetReply) {
      auto* head = new (std::nothrow) RmaReply(a.reply);
      if (head == nullptr) return false;
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      p.cb.send = [](void* r, ucs_status_t, void* u) {
        delete static_cast<RmaReply*>(u);
        ucp_request_free(r);
      };
      p.user_data = head;
      void* r = ucp_am_send_nbx(ep, a.am, head, sizeof(RmaReply), reinterpret_cast<const void*>(a.addr), a.length, &p);
      if (r == nullptr || UCS_PTR_IS_ERR(r)) delete head;
      return true;
    }
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_EAGER;
    p.cb.send = &UcxTransport::on_piece_sent;
    // A piece UCX sent in the call is used again for the next: the pool's lock (a full fence,
    // which waits for the previous piece's copy to drain) is taken only when UCX queues one.
    Piece* piece = nullptr;
    do {
      if (piece == nullptr && (piece = take_piece(a.to)) == nullptr) return false;  // kPieces in flight to it: next poll
      const std::uint64_t n = std::min<std::uint64_t>(kGetPiece, a.length - a.reply.offset);
      piece->head = a.reply;
      p.user_data = piece;
      void* r = ucp_am_send_nbx(ep, a.am, &piece->head, sizeof(RmaReply), reinterpret_cast<const void*>(a.addr + a.reply.offset), n, &p);
      if (UCS_PTR_IS_ERR(r)) {
        give_piece(piece);
        return true;  // the requester is gone
      }
      if (r != nullptr) piece = nullptr;  // UCX holds it until on_piece_sent
      a.reply.offset += n;
    } while (a.reply.offset < a.length);
    if (piece != nullptr) give_piece(piece);
    return true;
  }
  // A header for a piece to `to`, or null while kPieces are in flight to it. The pool grows
  // as needed (large RMA answers only), to at most kPieces per peer answered at once.
  Piece* take_piece(int to) noexcept {
    std::lock_guard<detail::SpinLock> g(pieces_lock_);
    std::uint32_t& busy = pieces_to_[static_cast<std::size_t>(to)];
    if (busy >= kPieces) return nullptr;
    if (free_pieces_.empty()) {
      try {
        piece_store_.push_back(std::make_unique<Piece>(Piece{this, -1, {}}));
        free_pieces_.reserve(piece_store_.size());  // give_piece never allocates
      } catch (...) {
        if (piece_store_.size() > free_pieces_.capacity()) piece_store_.pop_back();
        return nullptr;
      }
      free_pieces_.push_back(piece_store_.back().get());
    }
    Piece* piece = free_pieces_.back();
    free_pieces_.pop_back();
    piece->to = to;
    ++busy;
    return piece;
  }
  void give_piece(Piece* piece) noexcept {
    std::lock_guard<detail::SpinLock> g(pieces_lock_);
    --pieces_to_[static_cast<std::size_t>(piece->to)];
    free_pieces_.push_back(piece);  // capacity reserved for every piece: no allocation
  }
  static void on_piece_sent(void* request, ucs_status_t, void* user) {
    auto* piece = static_cast<Piece*>(user);
    static_cast<UcxTransport*>(piece->owner)->give_piece(piece);
    ucp_request_free(request);
  }

  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* t = static_cast<UcxTransport*>(arg);
    for (std::size_t r = 0; r < t->eps_.size(); ++r) {
      if (t->ep_of(static_cast<int>(r)) != ep) continue;
      FERRY_LOG(warn, "ucx: the endpoint to rank %zu failed: %s", r, ucs_status_string(status));
    }
  }

  struct Reply {
    int to;
    std::uint64_t key;
  };
  struct ReplyMessage {
    KeyReply head;
    std::string packed;
  };

  ucp_context_h context_;
  ucp_worker_h worker_ = nullptr;
  int rank_;
  bool multi_;  // the lockless model: posts run beside the poller
  // Under lockless, every call into the worker holds worker_lock_ (lock_ points to it; under
  // the other models, which let one thread at a time in, lock_ is null and the worker runs
  // unguarded). The worker itself is UCS_THREAD_MODE_SERIALIZED either way: UCX's own
  // multi-thread mode takes a spin lock per call, an atomic that waits for the previous
  // send's store into the peer's queue to leave the core; the biased lock lets the thread
  // that drives the device alone skip it (net/biased_lock.hpp).
  mutable BiasedLock worker_lock_;
  BiasedLock* lock_;
  std::vector<bool> away_;     // by rank: on another host (UCX's peer error mode)
  ShmCopy copy_;               // whether RMA to peers on this host may use cross-memory attach
  // Read by peers' cma_probe (process_vm_readv) at their connect; set once, before address().
  std::uint64_t probe_word_ = (static_cast<std::uint64_t>(::getpid()) << 32) ^
                              static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                              reinterpret_cast<std::uintptr_t>(this);
  // Endpoints by rank. connect writes them before any post (the bootstrap's fence publishes
  // them); then only peer_failed (to null) and close change them. Posts read them through
  // PostHold (under the worker lock, under which peer_failed closes them).
  std::vector<std::atomic<ucp_ep_h>> eps_;
  detail::MpmcRing<Event> events_;
  std::atomic<bool> overflowing_{false};
  detail::SpinLock overflow_lock_;
  std::vector<Event> overflow_;
  // Bounce buffers for injects UCX cannot complete inline (min(FERRY_PACKETS, 1024) of them);
  // each slot's head names its transport for the send's callback.
  std::size_t bounce_slots_;
  detail::MpmcRing<unsigned char*> free_bounce_;
  std::unique_ptr<unsigned char[]> bounce_;
  // Posted receives in posting order, and held_, the messages waiting for one: the poll lock
  // holder's alone, with no lock. It posts them (post_recv: the core reposts from its progress),
  // takes done ones from the head (poll), and the data callback, which UCX runs inside that
  // poll's ucp_worker_progress, fills fill_, the oldest not yet done, and moves it on (and,
  // delivering inline, takes it off the head itself when it is the head). No other
  // thread runs the callback: messages to this rank never go through UCX (whose `self`
  // transport would run it inside the sender's call) but through loopback_.
  detail::OpContext* recv_head_ = nullptr;
  detail::OpContext* recv_tail_ = nullptr;
  detail::OpContext* fill_ = nullptr;
  std::deque<Held> held_;
  // Messages to this rank, from any thread, in the order sent; the poll moves them into posted
  // receives (while none is posted they wait here, and a full ring is -EAGAIN to the sender).
  struct Loop {
    const void* data;
    std::size_t length;
    detail::OpContext* send;  // send(): its buffer, completed when the message is received
    unsigned char* slot;      // inject(): the bounce slot holding the bytes
  };
  detail::MpmcRing<Loop> loopback_{kLoopback};
  bool receiving_ = true;  // false after cancel_all
  std::atomic<bool> foreign_logged_{false};  // a message not from ferry was reported (relaxed: a log flag)
  // Remote keys: unpacked rkeys by (rank, key), the ones asked for, the ones the owner lacks.
  detail::SpinLock rkey_lock_;
  std::unordered_map<std::uint64_t, ucp_rkey_h> rkeys_;
  std::unordered_set<std::uint64_t> requested_;
  std::unordered_set<std::uint64_t> missing_;
  // This rank's registrations by key: the range, what peers may do with it, the packed rkey.
  struct Region {
    std::uintptr_t base;
    std::size_t length;
    Access access;
    std::string packed;
  };
  detail::SpinLock packed_lock_;
  std::unordered_map<std::uint64_t, Region> packed_;
  std::atomic<std::uint64_t> next_key_{1};  // only uniqueness matters: relaxed
  std::vector<Reply> replies_;  // poll lock holder
  // RMA over active messages: by rank, whether the peer gets it (no RMA lane); the
  // operations in flight; the answers waiting for the poll.
  std::vector<char> am_rma_;
  std::vector<pid_t> cma_pid_;  // by rank: its pid where RMA goes by cross-memory attach, else 0
  RmaOps ops_{kSendQueue, this};
  detail::SpinLock answers_lock_;
  std::vector<Answer> answers_;
  std::vector<Answer> answers_backlog_;  // poll lock holder: taken from answers_, not yet sent
  std::vector<Push> pushes_;  // poll lock holder: pushed gets to serve after progress
  // The headers of answer messages in flight to peers on this host (send_answer).
  detail::SpinLock pieces_lock_;
  std::vector<std::unique_ptr<Piece>> piece_store_;
  std::vector<Piece*> free_pieces_;
  std::vector<std::uint32_t> pieces_to_;  // by rank: pieces in flight to it
  std::atomic<bool> answers_waiting_{false};
  std::atomic<bool> refused_logged_{false};  // a refused request was reported (relaxed: a log flag)
  AbandonTracker rma_;          // queued sends and RMA operations in flight, and a failed peer's given up
  bool closed_ = false;
  // The transport whose worker is being destroyed on this thread (callbacks then only free
  // their requests). Initial-exec: every receive and send callback reads it, and the default
  // model for a shared library calls __tls_get_addr each time (about 11 instructions per
  // message, callgrind). Like the biased lock's thread number and the packet pool's cache, a
  // word of initial-exec TLS: linked with a program it is in static TLS, and dlopened the
  // library's few such words fit in the spare static TLS glibc keeps for such libraries.
  static thread_local UcxTransport* tearing_down_ __attribute__((tls_model("initial-exec")));
  // The transport whose poll's ucp_worker_progress runs on this thread: the data callback
  // hands messages to sink_ (set only where the worker has no lock, deliver_inline) inside that
  // call alone, never inside teardown's progress calls.
  static thread_local UcxTransport* progressing_ __attribute__((tls_model("initial-exec")));
  InlineSink sink_;
};

thread_local UcxTransport* UcxTransport::tearing_down_ __attribute__((tls_model("initial-exec"))) = nullptr;
thread_local UcxTransport* UcxTransport::progressing_ __attribute__((tls_model("initial-exec"))) = nullptr;

}  // namespace

std::unique_ptr<Transport> make_transport(Context& context, const TransportParams& params) {
  return std::make_unique<UcxTransport>(context, params);
}

}  // namespace ferry::net::ucx
