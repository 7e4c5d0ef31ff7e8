// transport.hpp — the contract between ferry's core and a network backend.
//
// A Transport is one device's connection to the peers one backend reaches: libfabric
// (net/ofi/), ferry's own shared memory (net/shm/), UCX (net/ucx/), and later others. The core owns the
// protocols (eager, fragments, rendezvous, RMA records) and speaks to a backend only through
// this interface; no backend type or error code leaks into core/.
//
// Contract
//  - Posts (inject, send, put, put_data, inject_put, get) may be called by any thread,
//    concurrently, unless the device's lock model serialises them; a backend adds no lock of
//    its own where its structures are lock-free. post_recv, poll and cancel_all are called
//    only by the thread that holds the device's poll lock, one at a time.
//  - Receives take one of two shapes (Caps::receives). A `posted` backend (libfabric, self)
//    fills buffers the core posted with post_recv, each producing its event. A `lent` backend
//    (ferry's shm, UCX) takes no posted receives (post_recv returns -ENOSYS): each poll
//    returns arrived messages where they lie, as events with a null context and Event::lent
//    set, at most lend_limit() of them (the core sets it before each poll to the packets it
//    holds for them). A message waits in the backend until a poll has room for it; the
//    poll's other events do not wait for that room.
//  - Every post returns 0 (accepted), -EAGAIN (no resources now: the core answers retry) or
//    another negative errno value (the operation cannot be done; the core reports it). No post
//    blocks.
//  - inject copies the message at once and produces no event. send, post_recv, put, put_data
//    and get each produce exactly one event carrying their OpContext, success or error,
//    from a later poll. inject_put produces none. A lent message produces one event, with no
//    context.
//  - A put_data also produces, at the target, one event with remote_write set, the data and
//    the length, after the written bytes are visible there.
//  - Messages from one sender to one receiver on one transport arrive in the order sent.
//  - OpContext::backend (64 bytes, op_context.hpp) belongs to the backend from the post until
//    its event; a backend never reads or writes past it.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "net/op_context.hpp"

