// ucx_transport.hpp — one ferry device over one ucp_worker: the transport class its files share.
//
// The class is defined here with the helpers of the per-message path inline (so every file's
// calls to them inline); its other members are defined in one file per operation:
// ucx_transport.cpp (setup, connect, close, a peer's failure), ucx_messages.cpp (the
// active-message data path, messages to this rank, the bounce pool, poll), ucx_keys.cpp
// (registration and the rkey protocol), ucx_rma.cpp (RMA over an RMA lane or cross-memory
// attach) and ucx_rma_over_am.cpp (RMA over active messages, am_rma.hpp).
//
// Mapping
//  - Messages are UCP active messages of one id (kAmData), without a UCP header, sent eagerly
//    (UCP_AM_SEND_FLAG_EAGER). The transport lends them (Caps::receives = lent): the core posts
//    no receives, and each message is handed over where it lies, UCX's own buffer inside the
//    data callback or, once the callback has returned, what the transport held it in (UCX's
//    descriptor where UCX lets it be kept, else a copy in a slot of the transport's), at most
//    lend_limit() per poll, in arrival order, which is the order sent per sender. A held
//    message lent by a poll is released by the next one. ferry's wire header names the
//    sender, so receive events do not (caps().reports_source is false). ferry's own protocols
//    (eager, fragments, rendezvous) run on top, as over libfabric.
//  - Messages to this rank go around UCX, through a ring the poll lends from (an inject's
//    bytes in a bounce slot, a send's in its own buffer; the slot returns, and the send
//    completes, when the next poll releases the loan): UCX's `self` transport would run the
//    receive callback inside the sender's call, on any thread, so the held messages and the
//    lend budget would need a lock; this way only the poll lock holder touches them.
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
//    callback inside poll lends a message to the core at once (Caps::delivers_inline: UCX's buffer,
//    no copy, readable until the sink returns), so an active-message handler runs, and its
//    reply leaves, inside UCX's callback, before UCX finishes its progress call. It does so
//    only while nothing is held (a message behind a held one waits for the poll, keeping the
//    order) and the poll's lend budget lasts (the core has a spare packet for each). Under
//    lockless it does not: the handler would run with the worker lock held, and one that
//    waits for a lock of the application's (or posts to another device) while another thread
//    holding that lock posts here would deadlock.
//  - Thread mode: UCS_THREAD_MODE_SERIALIZED. Under the lockless model, whose posts run
//    beside the poll, ferry's own biased lock guards every call into the worker (the thread
//    that drives the device alone takes it without an atomic; common/biased_lock.hpp); under the
//    models that let one thread at a time in, nothing does.
//  - Failure: ferry's liveness decides that a peer failed (heartbeats, the launcher);
//    peer_failed() force-closes its endpoint under the worker lock (PostHold), so UCX
//    completes everything queued to it with UCS_ERR_CANCELED, which the core counts as
//    peer-gone. Endpoints use UCX's peer error mode
//    only to peers on other hosts: in UCX 1.13 that mode leaves out the shared-memory
//    transports (and over tcp within a host it made the AMT failure test abort in 2 of 15
//    runs, in UCX's emulated answer to a dead peer's get request).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/log.hpp"
#include "common/mpmc_ring.hpp"
#include "common/small_copy.hpp"
#include "common/spinlock.hpp"
#include "net/op_context.hpp"
#include "net/util/abandon.hpp"
#include "common/biased_lock.hpp"
#include "net/transport.hpp"
#include "net/ucx/am_rma.hpp"
#include "net/ucx/ucp.hpp"

namespace ferry::net::ucx {

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
  std::uint64_t data;    // put_data: the notification's data
  std::uint64_t length;  // put_data: bytes written
};
static_assert(sizeof(OpState) <= OpContext::kBackendBytes);
enum OpKindUcx : std::int32_t { op_send = 0, op_put = 2, op_put_data = 3, op_get = 4 };

