#include "net/ofi/ofi_transport.hpp"

#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <cerrno>
#include <chrono>
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <unordered_set>

#include "common/log.hpp"
#include "common/spinlock.hpp"
#include "ferry/error.hpp"
#include "net/util/abandon.hpp"

namespace ferry::net::ofi {

static_assert(sizeof(fi_context2) <= OpContext::kBackendBytes);
static_assert(offsetof(OpContext, backend) == 0,
              "libfabric's context pointer is the OpContext pointer: events need no lookup");

namespace {

constexpr int kMaxPoll = 16;

// libfabric's codes below 256 are errno values; its own (FI_ETRUNC and the like) map to the
// nearest errno, so the core sees one vocabulary whatever the backend.
[[gnu::cold, gnu::noinline]] int to_errno_slow(long rc) noexcept {
  const long e = rc < 0 ? -rc : rc;
  if (e == FI_ETRUNC || e == FI_ETOOSMALL) return -EMSGSIZE;
  if (e == FI_EAVAIL || e == FI_EOTHER || e == FI_ENOKEY || e == FI_EBADFLAGS || e == FI_ENOEQ ||
      e == FI_EDOMAIN || e == FI_ENOCQ || e == FI_ECRC || e == FI_ENOAV || e == FI_EOVERRUN || e >= 256) {
    return -EIO;
  }
  return -static_cast<int>(e);
}

inline int to_errno(long rc) noexcept {
  if (__builtin_expect(rc == 0, 1)) return 0;
  if (rc == -FI_EAGAIN) return -EAGAIN;
  return to_errno_slow(rc);
}

std::uint64_t fi_access(Access a) noexcept {
  std::uint64_t f = 0;
  if (has(a, Access::send)) f |= FI_SEND | FI_WRITE;
  if (has(a, Access::recv)) f |= FI_RECV | FI_READ;
  if (has(a, Access::remote_read)) f |= FI_REMOTE_READ;
  if (has(a, Access::remote_write)) f |= FI_REMOTE_WRITE;
  return f;
}

class OfiRegistration final : public Registration {
 public:
  explicit OfiRegistration(fid_mr* mr) noexcept : mr_(mr) {}
  ~OfiRegistration() override { close_mr(mr_); }
  std::uint64_t key() const noexcept override { return fi_mr_key(mr_); }
  void* desc() const noexcept override { return fi_mr_desc(mr_); }

 private:
  fid_mr* mr_;
};

inline void* fi_ctx(OpContext* ctx) noexcept { return ctx->backend; }

// Whether a provider's registrations pin pages: every one's but those whose core provider (the
// name before a utility layer's, "tcp" in "tcp;ofi_rxm") moves data through sockets or shared
// memory and registers by recording the range.
bool registration_pins(const std::string& provider) {
  const std::string core = provider.substr(0, provider.find(';'));
  return core != "tcp" && core != "sockets" && core != "udp" && core != "net" && core != "shm";
}

class OfiTransport final : public Transport {
 public:
  OfiTransport(Fabric& fabric, int rank) : endpoint_(fabric, 0), rank_(rank) {
    const FabricInfo& f = fabric.caps();
    caps_.name = "ofi/" + f.provider;
    caps_.inject_size = f.inject_size;
    caps_.max_msg_size = f.max_msg_size;
    caps_.max_rma_size = f.max_msg_size;
    caps_.remote_data_bytes = f.cq_data_size;
    caps_.send_queue = f.tx_size;
    caps_.rma_virtual_address = f.mr_virt_addr;
    caps_.local_registration = f.mr_local;
    caps_.remote_data_consumes_recv = f.rx_cq_data;
    caps_.reports_source = f.source;
    caps_.registration_pins = registration_pins(f.provider);
  }

  ~OfiTransport() override = default;

  std::string address() const override { return endpoint_.address(); }