namespace ferry::net {

// How a backend hands the core an arrived message (see the contract above).
enum class Receives : std::uint8_t {
  posted,  // into a buffer the core posted (post_recv), the event carrying its context
  lent,    // where the backend holds it (Event::lent), readable until the next poll
};

// What a backend can do. The core reads it once per device and obeys it on every operation.
struct Caps {
  std::string name;                // "shm", "ofi/tcp;ofi_rxm", ...
  std::size_t inject_size = 0;     // largest message inject() takes
  std::size_t max_msg_size = 0;    // largest single send and receive
  std::size_t max_rma_size = 0;    // largest single put or get
  std::size_t remote_data_bytes = 0;  // immediate data bytes a put_data delivers (0: none)
  std::size_t send_queue = 0;      // sends and RMA transfers held at once (0: unbounded)
  bool rma_virtual_address = true;  // RMA addresses are the owner's virtual addresses, else offsets
  bool local_registration = false;  // local buffers need a registration's desc() (FI_MR_LOCAL)
  bool remote_data_consumes_recv = false;  // a put_data's target event uses up a posted receive
  bool reports_source = true;       // events of received messages and remote writes name the rank
  // get moves data in one copy at once, with no work by the target (cross-memory attach):
  // with FERRY_FRAGMENT=auto messages past a packet then go by rendezvous, not fragments.
  bool one_copy_get = false;
  // inject_parts() copies a header and a body from separate buffers straight into the message,
  // so the caller need not first assemble them in one frame.
  bool gather_inject = false;
  // get_pushed() differs from get() for some peers: the target writes the data on request.
  bool pushed_get = false;
  // Hands arrived messages to the sink given by set_inline_sink from inside its poll (see
  // there). Fixed at construction: UCX does so where its worker has no lock of ferry's.
  bool delivers_inline = false;
  Receives receives = Receives::posted;
  // A registration pins its pages for the device to move data into them (verbs, UCX's RDMA
  // lanes): memory under one must keep its pages, so the packet pool gives none back
  // (Device::trim_memory). False where registering only records a range: sockets, shared
  // memory, cross-memory attach.
  bool registration_pins = true;
};

// How large data moves between processes of one host (FERRY_SHM_COPY): detect cross-memory
// attach per peer at connect, force it (connect fails where the kernel refuses it), or never
// use it (copy through shared memory). ferry's shm transport moves large messages and RMA this
// way; the UCX transport its RMA to peers on its host where UCX has no RMA lane.
enum class ShmCopy : std::uint8_t { automatic, cma, copy };

// What a registration allows.
enum class Access : std::uint8_t {
  send = 1,          // a local source of send/put
  recv = 2,          // a local destination of recv/get
  remote_read = 4,   // peers may get from it
  remote_write = 8,  // peers may put into it
};
constexpr Access operator|(Access a, Access b) noexcept {
  return static_cast<Access>(static_cast<std::uint8_t>(a) | static_cast<std::uint8_t>(b));
}
constexpr bool has(Access set, Access bit) noexcept {
  return (static_cast<std::uint8_t>(set) & static_cast<std::uint8_t>(bit)) != 0;
}

// A backend's record of one registered memory range; opaque to the core.
class Registration {
 public:
  virtual ~Registration() = default;
  // What a peer needs to name this range in RMA (with its address, per rma_virtual_address).
  virtual std::uint64_t key() const noexcept = 0;
  // What a local post of a buffer in this range passes as `desc` (null when not needed).
  virtual void* desc() const noexcept = 0;
};

// How long a backend lets its provider complete a failed peer's operations itself before it
// reports them abandoned (Transport::peer_failed). Teardown after a failure waits a little
// longer, so every such operation is finished before the device goes.
inline constexpr int kAbandonGraceMs = 1000;

// One completion, success or error.
struct Event {
  OpContext* context = nullptr;  // the post's context; remote_write: null unless it used up a receive
  std::size_t length = 0;   // recv: bytes received; remote_write: bytes written
  std::uint64_t data = 0;   // remote_write: the put_data's data
  std::int32_t rank = -1;   // the peer: the sender of a recv or remote_write, the target of a post; -1 unknown
  std::int32_t error = 0;   // 0, or a negative errno value (-EMSGSIZE: truncated, -ECANCELED, -EIO, ...)
  bool remote_write = false;
  // A message of a lent backend (Receives::lent; context null): its `length` bytes in the
  // backend's own memory, readable until the next poll of this transport (or, delivered
  // inline, until the sink returns). Another process may still write there: copy before
  // checking.
  const unsigned char* lent = nullptr;
  // An operation to a failed peer that the transport gave up on (error -EHOSTDOWN), see
  // Transport::peer_failed: the backend may still hold the context, so the core must never
  // reuse its memory.
  bool abandoned = false;
};
// Plain data, so a poll array may be raw storage in which the events are created implicitly.
static_assert(std::is_aggregate_v<Event> && std::is_trivially_copyable_v<Event> && std::is_trivially_destructible_v<Event>);

// Where a transport that connects on first use (Transport::connect_on_demand) learns a peer's
// address: 0 and the address; -EAGAIN when it cannot be read now (another thread is reading the
// bootstrap: the post answers retry); another negative errno value when it cannot be had (the
// post fails as to a failed peer). Never throws; any thread may call it, concurrently.
using AddressLookup = std::function<int(int rank, std::string& address)>;

// Where a transport that delivers inline (Caps::delivers_inline) hands an arrived message.
struct InlineSink {
  void (*deliver)(void* owner, void* link, const Event& e) = nullptr;
  void* owner = nullptr;
  void* link = nullptr;
};

class Transport {
 public:
  virtual ~Transport() = default;
  const Caps& caps() const noexcept { return caps_; }

  // This transport's address, for the bootstrap's exchange ("" when it has none to give).
  virtual std::string address() const = 0;
  // addresses[r] is rank r's address on this transport, or "" for ranks another transport
  // reaches; afterwards posts to every rank with an address work.
  virtual void connect(const std::vector<std::string>& addresses) = 0;
  // Connect on first use (FERRY_CONNECT=lazy), called in place of connect(): the ranks with
  // reached[r] are this transport's, and each is connected (its address read through `lookup`,
  // its endpoint made) by the first post to it, from any thread. A post that finds another
  // thread connecting a peer answers -EAGAIN; a post to a connected peer pays one load more
  // than under connect(). A message from a peer not yet connected arrives as from any other
  // (the core names its sender from the header). Returns false where the backend cannot (it
  // names senders from the addresses it holds, FI_SOURCE): the core then calls connect().
  virtual bool connect_on_demand(const std::vector<bool>& /*reached*/, AddressLookup /*lookup*/) { return false; }
  // Peers connected so far, after connect_on_demand (for the footprint; relaxed).
  virtual std::size_t peers_connected() const noexcept { return 0; }
  // Whether this transport has connected `rank` (after connect_on_demand; any thread).
  virtual bool has_endpoint(int /*rank*/) const noexcept { return true; }
  // Every rank of the job has connected (called after a job-wide fence).
  virtual void connected() {}

