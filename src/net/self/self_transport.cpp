// self_transport.cpp — the self backend: a rank's messages and RMA to itself, in its own
// memory, with no segment, no endpoint and no system call. FERRY_TRANSPORT=auto routes this
// rank to it, so a single-process job opens nothing else.
//
// Messages: a fixed pool of cells (the device's packet size each, FERRY_SHM_CELLS of them).
// A post takes a free cell (MpmcRing of free cells; none free: -EAGAIN), copies the message
// in and links it onto the arrivals (MpscQueue, intrusive through the cell); poll hands each
// arrival to the oldest posted receive, in arrival order, and returns its cell. Per posting
// thread the arrivals keep their order (both queues are FIFO per producer).
// RMA: done at post time with one memcpy, after checking the key names a registration that
// covers the range with the access asked; the local completion, and a put_data's remote event,
// come from the next poll.
//
// Concurrency (transport.hpp's contract): posts from any thread at once; post_recv, poll and
// cancel_all by the poll lock holder. The registration table is read by posts and written by
// register/deregister under a spin lock (RMA's set-up and check, never a message's path).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "common/mpmc_ring.hpp"
#include "common/mpsc_queue.hpp"
#include "common/queue_support.hpp"
#include "common/spinlock.hpp"
#include "ferry/error.hpp"
#include "net/backend.hpp"

namespace ferry::net {

namespace {

enum class CellKind : std::uint8_t { message, remote_write };

struct Cell {
  std::atomic<Cell*> next{nullptr};  // MpscQueue's link
  CellKind kind = CellKind::message;
  std::uint32_t length = 0;
  std::uint64_t data = 0;  // remote_write: the put_data's data
  unsigned char* payload = nullptr;
};

// What a post keeps in its OpContext's backend bytes: a local completion waiting for poll, or
// a posted receive waiting for a message.
struct Done {
  std::atomic<Done*> next{nullptr};
  OpContext* ctx = nullptr;
  std::uint64_t length = 0;
  std::int32_t error = 0;
};
struct Posted {
  Posted* next = nullptr;
  OpContext* ctx = nullptr;
  void* buf = nullptr;
  std::size_t len = 0;
};
static_assert(sizeof(Done) <= OpContext::kBackendBytes && sizeof(Posted) <= OpContext::kBackendBytes);

class SelfRegistration final : public Registration {
 public:
  SelfRegistration(std::uint64_t key, const void* buf, std::size_t len, Access access) noexcept
      : key_(key), begin_(reinterpret_cast<std::uintptr_t>(buf)), len_(len), access_(access) {}
  std::uint64_t key() const noexcept override { return key_; }
  void* desc() const noexcept override { return nullptr; }
  bool covers(std::uint64_t addr, std::size_t len, Access need) const noexcept {
    return has(access_, need) && addr >= begin_ && len <= len_ && addr - begin_ <= len_ - len;
  }

 private:
  std::uint64_t key_;
  std::uintptr_t begin_;
  std::size_t len_;
  Access access_;
};

class SelfTransport final : public Transport {
 public:
  SelfTransport(const TransportParams& p, std::size_t cells)
      : rank_(p.rank), cell_payload_(p.packet_size), cells_(std::max<std::size_t>(cells, 2)), free_(cells_.size()),
        payloads_(new unsigned char[cells_.size() * cell_payload_]) {
    if (p.packet_size == 0) throw Error("self: packet_size=0; a message needs at least one byte of room");
    for (std::size_t i = 0; i < cells_.size(); ++i) {
      cells_[i].payload = payloads_.get() + i * cell_payload_;
      if (!free_.try_push(&cells_[i])) throw Error("self: the free-cell ring refused a cell at set-up");
    }
    returned_.reserve(cells_.size());
    caps_.name = "self";
    caps_.inject_size = cell_payload_;
    caps_.max_msg_size = cell_payload_;
    caps_.max_rma_size = std::size_t{1} << 40;
    caps_.remote_data_bytes = 8;
    caps_.rma_virtual_address = true;
    caps_.reports_source = true;
    caps_.one_copy_get = true;
  }