  void connect(const std::vector<std::string>& addresses) override {
    const std::vector<fi_addr_t> to = endpoint_.insert_addresses(addresses);
    make_table(to.size());
    // Published to posts by the job's bootstrap fence, as the addresses are.
    for (std::size_t r = 0; r < to.size(); ++r) to_[r].store(to[r], std::memory_order_relaxed);
    // FI_SOURCE reports fi_addr_t values; the inverse table names their ranks.
    for (std::size_t r = 0; r < to.size(); ++r) {
      if (to[r] == FI_ADDR_NOTAVAIL) continue;
      if (to[r] >= from_.size()) from_.resize(to[r] + 1, -1);
      from_[to[r]] = static_cast<int>(r);
    }
  }

  // FI_SOURCE names a sender by its entry in the address vector: one never inserted would be
  // nameless, so such a provider connects eagerly.
  bool connect_on_demand(const std::vector<bool>& reached, AddressLookup lookup) override {
    if (caps_.reports_source) return false;
    make_table(reached.size());
    reached_ = reached;
    lookup_ = std::move(lookup);
    return true;
  }

  std::size_t peers_connected() const noexcept override { return connected_.load(std::memory_order_relaxed); }
  // Relaxed: finalize's departure asks whether to tell the rank; nothing is read through it.
  bool has_endpoint(int rank) const noexcept override {
    return to_[static_cast<std::size_t>(rank)].load(std::memory_order_relaxed) != FI_ADDR_NOTAVAIL;
  }

  int inject(int rank, const void* buf, std::size_t len) override {
    fi_addr_t a;
    if (const int rc = address_of(rank, a); __builtin_expect(rc != 0, 0)) return rc;
    return to_errno(fi_inject(endpoint_.ep(), buf, len, a));
  }
  int send(int rank, const void* buf, std::size_t len, void* desc, OpContext* ctx) override {
    fi_addr_t a;
    if (const int rc = address_of(rank, a); __builtin_expect(rc != 0, 0)) return rc;
    return to_errno(fi_send(endpoint_.ep(), buf, len, desc, a, fi_ctx(ctx)));
  }
  int post_recv(void* buf, std::size_t len, void* desc, OpContext* ctx) override {
    return to_errno(fi_recv(endpoint_.ep(), buf, len, desc, FI_ADDR_UNSPEC, fi_ctx(ctx)));
  }
  int put(int rank, const void* buf, std::size_t len, void* desc, std::uint64_t addr, std::uint64_t key,
          OpContext* ctx) override {
    fi_addr_t a;
    if (const int rc = address_of(rank, a); __builtin_expect(rc != 0, 0)) return rc;
    track(ctx, rank);
    return tracked_result(ctx, fi_write(endpoint_.ep(), buf, len, desc, a, addr, key, fi_ctx(ctx)));
  }
  int put_data(int rank, const void* buf, std::size_t len, void* desc, std::uint64_t data, std::uint64_t addr,
               std::uint64_t key, OpContext* ctx) override {
    fi_addr_t a;
    if (const int rc = address_of(rank, a); __builtin_expect(rc != 0, 0)) return rc;
    track(ctx, rank);
    return tracked_result(ctx, fi_writedata(endpoint_.ep(), buf, len, desc, data, a, addr, key, fi_ctx(ctx)));
  }
  int inject_put(int rank, const void* buf, std::size_t len, std::uint64_t addr, std::uint64_t key) override {
    fi_addr_t a;
    if (const int rc = address_of(rank, a); __builtin_expect(rc != 0, 0)) return rc;
    return to_errno(fi_inject_write(endpoint_.ep(), buf, len, a, addr, key));
  }
  int get(int rank, void* buf, std::size_t len, void* desc, std::uint64_t addr, std::uint64_t key,
          OpContext* ctx) override {
    fi_addr_t a;
    if (const int rc = address_of(rank, a); __builtin_expect(rc != 0, 0)) return rc;
    track(ctx, rank);
    return tracked_result(ctx, fi_read(endpoint_.ep(), buf, len, desc, a, addr, key, fi_ctx(ctx)));
  }

