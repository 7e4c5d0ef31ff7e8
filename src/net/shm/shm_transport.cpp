// shm_transport.cpp — the shared-memory transport (design in shm_transport.hpp).
#include "net/shm/shm_transport.hpp"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <new>

#include "common/log.hpp"
#include "common/small_copy.hpp"
#include "ferry/error.hpp"
#include "net/shm/cma.hpp"

namespace ferry::net {

const char* to_string(ShmCopy c) noexcept {
  switch (c) {
    case ShmCopy::automatic: return "auto";
    case ShmCopy::cma: return "cma";
    case ShmCopy::copy: return "copy";
  }
  return "?";
}

std::unique_ptr<Transport> make_shm_transport(const ShmParams& p) { return std::make_unique<shm::ShmTransport>(p); }

namespace shm {

namespace {

// Outstanding copy-mode gets per transport; a request id is (generation << kGetSlotBits) | slot.
constexpr unsigned kGetSlotBits = 10;
constexpr std::size_t kGetSlots = std::size_t{1} << kGetSlotBits;
// GetSlot::state = (generation << 2) | phase.
constexpr std::uint64_t kSlotFree = 0, kSlotClaimed = 1, kSlotArmed = 2;

const ShmParams& checked(const ShmParams& p) {
  const auto bad = [](const std::string& what) { return Error("shm transport: " + what); };
  if (p.size < 1) throw bad("size " + std::to_string(p.size) + " must be at least 1");
  if (p.rank < 0 || p.rank >= p.size) {
    throw bad("rank " + std::to_string(p.rank) + " is outside [0, " + std::to_string(p.size) + ")");
  }
  if (p.device < 0) throw bad("device " + std::to_string(p.device) + " is negative");
  if (p.cell_payload < 8 || p.cell_payload > (std::size_t{1} << 24)) {
    throw bad("cell_payload " + std::to_string(p.cell_payload) + " is outside [8, 16777216] bytes");
  }
  if (p.cells < 2 || p.cells > (std::size_t{1} << 24) || (p.cells & (p.cells - 1)) != 0) {
    throw bad("cells " + std::to_string(p.cells) + " is not a power of two in [2, 16777216]");
  }
  if (p.copy != ShmCopy::automatic && p.copy != ShmCopy::cma && p.copy != ShmCopy::copy) {
    throw bad("copy mode " + std::to_string(static_cast<int>(p.copy)) + " is not auto, cma or copy");
  }
  return p;
}

// "shm1;<segment name>;<pid>;<rank>;<device>;<probe address, hex>"
struct Address {
  std::string name;
  long long pid = 0, rank = 0, device = 0;
  std::uint64_t probe = 0;
};

bool parse_address(const std::string& s, Address& a) {
  std::vector<std::string> f;
  std::size_t start = 0;
  for (;;) {
    const std::size_t semi = s.find(';', start);
    f.push_back(s.substr(start, semi == std::string::npos ? std::string::npos : semi - start));
    if (semi == std::string::npos) break;
    start = semi + 1;
  }
  if (f.size() != 6 || f[0] != "shm1") return false;
  const auto num = [](const std::string& t, int base, unsigned long long& out) {
    if (t.empty() || t.size() > 20) return false;
    char* end = nullptr;
    errno = 0;
    out = std::strtoull(t.c_str(), &end, base);
    return errno == 0 && end != nullptr && *end == '\0' && t[0] != '-';
  };
  unsigned long long pid = 0, rank = 0, device = 0, probe = 0;
  if (!num(f[2], 10, pid) || !num(f[3], 10, rank) || !num(f[4], 10, device) || !num(f[5], 16, probe)) return false;
  if (pid == 0 || pid > 0x7fffffffULL || rank > 0x7fffffffULL || device > 0x7fffffffULL) return false;
  a.name = f[1];
  a.pid = static_cast<long long>(pid);
  a.rank = static_cast<long long>(rank);
  a.device = static_cast<long long>(device);
  a.probe = probe;
  return true;
}

}  // namespace

// One outstanding copy-mode get. The posting thread claims a free slot (CAS, acquire: the
// previous owner's release of the slot ordered its last reads before our writes), fills it,
// and arms it with a release store that the poll thread's acquire load of state pairs with,
// so a reply sees the fields as written. The poll thread frees it (release) after its event.
struct ShmTransport::GetSlot {
  std::atomic<std::uint64_t> state{0};
  detail::OpContext* ctx = nullptr;
  unsigned char* buf = nullptr;
  std::uint64_t len = 0;
  std::uint64_t received = 0;  // poll-lock holder only
  std::int32_t rank = -1;
};

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

ShmTransport::ShmTransport(const ShmParams& p)
    : rank_(checked(p).rank),
      size_(p.size),
      device_(p.device),
      cell_payload_(p.cell_payload),
      copy_(p.copy),
      own_(Segment::create(p.rank, p.size, p.device, p.cell_payload, p.cells)),
      rx_(own_.queue()),
      peers_(new Peer[static_cast<std::size_t>(p.size)]),
      gets_(new GetSlot[kGetSlots]) {
  caps_.name = "shm";
  caps_.inject_size = cell_payload_;
  caps_.max_msg_size = cell_payload_;
  caps_.max_rma_size = std::size_t{1} << 40;
  caps_.remote_data_bytes = 8;
  caps_.send_queue = 0;
  caps_.rma_virtual_address = true;
  caps_.local_registration = false;
  caps_.remote_data_consumes_recv = false;
  caps_.reports_source = true;
  caps_.gather_inject = true;
  // With cross-memory attach a rendezvous reads 8-16 KiB in one copy: a ping-pong of 16 KiB is
  // 1.6 us that way against 2.4 us by gathered fragments (ferry-bench, 2 ranks); a stream is
  // even and task chains favour fragments, so only FERRY_FRAGMENT=auto acts on this. In
  // forced copy mode a get costs the target's progress.
  caps_.one_copy_get = copy_ != ShmCopy::copy;  // settled per peer by connect()
}

ShmTransport::~ShmTransport() = default;  // peers' mappings, then our own (unlinked if still linked)

std::string ShmTransport::address() const {
  char probe[32];
  std::snprintf(probe, sizeof probe, "%" PRIxPTR, reinterpret_cast<std::uintptr_t>(own_.probe_address()));
  return "shm1;" + own_.name() + ";" + std::to_string(getpid()) + ";" + std::to_string(rank_) + ";" +
         std::to_string(device_) + ";" + probe;
}

void ShmTransport::connect(const std::vector<std::string>& addresses) {
  if (addresses.size() != static_cast<std::size_t>(size_)) {
    throw Error("shm transport: connect got " + std::to_string(addresses.size()) + " addresses for a job of " +
                std::to_string(size_) + " ranks");
  }
  for (int r = 0; r < size_; ++r) {
    const std::string& text = addresses[static_cast<std::size_t>(r)];
    Peer& p = peers_[static_cast<std::size_t>(r)];
    if (text.empty()) continue;
    Address a;
    if (!parse_address(text, a)) {
      throw Error("shm transport: address of rank " + std::to_string(r) + " is malformed: \"" + text + "\"");
    }
    if (a.rank != r || a.device != device_) {
      throw Error("shm transport: address of rank " + std::to_string(r) + " names rank " + std::to_string(a.rank) +
                  " device " + std::to_string(a.device) + ": \"" + text + "\"");
    }
    p.pid = static_cast<pid_t>(a.pid);
    if (r == rank_) {
      if (a.name != own_.name() || p.pid != getpid()) {
        throw Error("shm transport: address of this rank (" + std::to_string(r) + ") is not its own: \"" + text + "\"");
      }
      p.queue = rx_;
      p.mode = copy_ == ShmCopy::copy ? Mode::copy : Mode::self;
    } else {
      p.segment = Segment::open(a.name, SegmentExpect{static_cast<int>(a.pid), r, device_, cell_payload_});
      p.queue = p.segment.queue();
      if (copy_ == ShmCopy::copy) {
        p.mode = Mode::copy;
      } else {
        const int rc = cma_probe(p.pid, a.probe, p.segment.probe_value());
        if (rc == 0) {
          p.mode = Mode::cma;
        } else if (copy_ == ShmCopy::cma) {
          throw Error("shm transport: cross-memory attach to rank " + std::to_string(r) + " (pid " +
                      std::to_string(a.pid) + ") failed: " + std::strerror(-rc) +
                      "; the copy mode 'copy' works without it");
        } else {
          FERRY_LOG(info, "shm: cross-memory attach to rank %d (pid %lld) not available (%s): copying through shared memory",
                    r, a.pid, std::strerror(-rc));
          p.mode = Mode::copy;
        }
      }
    }
  }
  // A peer whose memory cannot be read in one copy needs fragments past a packet, so the
  // transport offers one-copy gets only when every peer it reaches allows them.
  for (int r = 0; r < size_; ++r) {
    if (peers_[static_cast<std::size_t>(r)].mode == Mode::copy) caps_.one_copy_get = false;
    if (peers_[static_cast<std::size_t>(r)].mode == Mode::cma) caps_.pushed_get = true;
  }
}

void ShmTransport::connected() { own_.unlink(); }

const char* ShmTransport::copy_mode(int rank) const noexcept {
  if (rank < 0 || rank >= size_) return "none";
  switch (peers_[static_cast<std::size_t>(rank)].mode) {
    case Mode::none: return "none";
    case Mode::self: return "self";
    case Mode::cma: return "cma";
    case Mode::copy: return "copy";
  }
  return "none";
}

std::string ShmTransport::copy_summary() const {
  std::string cma, copy;
  for (int r = 0; r < size_; ++r) {
    const Mode m = peers_[static_cast<std::size_t>(r)].mode;
    std::string& list = m == Mode::cma ? cma : copy;
    if (m != Mode::cma && m != Mode::copy) continue;
    if (!list.empty()) list += ',';
    list += std::to_string(r);
  }
  if (copy.empty()) return cma.empty() ? "self" : "cma";
  if (cma.empty()) return "copy";
  return "mixed (cma: ranks " + cma + "; copy: ranks " + copy + ")";
}

bool ShmTransport::peer_alive(int rank) const noexcept {
  if (rank < 0 || rank >= size_) return false;
  const Peer& p = peers_[static_cast<std::size_t>(rank)];
  if (p.mode == Mode::none || p.pid <= 0) return false;
  return kill(p.pid, 0) == 0 || errno == EPERM;
}

// --- Messages ------------------------------------------------------------------------------

int ShmTransport::inject_parts(int rank, const void* head, std::size_t head_len, const void* body,
                               std::size_t body_len) {
  if (head_len > cell_payload_ || body_len > cell_payload_ - head_len) return -EMSGSIZE;
  Peer* p = peer(rank);
  if (p == nullptr) return -EHOSTUNREACH;
  std::uint64_t pos = 0;
  CellHeader* c = p->queue.try_claim(pos, claim_mark_);
  if (c == nullptr) return -EAGAIN;
  c->length = static_cast<std::uint32_t>(head_len + body_len);
  c->rank = rank_;
  c->kind = static_cast<std::uint32_t>(CellKind::message);
  detail::copy_small(cell_payload(c), head, head_len);
  detail::copy_small(cell_payload(c) + head_len, body, body_len);
  CellQueue::publish(c, pos);
  return 0;
}

// One part: the class is final, so this call is direct and inlined.
int ShmTransport::inject(int rank, const void* buf, std::size_t len) { return inject_parts(rank, buf, len, nullptr, 0); }

int ShmTransport::send(int rank, const void* buf, std::size_t len, void*, detail::OpContext* ctx) {
  const int rc = inject(rank, buf, len);
  if (rc == 0) complete(ctx, len, rank, 0);
  return rc;
}

int ShmTransport::post_recv(void* buf, std::size_t len, void*, detail::OpContext* ctx) {
  auto* n = new (ctx->backend) RecvNode{};
  n->ctx = ctx;
  n->buf = static_cast<unsigned char*>(buf);
  n->len = len;
  if (recv_tail_ != nullptr) {
    recv_tail_->next = n;
  } else {
    recv_head_ = n;
  }
  recv_tail_ = n;
  return 0;
}

void ShmTransport::cancel_all() noexcept { recv_head_ = recv_tail_ = nullptr; }

// --- RMA -----------------------------------------------------------------------------------

int ShmTransport::put(int rank, const void* buf, std::size_t len, void*, std::uint64_t addr, std::uint64_t,
                      detail::OpContext* ctx) {
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
                           std::uint64_t addr, std::uint64_t, detail::OpContext* ctx) {
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
                      detail::OpContext* ctx) {
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
                             detail::OpContext* ctx) {
  Peer* p = peer(rank);
  if (p == nullptr) return -EHOSTUNREACH;
  if (p->mode != Mode::cma || len == 0) return get(rank, buf, len, desc, addr, key, ctx);
  return request_get(*p, rank, buf, len, addr, true, ctx);
}

// A get the target serves from its poll: a slot for the request, then the request's cell
// ([bytes wanted] for a reply in cells, [bytes wanted][destination] for a write).
int ShmTransport::request_get(Peer& p, int rank, void* buf, std::size_t len, std::uint64_t addr, bool push,
                              detail::OpContext* ctx) noexcept {
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
                                 std::uint64_t data, detail::OpContext* ctx) noexcept {
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

// --- Progress ------------------------------------------------------------------------------

bool ShmTransport::lend_receives() {
  lending_ = true;
  return true;
}

int ShmTransport::poll(Event* events, int max) {
  int n = 0;
  // The caller is done with what the last poll lent (its cells are freed below, with the rest).
  lent_count_ = 0;
  if (__builtin_expect(!failing_.empty(), 0)) n = abandon_gets(events, max);
  progress_puts();  // copy-mode puts, and notices that did not fit at post
  if (!serves_.empty()) progress_serves();
  while (n < max) {
    DoneNode* d = done_.pop();
    if (d == nullptr) break;
    Event& ev = events[n++];
    ev = Event{};
    ev.context = d->ctx;
    ev.length = d->length;
    ev.rank = d->rank;
    ev.error = d->error;
  }
  // At most one queue's worth of cells per poll, so a stream of chunks cannot hold it forever.
  bool waiting = false;  // a message at the head has no posted receive
  for (std::uint64_t budget = rx_.count(); n < max && budget > 0 && !waiting; --budget) {
    CellHeader* c = rx_.peek(head_);
    if (c == nullptr) {
      // A sender that died between claiming this cell and publishing it never will.
      if (!failed_.empty() &&
          rx_.skip_dead_claim(head_, [this](int r) { return r >= 0 && r < size_ && failed_[static_cast<std::size_t>(r)] != 0; })) {
        FERRY_LOG(warn, "shm: passed a queue cell a failed rank claimed and never published");
        ++head_;
        continue;
      }
      break;
    }
    // Read each field once: the sender's process could still scribble on the cell.
    const std::uint32_t kind = c->kind;
    const std::uint32_t len = c->length;
    const std::int32_t src = c->rank;
    if (kind == 0 || kind > kCellKindMax || len > cell_payload_ || src < 0 || src >= size_) {
      FERRY_LOG(warn, "shm: skipped a malformed cell (kind %u, length %u, rank %d)", kind, len, src);
    } else {
      switch (static_cast<CellKind>(kind)) {
        case CellKind::message: {
          RecvNode* r = recv_head_;
          if (r == nullptr) {  // no receive posted: the message waits in its cell
            waiting = true;
            continue;  // skips the release below: the cell stays at the head
          }
          // A few cache lines are cheaper to copy at once than to lend and account for.
          const bool lend = lending_ && len > kLendAbove && len <= r->len;
          if (lend && lent_count_ == kMaxLent) {
            waiting = true;  // the next poll releases the lent cells, then lends again
            continue;
          }
          recv_head_ = r->next;
          if (recv_head_ == nullptr) recv_tail_ = nullptr;
          Event& ev = events[n++];
          ev = Event{};
          ev.context = r->ctx;
          ev.rank = src;
          if (lend) {
            ev.length = len;
            ev.lent = cell_payload(c);
            if (lent_count_++ == 0) lent_first_ = head_;
            ++head_;
            continue;  // the cell stays the caller's until the next poll
          }
          const std::size_t copied = len <= r->len ? len : r->len;
          detail::copy_small(r->buf, cell_payload(c), copied);
          ev.length = copied;
          ev.error = len <= r->len ? 0 : -EMSGSIZE;
          break;
        }
        case CellKind::remote_write: {
          Event& ev = events[n++];
          ev = Event{};
          ev.length = static_cast<std::size_t>(c->arg1);
          ev.data = c->arg0;
          ev.rank = src;
          ev.remote_write = true;
          break;
        }
        case CellKind::put_chunk: on_put_chunk(c, len, src); break;
        case CellKind::get_request: on_get_request(c, len, src); break;
        case CellKind::get_reply:
          if (on_get_reply(c, len, src, events[n])) ++n;
          break;
        case CellKind::get_done:
          if (on_get_done(c, src, events[n])) ++n;
          break;
        case CellKind::nop: break;
      }
    }
    ++head_;
  }
  // Producers may reuse every cell below the first one lent out, or below head_. One store per
  // poll that moved, to a line only producers that found the queue full read.
  const std::uint64_t free_below = lent_count_ > 0 ? lent_first_ : head_;
  if (free_below != freed_) {
    freed_ = free_below;
    rx_.free_below(free_below);
  }
  if (!serves_.empty()) progress_serves();
  return n;
}

void ShmTransport::peer_failed(int rank) {
  if (rank < 0 || rank >= size_) return;
  if (failed_.empty()) failed_.assign(static_cast<std::size_t>(size_), 0);
  failed_[static_cast<std::size_t>(rank)] = 1;
  try {
    failing_.push_back(Failing{rank, std::chrono::steady_clock::now() + std::chrono::milliseconds(kAbandonGraceMs)});
  } catch (...) {
    FERRY_LOG(error, "shm: out of memory recording rank %d's failure: its outstanding gets may never complete", rank);
  }
  next_abandon_check_ = {};
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

}  // namespace shm
}  // namespace ferry::net