  ~SelfTransport() override {
    for (SelfRegistration* r : registrations_) delete r;
  }

  std::string address() const override { return "self"; }
  void connect(const std::vector<std::string>& addresses) override {
    for (std::size_t r = 0; r < addresses.size(); ++r) {
      if (!addresses[r].empty() && static_cast<int>(r) != rank_) {
        throw Error("self: asked to connect rank " + std::to_string(r) + "; the self backend reaches only rank " +
                    std::to_string(rank_));
      }
    }
  }

  int inject(int rank, const void* buf, std::size_t len) override {
    if (rank != rank_) return -EHOSTUNREACH;
    if (len > cell_payload_) return -EMSGSIZE;
    Cell* c = nullptr;
    if (!free_.try_pop(c)) return -EAGAIN;
    std::memcpy(c->payload, buf, len);
    c->kind = CellKind::message;
    c->length = static_cast<std::uint32_t>(len);
    arrivals_.push(c);
    return 0;
  }

  int send(int rank, const void* buf, std::size_t len, void*, OpContext* ctx) override {
    const int rc = inject(rank, buf, len);
    if (rc == 0) complete(ctx, len, 0);
    return rc;
  }

  int post_recv(void* buf, std::size_t len, void*, OpContext* ctx) override {
    auto* p = new (ctx->backend) Posted{nullptr, ctx, buf, len};
    if (recv_tail_ == nullptr) {
      recv_head_ = p;
    } else {
      recv_tail_->next = p;
    }
    recv_tail_ = p;
    return 0;
  }

  int put(int rank, const void* buf, std::size_t len, void*, std::uint64_t addr, std::uint64_t key,
          OpContext* ctx) override {
    const int rc = inject_put(rank, buf, len, addr, key);
    if (rc == 0) complete(ctx, len, 0);
    return rc;
  }

  int put_data(int rank, const void* buf, std::size_t len, void*, std::uint64_t data, std::uint64_t addr,
               std::uint64_t key, OpContext* ctx) override {
    Cell* c = nullptr;
    if (rank != rank_) return -EHOSTUNREACH;
    if (!free_.try_pop(c)) return -EAGAIN;
    const int rc = inject_put(rank, buf, len, addr, key);
    if (rc != 0) {
      free_cell(c);
      return rc;
    }
    c->kind = CellKind::remote_write;
    c->length = static_cast<std::uint32_t>(std::min<std::size_t>(len, UINT32_MAX));
    c->data = data;
    complete(ctx, len, 0);
    arrivals_.push(c);  // after the bytes: the remote event comes after the write is visible
    return 0;
  }

  int inject_put(int rank, const void* buf, std::size_t len, std::uint64_t addr, std::uint64_t key) override {
    if (rank != rank_) return -EHOSTUNREACH;
    if (len > caps_.max_rma_size) return -EMSGSIZE;
    if (!covered(addr, len, key, Access::remote_write)) return -EACCES;
    std::memmove(reinterpret_cast<void*>(addr), buf, len);
    return 0;
  }

  int get(int rank, void* buf, std::size_t len, void*, std::uint64_t addr, std::uint64_t key,
          OpContext* ctx) override {
    if (rank != rank_) return -EHOSTUNREACH;
    if (len > caps_.max_rma_size) return -EMSGSIZE;
    if (!covered(addr, len, key, Access::remote_read)) return -EACCES;
    std::memmove(buf, reinterpret_cast<const void*>(addr), len);
    complete(ctx, len, 0);
    return 0;
  }