// A message kept past the data callback (held): UCX's descriptor (released with
// ucp_am_data_release), or ferry's copy in a slot of the transport's copy pool or, past a
// slot's size, on the heap.
struct Held {
  void* data;
  std::size_t length;
  enum How : std::uint8_t { descriptor, slot, heap } how;
};

// The held messages, oldest first: a ring that grows (doubling) only when full, so holding a
// message allocates nothing in the steady state. The poll lock holder's alone.
class HeldQueue {
 public:
  explicit HeldQueue(std::size_t capacity) : ring_(new Held[capacity]), mask_(capacity - 1) {}
  bool empty() const noexcept { return count_ == 0; }
  std::size_t size() const noexcept { return count_; }
  // The i-th oldest.
  const Held& operator[](std::size_t i) const noexcept { return ring_[(head_ + i) & mask_]; }
  const Held& front() const noexcept { return ring_[head_]; }
  void pop_front() noexcept {
    head_ = (head_ + 1) & mask_;
    --count_;
  }
  // False when the ring was full and could not grow (out of memory).
  bool push_back(const Held& h) noexcept {
    if (__builtin_expect(count_ == mask_ + 1, 0) && !grow()) return false;
    ring_[(head_ + count_) & mask_] = h;
    ++count_;
    return true;
  }

 private:
  bool grow() noexcept {
    const std::size_t capacity = 2 * (mask_ + 1);
    Held* bigger = new (std::nothrow) Held[capacity];
    if (bigger == nullptr) return false;
    for (std::size_t i = 0; i < count_; ++i) bigger[i] = (*this)[i];
    ring_.reset(bigger);
    mask_ = capacity - 1;
    head_ = 0;
    return true;
  }
  std::unique_ptr<Held[]> ring_;
  std::size_t mask_;
  std::size_t head_ = 0;
  std::size_t count_ = 0;
};

inline OpState& state(OpContext* c) noexcept { return *reinterpret_cast<OpState*>(c->backend); }

class UcxTransport final : public Transport {
 public:
  UcxTransport(Context& context, const TransportParams& p);
  ~UcxTransport() override {
    close();
    for (unsigned char* slot : copy_free_) delete[] slot;
  }

  // ---- setup (ucx_transport.cpp) ----
  std::string address() const override;
  void connect(const std::vector<std::string>& addresses) override;
  // Peers on this host are connected at once (their RMA may go by cross-memory attach, which
  // both ends must know of before either uses it), those on other hosts by their first post.
  bool connect_on_demand(const std::vector<bool>& reached, AddressLookup lookup) override;
  std::size_t peers_connected() const noexcept override { return connected_.load(std::memory_order_relaxed); }
  bool has_endpoint(int rank) const noexcept override { return ep_of(rank) != nullptr; }

  // ---- messages (ucx_messages.cpp) ----
  int inject(int rank, const void* buf, std::size_t len) override;
  int send(int rank, const void* buf, std::size_t len, void*, OpContext* ctx) override;
  int post_recv(void*, std::size_t, void*, OpContext*) override { return -ENOSYS; }  // lent (Caps)

  // ---- RMA (ucx_rma.cpp) ----
  int put(int rank, const void* buf, std::size_t len, void*, std::uint64_t addr, std::uint64_t key,
          OpContext* ctx) override;
  int put_data(int rank, const void* buf, std::size_t len, void*, std::uint64_t data, std::uint64_t addr,
               std::uint64_t key, OpContext* ctx) override;
  int inject_put(int rank, const void* buf, std::size_t len, std::uint64_t addr, std::uint64_t key) override;
  int get(int rank, void* buf, std::size_t len, void*, std::uint64_t addr, std::uint64_t key,
          OpContext* ctx) override;
  int get_pushed(int rank, void* buf, std::size_t len, void* desc, std::uint64_t addr, std::uint64_t key,
                 OpContext* ctx) override;