  void peer_failed(int rank) override {
    saw_failure_ = saw_failure_ || caps_.name.find("ofi_rxm") != std::string::npos;
    rma_.peer_failed(rank);
  }

  int poll(Event* events, int max) override {
    if (__builtin_expect(rma_.busy(), 0)) {
      const int n = rma_.abandon(events, max);
      if (n > 0) return n;
    }
    fi_cq_data_entry entries[kMaxPoll];
    fi_addr_t sources[kMaxPoll];
    if (max > kMaxPoll) max = kMaxPoll;
    const ssize_t n = caps_.reports_source ? fi_cq_readfrom(endpoint_.cq(), entries, max, sources)
                                           : fi_cq_read(endpoint_.cq(), entries, max);
    if (n > 0) {
      int out_n = 0;
      for (ssize_t i = 0; i < n; ++i) {
        const fi_cq_data_entry& e = entries[i];
        const bool remote_write = (e.flags & FI_REMOTE_CQ_DATA) != 0 && (e.flags & FI_REMOTE_WRITE) != 0;
        // Every post ferry makes carries a context: an entry without one (and not a remote
        // write) is not ferry's to dispatch.
        if (e.op_context == nullptr && !remote_write) continue;
        if (!remote_write && settle(static_cast<OpContext*>(e.op_context))) continue;
        Event& out = events[out_n++];
        out.length = e.len;
        out.error = 0;
        out.rank = caps_.reports_source ? rank_of(sources[i]) : -1;
        out.remote_write = remote_write;
        out.abandoned = false;
        out.lent = nullptr;
        out.data = e.data;
        // Only under FI_RX_CQ_DATA does a remote write consume a posted receive and carry its
        // context; otherwise op_context is the provider's own value (shm reports message ids
        // there) and must not be taken for ferry's.
        if (out.remote_write && !caps_.remote_data_consumes_recv) {
          out.context = nullptr;
        } else {
          out.context = static_cast<OpContext*>(e.op_context);
        }
      }
      return out_n;
    }
    if (n != -FI_EAVAIL) return 0;
    fi_cq_err_entry err{};
    if (fi_cq_readerr(endpoint_.cq(), &err, 0) <= 0) return 0;
    // A failed remote write at its target carries the provider's context, not ferry's (unless
    // it used up a posted receive); and an entry without a context is nobody's to finish.
    const bool remote_write = (err.flags & FI_REMOTE_WRITE) != 0;
    if (err.op_context == nullptr || (remote_write && !caps_.remote_data_consumes_recv)) {
      // A peer's failure can produce many (the provider's own operations for it): the first
      // few are shown, the rest counted.
      const std::uint64_t seen = ++anonymous_errors_;
      if (seen <= 3) {
        FERRY_LOG(error, "error completion without an operation of this rank: %s%s", fi_strerror(static_cast<int>(err.err)),
                  seen == 3 ? " (further ones are not shown)" : "");
      }
      return 0;
    }
    if (settle(static_cast<OpContext*>(err.op_context))) return 0;
    Event& out = events[0];
    out.context = static_cast<OpContext*>(err.op_context);
    out.length = err.len;
    out.data = err.data;
    out.rank = -1;
    out.remote_write = false;
    out.error = to_errno(err.err != 0 ? err.err : FI_EIO);
    out.abandoned = false;
    out.lent = nullptr;
    return 1;
  }

  Registration* register_memory(const void* buf, std::size_t len, Access access) override {
    return new OfiRegistration(endpoint_.register_memory(buf, len, fi_access(access)));
  }

  void cancel_all() noexcept override { fi_cancel(&endpoint_.ep()->fid, nullptr); }
  void close() noexcept override {
    if (saw_failure_) endpoint_.abandon(); else endpoint_.close();
  }