  virtual int inject(int rank, const void* buf, std::size_t len) = 0;
  // inject() of [head][body], head_len + body_len <= inject_size; only where caps().gather_inject.
  virtual int inject_parts(int /*rank*/, const void* /*head*/, std::size_t /*head_len*/, const void* /*body*/,
                           std::size_t /*body_len*/) {
    return -ENOSYS;
  }
  virtual int send(int rank, const void* buf, std::size_t len, void* desc, OpContext* ctx) = 0;
  virtual int post_recv(void* buf, std::size_t len, void* desc, OpContext* ctx) = 0;
  virtual int put(int rank, const void* buf, std::size_t len, void* desc, std::uint64_t addr, std::uint64_t key,
                  OpContext* ctx) = 0;
  virtual int put_data(int rank, const void* buf, std::size_t len, void* desc, std::uint64_t data, std::uint64_t addr,
                       std::uint64_t key, OpContext* ctx) = 0;
  virtual int inject_put(int rank, const void* buf, std::size_t len, std::uint64_t addr, std::uint64_t key) = 0;
  virtual int get(int rank, void* buf, std::size_t len, void* desc, std::uint64_t addr, std::uint64_t key,
                  OpContext* ctx) = 0;

  // A get that the target may serve by writing into `buf` itself (its own progress does it),
  // for a caller that knows the target is progressing: one that waits for this read's outcome,
  // as a rendezvous sender waits for its FIN. Same contract and event as get(); the default is
  // get(). Where the destination sits on large pages, a write by the target can be cheaper than
  // a read by the caller (ferry's shm: the single copy pins the destination's pages).
  virtual int get_pushed(int rank, void* buf, std::size_t len, void* desc, std::uint64_t addr, std::uint64_t key,
                         OpContext* ctx) {
    return get(rank, buf, len, desc, addr, key, ctx);
  }

  // Up to `max` events; returns how many. Writes every field of events[0..n): the caller's
  // array may be uninitialized. A lent backend's messages lent by the previous poll are
  // released by this one.
  virtual int poll(Event* events, int max) = 0;
  // A lent backend's polls lend at most `n` messages (the poll lock holder sets it before a
  // poll; a plain store, read by the poll on the same thread).
  void set_lend_limit(int n) noexcept { lend_limit_ = n; }
  int lend_limit() const noexcept { return lend_limit_; }
  // Where caps().delivers_inline: the transport hands arrived messages to `sink` from inside
  // its poll, as soon as they arrive, instead of returning them as events of the poll (the
  // event is the same: a lent one, readable until the sink returns, or a filled posted
  // receive). Which ones is the transport's choice (UCX: those its data callback receives
  // while it holds none back; messages to this rank and held ones still come as poll events),
  // and the order among all of them stays the poll's; a lent backend's sink and poll events
  // together stay within the poll's lend_limit(). The sink runs on the poll lock holder with no
  // lock of the transport's held, may post to this transport (a reply from an active-message
  // handler), but must not poll it. Set once, before the first poll; ignored by a transport
  // without the capability.
  void set_inline_sink(const InlineSink& sink) noexcept { sink_ = sink; }
  // Registers [buf, buf+len). Throws ferry::Error naming the range on failure. The result
  // stays valid until deregister.
  virtual Registration* register_memory(const void* buf, std::size_t len, Access access) = 0;
  virtual void deregister(Registration* r) noexcept { delete r; }
  // Teardown: gives up every posted receive (their events need not be delivered) and, on a
  // lent backend, every message it holds or lent.
  virtual void cancel_all() noexcept = 0;
  // Teardown, after cancel_all: closes the endpoint, so no operation still queued in the
  // backend (a send to a failed peer) touches a registration or a buffer afterwards. Only
  // deregister and the destructor may follow.
  virtual void close() noexcept {}
  // `rank` failed (called by the poll lock holder). A backend whose operations to a failed
  // peer may never complete by themselves (libfabric's shm provider serves a read through the
  // peer's own process) reports each of them, once the backend's own completions had a grace
  // period to arrive, as an event with -EHOSTDOWN and `abandoned` set; it drops any later
  // completion of those contexts. Posts to the rank need no special handling: the core no
  // longer makes them.
  virtual void peer_failed(int /*rank*/) {}
  // How this transport reaches `rank` (after connect), for tools and logs: its name, and what a
  // backend that picks a path per peer picked (UCX's transports, say).
  virtual std::string describe_peer(int /*rank*/) const { return caps_.name; }

 protected:
  Caps caps_;
  int lend_limit_ = 0;
  InlineSink sink_;  // set_inline_sink's; read only where caps_.delivers_inline
};

// "fi_send: Resource temporarily unavailable (-11)"-style text for a post's result.
std::string error_text(const char* call, int rc);

}  // namespace ferry::net