  // ---- registration (ucx_keys.cpp) ----
  Registration* register_memory(const void* buf, std::size_t len, Access access) override;
  void deregister(Registration* r) noexcept override;

  // ---- progress (ucx_messages.cpp) ----
  int poll(Event* events, int max) override;
  void cancel_all() noexcept override;

  // ---- close and peers (ucx_transport.cpp) ----
  void close() noexcept override;
  std::string describe_peer(int rank) const override;

 private:
  // cancel_all and close, with worker_lock_ held (or not needed).
  void cancel_all_held() noexcept;  // ucx_messages.cpp
  void close_held() noexcept;

 public:
  void peer_failed(int rank) override;

 private:
  // A tracked completion (a queued send, an RMA operation) leaves the tracking; false when its
  // operation was reported abandoned already (the event is dropped).
  bool settled(const Event& e) noexcept {
    if (e.remote_write || e.context == nullptr) return true;
    return !rma_.settle(e.context);
  }

  // The start of a send or get, which completes through on_sent: the context's state, and its
  // tracking, before the post (the callback may run in the poll at once): one queued to a peer
  // that then fails is never completed by UCX without its peer error mode.
  ucp_request_param_t tracked(OpContext* ctx, int rank, OpKindUcx kind) {
    begin_tracking(ctx, rank, kind);
    ucp_request_param_t p;
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &UcxTransport::on_sent;
    p.user_data = ctx;
    return p;
  }
  void begin_tracking(OpContext* ctx, int rank, OpKindUcx kind) {
    start_local(ctx, rank, kind);
    rma_.track(ctx, rank);
  }
  // An operation's state; not tracked (one done in the post, or tracked later).
  OpState& start_local(OpContext* ctx, int rank, OpKindUcx kind) noexcept {
    OpState& st = state(ctx);
    st.transport = this;
    st.rank = rank;
    st.kind = kind;
    return st;
  }
  // Its end: an immediate completion becomes an event, a refusal leaves the tracking.
  int posted(OpContext* ctx, int rank, void* r) {
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

  // Acquire: pairs with reach_held's release store, for what it wrote before (am_rma_, cma_pid_).
  ucp_ep_h ep_of(int rank) const noexcept { return eps_[static_cast<std::size_t>(rank)].load(std::memory_order_acquire); }
  // The endpoint to `rank` where it has none yet: connects it, if connect_on_demand left that to
  // the first post and the peer has not failed. With the worker lock held (or under a lock model
  // that lets one thread in), which also keeps two threads from connecting one peer; the
  // bootstrap read is made under it, once per peer. 0 and `ep`; -EAGAIN (the bootstrap is busy:
  // retry); -EHOSTDOWN (failed, or never this transport's peer).
  [[gnu::cold, gnu::noinline]] int reach_held(int rank, ucp_ep_h& ep) noexcept;

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
    detail::BiasedGuard guard_;
    ucp_ep_h ep_;
  };