 private:
  void make_table(std::size_t n) {
    to_ = std::make_unique<std::atomic<fi_addr_t>[]>(n);
    for (std::size_t r = 0; r < n; ++r) to_[r].store(FI_ADDR_NOTAVAIL, std::memory_order_relaxed);
  }

  // The peer's fi_addr_t: one acquire load, paired with reach()'s release store, so a post that
  // sees an entry also sees its address-vector insert. FI_ADDR_NOTAVAIL: not yet connected.
  int address_of(int rank, fi_addr_t& a) noexcept {
    a = to_[static_cast<std::size_t>(rank)].load(std::memory_order_acquire);
    return __builtin_expect(a != FI_ADDR_NOTAVAIL, 1) ? 0 : reach(rank, a);
  }

  // Connects `rank` on its first post. One thread at a time: a post that finds another one
  // here answers -EAGAIN (retry) rather than wait on a lock.
  [[gnu::cold, gnu::noinline]] int reach(int rank, fi_addr_t& a) noexcept {
    const auto r = static_cast<std::size_t>(rank);
    if (!lookup_ || r >= reached_.size() || !reached_[r]) return -EHOSTUNREACH;  // not this transport's
    std::unique_lock<std::mutex> hold(connect_mutex_, std::try_to_lock);
    if (!hold.owns_lock()) return -EAGAIN;
    a = to_[r].load(std::memory_order_relaxed);  // connected while this thread waited
    if (a != FI_ADDR_NOTAVAIL) return 0;
    std::string address;
    if (const int rc = lookup_(rank, address); rc != 0) return rc;
    if (const int rc = endpoint_.insert_address(address, a); rc != 0) {
      FERRY_LOG(error, "ofi: rank %d's address: %s", rank, fi_strerror(-rc));
      return -EHOSTUNREACH;
    }
    if (rank != rank_) connected_.fetch_add(1, std::memory_order_relaxed);
    to_[r].store(a, std::memory_order_release);
    return 0;
  }

  int rank_of(fi_addr_t a) const noexcept {
    return a < from_.size() ? from_[a] : -1;
  }

  // RMA tracking (net/util/abandon.hpp): posts by any thread.
  void track(OpContext* ctx, int rank) { rma_.track(ctx, rank); }
  int tracked_result(OpContext* ctx, long rc) noexcept {
    if (rc != 0) rma_.untrack(ctx);
    return to_errno(rc);
  }
  // A provider completion of `ctx`: true when it was abandoned already (the event is dropped).
  // A message's completion, with no RMA operation tracked, costs one relaxed load (tracking()).
  bool settle(OpContext* ctx) noexcept { return rma_.tracking() && rma_.settle(ctx); }

  Endpoint endpoint_;
  const int rank_;
  // By rank: written by connect (then read-only), or once per peer by reach().
  std::unique_ptr<std::atomic<fi_addr_t>[]> to_;
  std::vector<int> from_;      // by fi_addr_t; connect's only (FI_SOURCE never connects on demand)
  std::vector<bool> reached_;  // connect_on_demand's: the ranks this transport reaches
  AddressLookup lookup_;
  std::mutex connect_mutex_;  // reach()'s, taken with try_lock
  std::atomic<std::size_t> connected_{0};  // relaxed: a count for the footprint
  std::uint64_t anonymous_errors_ = 0;  // the poll lock holder's
  AbandonTracker rma_;  // RMA operations in flight, and a failed peer's given up
  // A peer failed over rxm: close() leaves the endpoint open (Endpoint::abandon). Other
  // providers close normally (libfabric's shm removes its region only then).
  bool saw_failure_ = false;
};

}  // namespace

std::unique_ptr<Fabric> open_fabric(const std::string& provider) { return std::make_unique<Fabric>(provider); }

std::unique_ptr<Transport> make_transport(Fabric& fabric, int rank) { return std::make_unique<OfiTransport>(fabric, rank); }

}  // namespace ferry::net::ofi