  int poll(Event* events, int max) override {
    // Cells a busy free ring refused last time go back first.
    while (!returned_.empty() && free_.try_push(returned_.back())) returned_.pop_back();
    int n = 0;
    while (n < max) {
      Done* d = done_.pop();
      if (d == nullptr) break;
      events[n++] = Event{.context = d->ctx, .length = d->length, .rank = rank_, .error = d->error};
    }
    while (n < max) {
      Cell* c = held_ != nullptr ? held_ : arrivals_.pop();
      held_ = nullptr;
      if (c == nullptr) break;
      if (c->kind == CellKind::remote_write) {
        events[n++] = Event{.length = c->length, .data = c->data, .rank = rank_, .remote_write = true};
        free_cell(c);
        continue;
      }
      Posted* p = recv_head_;
      if (p == nullptr) {  // no receive posted: the message waits for one
        held_ = c;
        break;
      }
      recv_head_ = p->next;
      if (recv_head_ == nullptr) recv_tail_ = nullptr;
      const bool fits = c->length <= p->len;
      std::memcpy(p->buf, c->payload, fits ? c->length : p->len);
      events[n++] = Event{.context = p->ctx, .length = fits ? c->length : p->len, .rank = rank_,
                          .error = fits ? 0 : -EMSGSIZE};
      free_cell(c);
    }
    return n;
  }

  Registration* register_memory(const void* buf, std::size_t len, Access access) override {
    SpinGuard guard(lock_);
    auto* r = new SelfRegistration(next_key_++, buf, len, access);
    registrations_.push_back(r);
    return r;
  }

  void deregister(Registration* r) noexcept override {
    {
      SpinGuard guard(lock_);
      registrations_.erase(std::remove(registrations_.begin(), registrations_.end(), r), registrations_.end());
    }
    delete r;
  }

  void cancel_all() noexcept override { recv_head_ = recv_tail_ = nullptr; }

 private:
  void complete(OpContext* ctx, std::size_t length, int error) noexcept {
    done_.push(new (ctx->backend) Done{{nullptr}, ctx, length, error});
  }
  void free_cell(Cell* c) noexcept {
    // returned_ has room for every cell, so the fallback never allocates.
    if (!free_.try_push(c)) returned_.push_back(c);
  }
  bool covered(std::uint64_t addr, std::size_t len, std::uint64_t key, Access need) {
    SpinGuard guard(lock_);
    for (const SelfRegistration* r : registrations_) {
      if (r->key() == key) return r->covers(addr, len, need);
    }
    return false;
  }

  using SpinGuard = std::lock_guard<detail::SpinLock>;

  const int rank_;
  const std::size_t cell_payload_;
  std::vector<Cell> cells_;
  detail::MpmcRing<Cell*> free_;
  std::unique_ptr<unsigned char[]> payloads_;
  detail::MpscQueue<Cell> arrivals_;
  detail::MpscQueue<Done> done_;
  // The poll lock holder's alone:
  Cell* held_ = nullptr;  // an arrival popped while no receive was posted
  Posted* recv_head_ = nullptr;
  Posted* recv_tail_ = nullptr;
  std::vector<Cell*> returned_;
  detail::SpinLock lock_;  // guards registrations_ and next_key_
  std::vector<SelfRegistration*> registrations_;
  std::uint64_t next_key_ = 1;
};

class SelfBackend final : public Backend {
 public:
  // Its queue is as deep as a shared-memory receive queue (the shm backend's row shm_cells,
  // which says so): a rank alone on its host sees the same back-pressure as one with neighbours.
  explicit SelfBackend(const OpenParams& p) : cells_(detail::round_up_pow2(p.option("shm_cells").number)) {}
  std::unique_ptr<Transport> make_transport(const TransportParams& p) override {
    return std::make_unique<SelfTransport>(p, cells_);
  }
  std::string provider() const override { return "none"; }

 private:
  std::size_t cells_;
};

const BackendInfo kSelf{
    "self",
    "a rank to itself, in its own memory (FERRY_TRANSPORT=auto's route to this rank)",
    unsigned(Reach::self),
    [](const OpenParams& p) -> std::unique_ptr<Backend> { return std::make_unique<SelfBackend>(p); },
    [](bool) { return std::vector<Fact>{}; },
};

}  // namespace

const BackendInfo* builtin_backend_self() noexcept { return &kSelf; }

}  // namespace ferry::net
