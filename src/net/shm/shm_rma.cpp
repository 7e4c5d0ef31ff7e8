// shm_rma.cpp — the shared-memory transport's RMA: put, put_data and get by memcpy to
// itself or cross-memory attach at post time; in copy mode put chunks and get requests
// through the target's queue (copy-mode puts that did not fit pushed from later polls, the
// gets this rank answers served from its polls); pushed gets; the target's checks against
// its registrations, and registration itself.
#include "net/shm/shm_transport.hpp"

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstring>
#include <new>

#include "common/log.hpp"
#include "ferry/error.hpp"
#include "net/util/cma.hpp"
#include "net/shm/get_slots.hpp"

namespace ferry::net::shm {

class ShmRegistration final : public Registration {
 public:
  ShmRegistration(std::uintptr_t start, std::size_t len, Access access) : start_(start), len_(len), access_(access) {}
  std::uint64_t key() const noexcept override { return 0; }
  void* desc() const noexcept override { return nullptr; }
  std::uintptr_t start() const noexcept { return start_; }
  std::size_t len() const noexcept { return len_; }
  Access access() const noexcept { return access_; }

 private:
  std::uintptr_t start_;
  std::size_t len_;
  Access access_;
};

// --- RMA -----------------------------------------------------------------------------------

int ShmTransport::put(int rank, const void* buf, std::size_t len, void*, std::uint64_t addr, std::uint64_t,
                      OpContext* ctx) {
  Peer* p = peer(rank);
  if (p == nullptr) return -EHOSTUNREACH;
  switch (p->mode) {
    case Mode::self:
      if (len > 0) std::memcpy(reinterpret_cast<void*>(static_cast<std::uintptr_t>(addr)), buf, len);
      complete(ctx, len, rank, 0);
      return 0;
    case Mode::cma:
      complete(ctx, len, rank, cma_write(p->pid, buf, len, addr));
      return 0;
    default:
      return start_copy_put(rank, buf, len, addr, false, 0, ctx);
  }
}

int ShmTransport::put_data(int rank, const void* buf, std::size_t len, void*, std::uint64_t data,
                           std::uint64_t addr, std::uint64_t, OpContext* ctx) {
  Peer* p = peer(rank);
  if (p == nullptr) return -EHOSTUNREACH;
  if (p->mode == Mode::copy) return start_copy_put(rank, buf, len, addr, true, data, ctx);
  // The write, then the notice. The notice's cell is claimed only after the write: a claimed
  // cell holds up the target's queue until published, and a large write takes milliseconds.
  int rc = 0;
  if (p->mode == Mode::self) {
    if (len > 0) std::memcpy(reinterpret_cast<void*>(static_cast<std::uintptr_t>(addr)), buf, len);
  } else {
    rc = cma_write(p->pid, buf, len, addr);
  }
  if (rc != 0) {
    complete(ctx, len, rank, rc);
    return 0;
  }
  auto* n = new (ctx->backend) PutNode{};
  n->ctx = ctx;
  n->src = static_cast<const unsigned char*>(buf);
  n->len = len;
  n->done = len;  // the data is there: only the notice is left
  n->addr = addr;
  n->data = data;
  n->rank = rank;
  n->notify = 1;
  if (push_put(*n)) {
    complete(ctx, len, rank, 0);
  } else {
    outbound_.push(n);  // the target's queue is full: the notice follows from a later poll
  }
  return 0;
}

int ShmTransport::inject_put(int rank, const void* buf, std::size_t len, std::uint64_t addr, std::uint64_t) {
  Peer* p = peer(rank);
  if (p == nullptr) return -EHOSTUNREACH;
  switch (p->mode) {
    case Mode::self:
      if (len > 0) std::memcpy(reinterpret_cast<void*>(static_cast<std::uintptr_t>(addr)), buf, len);
      return 0;
    case Mode::cma:
      return cma_write(p->pid, buf, len, addr);
    default: {
      if (len > cell_payload_) return -EMSGSIZE;
      std::uint64_t pos = 0;
      CellHeader* c = p->queue.try_claim(pos, claim_mark_);
      if (c == nullptr) return -EAGAIN;
      c->length = static_cast<std::uint32_t>(len);
      c->rank = rank_;
      c->kind = static_cast<std::uint32_t>(CellKind::put_chunk);
      c->arg0 = addr;
      if (len > 0) std::memcpy(cell_payload(c), buf, len);
      CellQueue::publish(c, pos);
      return 0;
    }
  }
}

int ShmTransport::get(int rank, void* buf, std::size_t len, void*, std::uint64_t addr, std::uint64_t,
                      OpContext* ctx) {
  Peer* p = peer(rank);
  if (p == nullptr) return -EHOSTUNREACH;
  if (p->mode == Mode::self) {
    if (len > 0) std::memcpy(buf, reinterpret_cast<const void*>(static_cast<std::uintptr_t>(addr)), len);
    complete(ctx, len, rank, 0);
    return 0;
  }
  if (p->mode == Mode::cma) {
    complete(ctx, len, rank, cma_read(p->pid, buf, len, addr));
    return 0;
  }
  if (len == 0) {
    complete(ctx, 0, rank, 0);
    return 0;
  }
  return request_get(*p, rank, buf, len, addr, false, ctx);  // copy mode: the target's poll replies
}

int ShmTransport::get_pushed(int rank, void* buf, std::size_t len, void* desc, std::uint64_t addr, std::uint64_t key,
                             OpContext* ctx) {
  Peer* p = peer(rank);
  if (p == nullptr) return -EHOSTUNREACH;
  if (p->mode != Mode::cma || len == 0) return get(rank, buf, len, desc, addr, key, ctx);
  return request_get(*p, rank, buf, len, addr, true, ctx);
}

// A get the target serves from its poll: a slot for the request, then the request's cell
// ([bytes wanted] for a reply in cells, [bytes wanted][destination] for a write).
int ShmTransport::request_get(Peer& p, int rank, void* buf, std::size_t len, std::uint64_t addr, bool push,
                              OpContext* ctx) noexcept {
  const std::uint64_t start = get_hint_.fetch_add(1, std::memory_order_relaxed);
  GetSlot* slot = nullptr;
  std::size_t index = 0;
  std::uint64_t gen = 0;
  for (std::size_t i = 0; i < kGetSlots && slot == nullptr; ++i) {
    index = static_cast<std::size_t>((start + i) & (kGetSlots - 1));
    GetSlot& s = gets_[index];
    std::uint64_t st = s.state.load(std::memory_order_relaxed);
    if ((st & 3) == kSlotFree &&
        s.state.compare_exchange_strong(st, st | kSlotClaimed, std::memory_order_acquire, std::memory_order_relaxed)) {
      slot = &s;
      gen = st >> 2;
    }
  }
  if (slot == nullptr) return -EAGAIN;
  std::uint64_t pos = 0;
  CellHeader* c = p.queue.try_claim(pos, claim_mark_);
  if (c == nullptr) {
    slot->state.store(gen << 2 | kSlotFree, std::memory_order_release);
    return -EAGAIN;
  }
  slot->ctx = ctx;
  slot->buf = static_cast<unsigned char*>(buf);
  slot->len = len;
  slot->received = 0;
  slot->rank = rank;
  slot->state.store(gen << 2 | kSlotArmed, std::memory_order_release);
  const std::uint64_t request[2] = {len, reinterpret_cast<std::uintptr_t>(buf)};
  c->length = push ? sizeof request : sizeof request[0];
  c->rank = rank_;
  c->kind = static_cast<std::uint32_t>(CellKind::get_request);
  c->arg0 = addr;
  c->arg1 = (gen << kGetSlotBits) | index;
  std::memcpy(cell_payload(c), request, c->length);
  CellQueue::publish(c, pos);
  return 0;
}

int ShmTransport::start_copy_put(int rank, const void* buf, std::size_t len, std::uint64_t addr, bool notify,
                                 std::uint64_t data, OpContext* ctx) noexcept {
  auto* n = new (ctx->backend) PutNode{};
  n->ctx = ctx;
  n->src = static_cast<const unsigned char*>(buf);
  n->len = len;
  n->addr = addr;
  n->data = data;
  n->rank = rank;
  n->notify = notify ? 1 : 0;
  if (push_put(*n)) {
    complete(ctx, len, rank, 0);
  } else {
    outbound_.push(n);  // the rest goes out from this transport's polls
  }
  return 0;
}

// Pushes as much of a copy-mode put as the target's queue takes; true once all of it (and
// its notice) is in. One thread at a time per node: the poster, then the poll-lock holder.
bool ShmTransport::push_put(PutNode& n) noexcept {
  CellQueue& q = peers_[static_cast<std::size_t>(n.rank)].queue;
  while (n.done < n.len) {
    std::uint64_t pos = 0;
    CellHeader* c = q.try_claim(pos, claim_mark_);
    if (c == nullptr) return false;
    const std::uint64_t rest = n.len - n.done;
    const auto chunk = static_cast<std::uint32_t>(rest < cell_payload_ ? rest : cell_payload_);
    c->length = chunk;
    c->rank = rank_;
    c->kind = static_cast<std::uint32_t>(CellKind::put_chunk);
    c->arg0 = n.addr + n.done;
    if (chunk > 0) std::memcpy(cell_payload(c), n.src + n.done, chunk);
    CellQueue::publish(c, pos);
    n.done += chunk;
  }
  if (n.notify != 0) {
    std::uint64_t pos = 0;
    CellHeader* c = q.try_claim(pos, claim_mark_);
    if (c == nullptr) return false;
    c->length = 0;
    c->rank = rank_;
    c->kind = static_cast<std::uint32_t>(CellKind::remote_write);
    c->arg0 = n.data;
    c->arg1 = n.len;
    // The release orders the data before the notice: chunks sit earlier in this queue; a
    // memcpy or process_vm_writev (the kernel's stores, made on this thread's behalf before
    // it returned) happened before on this thread.
    CellQueue::publish(c, pos);
    n.notify = 0;
  }
  return true;
}

void ShmTransport::progress_puts() noexcept {
  while (PutNode* n = outbound_.pop()) {
    n->next.store(nullptr, std::memory_order_relaxed);  // the queue is done with it: our list's link now
    if (puts_tail_ != nullptr) {
      puts_tail_->next.store(n, std::memory_order_relaxed);
    } else {
      puts_head_ = n;
    }
    puts_tail_ = n;
  }
  PutNode* prev = nullptr;
  for (PutNode* n = puts_head_; n != nullptr;) {
    PutNode* next = n->next.load(std::memory_order_relaxed);
    if (push_put(*n)) {
      if (prev != nullptr) {
        prev->next.store(next, std::memory_order_relaxed);
      } else {
        puts_head_ = next;
      }
      if (puts_tail_ == n) puts_tail_ = prev;
      complete(n->ctx, n->len, n->rank, 0);  // reuses n's bytes: read everything first
    } else {
      prev = n;
    }
    n = next;
  }
}

void ShmTransport::progress_serves() noexcept {
  for (auto it = serves_.begin(); it != serves_.end();) {
    Serve& s = *it;
    // A failed requester's queue may never drain: its requests are dropped.
    if (!failed_.empty() && failed_[static_cast<std::size_t>(s.rank)] != 0) {
      it = serves_.erase(it);
      continue;
    }
    CellQueue& q = peers_[static_cast<std::size_t>(s.rank)].queue;
    if (s.push) {
      it = serve_push(s, q) ? serves_.erase(it) : it + 1;
      continue;
    }
    bool finished = false;
    for (;;) {
      std::uint64_t pos = 0;
      CellHeader* c = q.try_claim(pos, claim_mark_);
      if (c == nullptr) break;
      const std::uint64_t rest = s.len - s.offset;
      const auto chunk = static_cast<std::uint32_t>(s.error != 0 ? 0 : rest < cell_payload_ ? rest : cell_payload_);
      c->length = chunk;
      c->rank = rank_;
      c->kind = static_cast<std::uint32_t>(CellKind::get_reply);
      c->aux = static_cast<std::uint32_t>(s.error);
      c->arg0 = s.id;
      c->arg1 = s.offset;
      if (chunk > 0) {
        std::memcpy(cell_payload(c), reinterpret_cast<const void*>(static_cast<std::uintptr_t>(s.addr + s.offset)),
                    chunk);
      }
      CellQueue::publish(c, pos);
      s.offset += chunk;
      if (s.error != 0 || s.offset >= s.len) {
        finished = true;
        break;
      }
    }
    it = finished ? serves_.erase(it) : it + 1;
  }
}

// A pushed get: one process_vm_writev into the requester's destination (once), then the
// notice that it is done, when the requester's queue has a cell for it. True when sent.
bool ShmTransport::serve_push(Serve& s, CellQueue& q) noexcept {
  if (s.offset == 0 && s.error == 0) {
    const int rc = cma_write(peers_[static_cast<std::size_t>(s.rank)].pid,
                             reinterpret_cast<const void*>(static_cast<std::uintptr_t>(s.addr)), s.len, s.dest);
    if (rc != 0) {
      FERRY_LOG(warn, "shm: writing %" PRIu64 " bytes that rank %d asked for failed: %s", s.len, s.rank,
                std::strerror(-rc));
      s.error = -rc;
    }
    s.offset = s.len;  // written (or failed): only the notice is left
  }
  std::uint64_t pos = 0;
  CellHeader* c = q.try_claim(pos, claim_mark_);
  if (c == nullptr) return false;
  c->length = 0;
  c->rank = rank_;
  c->kind = static_cast<std::uint32_t>(CellKind::get_done);
  c->aux = static_cast<std::uint32_t>(s.error);
  c->arg0 = s.id;
  c->arg1 = s.error == 0 ? s.len : 0;
  // The release orders the write before the notice: process_vm_writev's stores were made on
  // this thread's behalf before it returned.
  CellQueue::publish(c, pos);
  return true;
}

bool ShmTransport::region_allows(std::uint64_t addr, std::uint64_t len, Access need) noexcept {
  const auto a = static_cast<std::uintptr_t>(addr);
  if (addr > UINTPTR_MAX || len > UINTPTR_MAX - a) return false;
  std::lock_guard<std::mutex> lock(regions_mutex_);
  auto it = regions_.upper_bound(a);  // regions starting at or before a are candidates
  while (it != regions_.begin()) {
    --it;
    if (a + len <= it->second.end && has(it->second.access, need)) return true;
  }
  return false;
}

void ShmTransport::on_put_chunk(CellHeader* c, std::uint32_t len, int src) noexcept {
  const std::uint64_t addr = c->arg0;
  if (!region_allows(addr, len, Access::remote_write)) {
    FERRY_LOG(error, "shm: dropped a %u-byte put from rank %d to 0x%" PRIx64 ": not inside a region registered for remote writes",
              len, src, addr);
    return;
  }
  if (len > 0) std::memcpy(reinterpret_cast<void*>(static_cast<std::uintptr_t>(addr)), cell_payload(c), len);
}

void ShmTransport::on_get_request(CellHeader* c, std::uint32_t len, int src) noexcept {
  Serve s{};
  s.rank = src;
  s.addr = c->arg0;
  s.id = c->arg1;
  const Mode mode = peers_[static_cast<std::size_t>(src)].mode;
  if ((len != sizeof(std::uint64_t) && len != 2 * sizeof(std::uint64_t)) || mode == Mode::none) {
    FERRY_LOG(warn, "shm: skipped a malformed get request from rank %d", src);
    return;
  }
  std::uint64_t request[2] = {0, 0};
  std::memcpy(request, cell_payload(c), len);
  s.len = request[0];
  if (len == sizeof request) {
    // A write into the requester: only where this rank reaches it by cross-memory attach (the
    // kernel then checks the destination is the requester's own writable memory).
    s.push = true;
    s.dest = request[1];
    if (mode != Mode::cma && mode != Mode::self) {
      FERRY_LOG(error, "shm: refused a %" PRIu64 "-byte pushed get by rank %d: no cross-memory attach to it", s.len,
                src);
      s.error = EOPNOTSUPP;
    }
  }
  if (!region_allows(s.addr, s.len, Access::remote_read)) {
    FERRY_LOG(error, "shm: refused a %" PRIu64 "-byte get by rank %d from 0x%" PRIx64
              ": not inside a region registered for remote reads", s.len, src, s.addr);
    s.error = EACCES;
  }
  try {
    serves_.push_back(s);
  } catch (...) {
    FERRY_LOG(error, "shm: out of memory queueing a get by rank %d", src);
  }
}

bool ShmTransport::on_get_done(CellHeader* c, int src, Event& ev) noexcept {
  const std::uint64_t id = c->arg0;
  const std::uint64_t written = c->arg1;
  const std::uint32_t error = c->aux;
  GetSlot& s = gets_[static_cast<std::size_t>(id & (kGetSlots - 1))];
  const std::uint64_t st = s.state.load(std::memory_order_acquire);
  const std::uint64_t gen = st >> 2;
  if ((st & 3) != kSlotArmed || gen != id >> kGetSlotBits || s.rank != src || s.received != 0 ||
      (error == 0 && written != s.len)) {
    FERRY_LOG(warn, "shm: dropped a get notice from rank %d that matches no outstanding pushed get", src);
    return false;
  }
  ev = Event{};
  ev.context = s.ctx;
  ev.rank = s.rank;
  ev.error = error == 0 ? 0 : error < 4096 ? -static_cast<int>(error) : -EIO;
  ev.length = error == 0 ? s.len : 0;
  s.state.store((gen + 1) << 2 | kSlotFree, std::memory_order_release);
  return true;
}

// Gets outstanding at a failed rank are given up once its process is gone, or after the grace
// period (a rank failed by its keepalive may still be running, and still write). A late reply
// finds its slot's generation moved on and is dropped; the caller never reuses the memory of
// an abandoned get (Event::abandoned).
int ShmTransport::abandon_gets(Event* events, int max) noexcept {
  const auto now = std::chrono::steady_clock::now();
  if (now < next_abandon_check_) return 0;
  next_abandon_check_ = now + std::chrono::milliseconds(1);
  int n = 0;
  for (auto it = failing_.begin(); it != failing_.end();) {
    if (now < it->deadline && peer_alive(it->rank)) {
      ++it;
      continue;
    }
    bool all = true;
    const int before = n;
    for (std::size_t i = 0; i < kGetSlots; ++i) {
      GetSlot& s = gets_[i];
      const std::uint64_t st = s.state.load(std::memory_order_acquire);
      if ((st & 3) != kSlotArmed || s.rank != it->rank) continue;
      if (n == max) {
        all = false;
        break;
      }
      Event& ev = events[n++];
      ev = Event{};
      ev.context = s.ctx;
      ev.rank = s.rank;
      ev.error = -EHOSTDOWN;
      ev.abandoned = true;
      s.state.store(((st >> 2) + 1) << 2 | kSlotFree, std::memory_order_release);
    }
    it->abandoned += n - before;
    if (!all) break;
    if (it->abandoned != 0) {
      FERRY_LOG(warn, "shm: gave up %d get(s) outstanding at failed rank %d", it->abandoned, it->rank);
    }
    it = failing_.erase(it);
  }
  return n;
}

bool ShmTransport::on_get_reply(CellHeader* c, std::uint32_t len, int src, Event& ev) noexcept {
  const std::uint64_t id = c->arg0;
  const std::uint64_t offset = c->arg1;
  const std::uint32_t error = c->aux;
  GetSlot& s = gets_[static_cast<std::size_t>(id & (kGetSlots - 1))];
  const std::uint64_t st = s.state.load(std::memory_order_acquire);
  const std::uint64_t gen = st >> 2;
  if ((st & 3) != kSlotArmed || gen != id >> kGetSlotBits || s.rank != src) {
    FERRY_LOG(warn, "shm: dropped a get reply from rank %d that matches no outstanding get", src);
    return false;
  }
  int rc = 0;
  if (error != 0) {
    rc = error < 4096 ? -static_cast<int>(error) : -EIO;
  } else if (offset > s.len || len > s.len - offset) {
    FERRY_LOG(warn, "shm: dropped a get reply from rank %d outside its request", src);
    return false;
  } else {
    if (len > 0) std::memcpy(s.buf + offset, cell_payload(c), len);
    s.received += len;
    if (s.received < s.len) return false;
  }
  ev = Event{};
  ev.context = s.ctx;
  ev.length = rc == 0 ? s.len : 0;
  ev.rank = s.rank;
  ev.error = rc;
  s.state.store((gen + 1) << 2 | kSlotFree, std::memory_order_release);
  return true;
}

// --- Registration --------------------------------------------------------------------------

Registration* ShmTransport::register_memory(const void* buf, std::size_t len, Access access) {
  if (buf == nullptr && len > 0) {
    throw Error("shm transport: register_memory of a null buffer with length " + std::to_string(len));
  }
  const auto start = reinterpret_cast<std::uintptr_t>(buf);
  if (len > UINTPTR_MAX - start) {
    throw Error("shm transport: register_memory range at " + std::to_string(start) + " of " + std::to_string(len) +
                " bytes wraps around");
  }
  auto reg = std::make_unique<ShmRegistration>(start, len, access);
  std::lock_guard<std::mutex> lock(regions_mutex_);
  regions_.emplace(start, Region{start + len, access});
  return reg.release();
}

void ShmTransport::deregister(Registration* r) noexcept {
  auto* reg = static_cast<ShmRegistration*>(r);
  if (reg == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(regions_mutex_);
    auto [lo, hi] = regions_.equal_range(reg->start());
    for (auto it = lo; it != hi; ++it) {
      if (it->second.end == reg->start() + reg->len() && it->second.access == reg->access()) {
        regions_.erase(it);
        break;
      }
    }
  }
  delete reg;
}

}  // namespace ferry::net::shm