  static Event completed(OpContext* ctx, int rank, int error) noexcept {
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

  // ---- setup (ucx_transport.cpp) ----
  pid_t cma_peer(int r, const std::string& address) const;
  // Makes rank r's endpoint from its address and decides its RMA path (connect's and
  // reach_held's, under the worker lock); publishes it with a release store. Throws
  // ferry::Error naming the rank.
  void make_endpoint(std::size_t r, const std::string& address);
  void make_tables(std::size_t ranks);  // eps_ and the per-rank tables, empty
  static int nibble(char c) noexcept;
  void set_am_handler(unsigned id, ucp_am_recv_callback_t cb);
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  // ---- callbacks (inside ucp_worker_progress; ucx_messages.cpp) ----
  static void on_sent(void* request, ucs_status_t status, void* user);
  static ucs_status_t on_data(void* arg, const void*, std::size_t header_length, void* data, std::size_t length,
                              const ucp_am_recv_param_t* param);
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
  int loop_send(const void* buf, std::size_t len, OpContext* ctx) noexcept {
    start_local(ctx, rank_, op_send);
    return loopback_.try_push(Loop{buf, len, ctx, nullptr}) ? 0 : -EAGAIN;
  }
  // A lent message's event: `length` bytes at `data`, from `rank` (-1: not known).
  static Event lent_event(const void* data, std::size_t length, int rank) noexcept {
    Event e = completed(nullptr, rank, 0);
    e.length = length;
    e.lent = static_cast<const unsigned char*>(data);
    return e;
  }

  // The poll lock holder: what the previous poll lent is given back, the held messages with
  // worker_lock_ held (or not needed), messages to this rank with no lock (their bounce slot
  // returns, their send completes).
  void release_lent() noexcept {
    for (; held_lent_ != 0; --held_lent_) {
      release(held_.front());
      held_.pop_front();
    }
    if (__builtin_expect(!loop_lent_.empty(), 0)) {
      for (const Loop& m : loop_lent_) {
        if (m.slot != nullptr) free_bounce_.try_push(m.slot);
        if (m.send != nullptr) push(completed(m.send, rank_, 0));
      }
      loop_lent_.clear();
    }
  }
  // A copy of a message UCX does not let the transport keep: in a slot of the copy pool where
  // it fits (allocated only while the pool has none free), else on the heap. Null when memory
  // is short.
  Held copy_of(const void* data, std::size_t length) noexcept {
    Held h{nullptr, length, Held::heap};
    if (length <= copy_slot_size_) {
      h.how = Held::slot;
      if (!copy_free_.empty()) {
        h.data = copy_free_.back();
        copy_free_.pop_back();
      } else {
        h.data = new (std::nothrow) unsigned char[copy_slot_size_];
      }
    } else {
      h.data = new (std::nothrow) unsigned char[length];
    }
    if (h.data != nullptr && length != 0) std::memcpy(h.data, data, length);
    return h;
  }
  // A held message given back: UCX's descriptor with worker_lock_ held (or not needed).
  void release(const Held& h) noexcept {
    auto* bytes = static_cast<unsigned char*>(h.data);
    switch (h.how) {
      case Held::descriptor:
        ucp_am_data_release(worker_, h.data);
        return;
      case Held::slot:
        // The pool keeps at most kCopyKeep slots (its vector's reserved room: no allocation).
        if (copy_free_.size() < kCopyKeep) {
          copy_free_.push_back(bytes);
          return;
        }
        break;
      case Held::heap:
        break;
    }
    delete[] bytes;
  }

  static void on_bounce_sent(void* request, ucs_status_t, void* user);

  // ---- remote keys (ucx_keys.cpp) ----
  static std::uint64_t rkey_index(int rank, std::uint64_t key) noexcept;
  int find_rkey(int rank, ucp_ep_h ep, std::uint64_t key, ucp_rkey_h* out);
  int own_rkey(ucp_ep_h ep, std::uint64_t key, std::uint64_t k, ucp_rkey_h* out);
  static ucs_status_t on_key_request(void* arg, const void* header, std::size_t header_length, void*, std::size_t,
                                     const ucp_am_recv_param_t*);
  void send_replies();
  static ucs_status_t on_key_reply(void* arg, const void* header, std::size_t header_length, void* data, std::size_t length,
                                   const ucp_am_recv_param_t* param);

  // ---- RMA over an RMA lane, or by cross-memory attach (ucx_rma.cpp) ----
  int put_flushed(int rank, const void* buf, std::size_t len, std::uint64_t addr, std::uint64_t key,
                  OpContext* ctx, OpKindUcx kind, std::uint64_t data);
  static void on_flushed(void* request, ucs_status_t status, void* user);
  void flushed(OpContext* ctx, ucs_status_t status) noexcept;
  static ucs_status_t on_notify(void* arg, const void* header, std::size_t header_length, void*, std::size_t,
                                const ucp_am_recv_param_t*);
  // ---- RMA over active messages (am_rma.hpp; ucx_rma_over_am.cpp), to peers whose endpoint has no RMA lane ----
  // Relaxed: each is written once, before the peer's endpoint is published (ep_of's acquire);
  // a post that reads them first and finds no endpoint goes the way of a peer not connected.
  bool am_rma(int rank) const noexcept { return am_rma_[static_cast<std::size_t>(rank)].load(std::memory_order_relaxed) != 0; }
  pid_t cma_pid(int rank) const noexcept { return cma_pid_[static_cast<std::size_t>(rank)].load(std::memory_order_relaxed); }
  int am_put(int rank, ucp_ep_h ep, const void* buf, std::size_t len, std::uint64_t addr, std::uint64_t key,
             OpContext* ctx, OpKindUcx kind, std::uint64_t data);
  int am_get(int rank, ucp_ep_h ep, void* buf, std::size_t len, std::uint64_t addr, std::uint64_t key,
             OpContext* ctx, bool push = false);
  int am_posted(RmaOps::Op* op, void* r);
  static void on_rma_sent(void* request, ucs_status_t status, void* user);
  void rma_sent(RmaOps::Op* op, ucs_status_t status) noexcept;
  std::uint32_t rma_send_flags(int rank, bool small) const noexcept;
  bool away(int rank) const noexcept {
    return static_cast<std::size_t>(rank) < away_.size() && away_[static_cast<std::size_t>(rank)];
  }
  // An answer's error from the wire: a negative errno value, or -EIO.
  static int wire_error(std::int32_t error) noexcept { return error <= 0 && error > -4096 ? error : -EIO; }
  static ucs_status_t on_put_ack(void* arg, const void* header, std::size_t header_length, void*, std::size_t,
                                 const ucp_am_recv_param_t*);
  static ucs_status_t on_get_reply(void* arg, const void* header, std::size_t header_length, void* data, std::size_t length,
                                   const ucp_am_recv_param_t* param);
  static void on_get_data(void* request, ucs_status_t status, std::size_t, void* user);
  bool region_allows(std::uint64_t key, std::uint64_t addr, std::uint64_t length, Access want);
  void refused_request(const char* what, int from, std::uint64_t key, std::uint64_t addr, std::uint64_t length);
  static ucs_status_t on_put(void* arg, const void* header, std::size_t header_length, void* data, std::size_t length,
                             const ucp_am_recv_param_t* param);
  static void on_put_data(void* request, ucs_status_t status, std::size_t, void* user);
  void put_done(const PutHeader& h, int error) noexcept;
  bool get_allowed(const GetHeader& q, unsigned refusal);
  static ucs_status_t on_get(void* arg, const void* header, std::size_t header_length, void*, std::size_t,
                             const ucp_am_recv_param_t*);
  static ucs_status_t on_get_push(void* arg, const void* header, std::size_t header_length, void*, std::size_t,
                                  const ucp_am_recv_param_t*);
  void serve_pushes();
  static ucs_status_t on_push_done(void* arg, const void* header, std::size_t header_length, void*, std::size_t length,
                                   const ucp_am_recv_param_t*);
  void answer(const Answer& a) noexcept;
  void send_answers();
  bool send_answer(Answer& a);
  Piece* take_piece(int to) noexcept;
  void give_piece(Piece* piece) noexcept;
  static void on_piece_sent(void* request, ucs_status_t, void* user);

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
  // that drives the device alone skip it (common/biased_lock.hpp).
  mutable detail::BiasedLock worker_lock_;
  detail::BiasedLock* lock_;
  std::vector<bool> away_;     // by rank: on another host (UCX's peer error mode)
  ShmCopy copy_;               // whether RMA to peers on this host may use cross-memory attach
  // Read by peers' cma_probe (process_vm_readv) at their connect; set once, before address().
  std::uint64_t probe_word_ = (static_cast<std::uint64_t>(::getpid()) << 32) ^
                              static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                              reinterpret_cast<std::uintptr_t>(this);
  // Endpoints by rank. connect writes them before any post (the bootstrap's fence publishes
  // them), or reach_held on a peer's first post; then only peer_failed (to null) and close
  // change them. Posts read them through PostHold (under the worker lock, under which
  // peer_failed closes them and reach_held makes them).
  std::vector<std::atomic<ucp_ep_h>> eps_;
  // connect_on_demand's: the ranks left to their first post, and where their addresses are.
  std::vector<bool> on_demand_;
  AddressLookup lookup_;
  // By rank: failed (peer_failed), never to be connected again. Relaxed: stored before the
  // endpoint's acq_rel exchange to null, read after ep_of's acquire load of that null.
  std::unique_ptr<std::atomic<bool>[]> gone_;
  std::atomic<std::size_t> connected_{0};  // peers with an endpoint made (relaxed: a count)
  detail::MpmcRing<Event> events_;
  std::atomic<bool> overflowing_{false};
  detail::SpinLock overflow_lock_;
  std::vector<Event> overflow_;
  // Bounce buffers for injects UCX cannot complete inline (min(FERRY_PACKETS, 1024) of them);
  // each slot's head names its transport for the send's callback.
  std::size_t bounce_slots_;
  detail::MpmcRing<unsigned char*> free_bounce_;
  std::unique_ptr<unsigned char[]> bounce_;
  // What the core has not yet been lent (held_ past its first held_lent_, and loopback_) and
  // what the last poll lent it (held_'s first held_lent_, loop_lent_): the poll lock holder's
  // alone, with no lock. The data callback, which UCX runs inside that holder's
  // ucp_worker_progress, lends to the sink or holds; poll lends the rest and releases the
  // previous poll's loans. No other thread runs the callback: messages to this rank never go
  // through UCX (whose `self` transport would run it inside the sender's call) but through
  // loopback_.
  HeldQueue held_{256};
  std::size_t held_lent_ = 0;
  int lend_left_ = 0;  // this poll's lend budget not yet used (lend_limit() at its start)
  // Copies of held messages UCX does not let the transport keep: slots of copy_slot_size_
  // bytes (the device's packet, the largest message a ferry peer sends), kept for reuse.
  static constexpr std::size_t kCopyKeep = 256;
  std::size_t copy_slot_size_;
  std::vector<unsigned char*> copy_free_;
  // Messages to this rank, from any thread, in the order sent; the poll lends them (while its
  // budget is used up they wait here, and a full ring is -EAGAIN to the sender).
  struct Loop {
    const void* data;
    std::size_t length;
    OpContext* send;  // send(): its buffer, completed when the loan is released
    unsigned char* slot;      // inject(): the bounce slot holding the bytes
  };
  detail::MpmcRing<Loop> loopback_{kLoopback};
  // The last poll's loans from loopback_: room for kLoopback reserved at construction, and a
  // poll lends no more than fits, so the poll never allocates.
  std::vector<Loop> loop_lent_;
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
  std::vector<std::atomic<char>> am_rma_;
  std::vector<std::atomic<pid_t>> cma_pid_;  // by rank: its pid where RMA goes by cross-memory attach, else 0
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
  static inline thread_local UcxTransport* tearing_down_ __attribute__((tls_model("initial-exec"))) = nullptr;
  // The transport whose poll's ucp_worker_progress runs on this thread: the data callback
  // hands messages to sink_ (only where the worker has no lock: Caps::delivers_inline) inside that
  // call alone, never inside teardown's progress calls.
  static inline thread_local UcxTransport* progressing_ __attribute__((tls_model("initial-exec"))) = nullptr;
};

}  // namespace ferry::net::ucx
