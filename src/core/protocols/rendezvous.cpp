#include "core/protocols/rendezvous.hpp"

#include <cerrno>
#include <cstring>
#include <string>

#include "common/log.hpp"
#include "core/recv_blocks.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {

namespace {

// The eager part of an iovec active message stays in its RTS packet.
void release_rts_payload(void* pool, void* payload) noexcept {
  static_cast<PacketPool*>(pool)->put(
      Packet::from_data(static_cast<unsigned char*>(payload) - kHeader - sizeof(RtsBody)));
}

std::string str(std::size_t v) { return std::to_string(v); }

}  // namespace

// The sender's side of a rendezvous: lives until the receiver's FIN. Its fields are written
// before the RTS leaves and read when the FIN comes back, possibly on another thread; the peer
// orders the two, invisibly to tools, so `ready` carries the handoff (release before the RTS,
// acquire on the FIN).
struct SendOp {
  std::atomic<bool> ready{false};
  OpKind op;
  int rank;
  Tag tag;
  std::size_t size;
  CompletionObject* local;
  void* context;
  net::Transport* transport;  // the one the RTS went over; it holds the registrations
  std::vector<net::Registration*> registrations;
};

// The receiver's side of a rendezvous: reads every part, then delivers and sends FIN.
struct RecvOp {
  enum class Goal : std::uint8_t { user_recv, am, iovec } goal;
  int rank;
  Tag tag;
  std::uint16_t target;
  std::uint64_t send_op;
  std::size_t size;  // bytes delivered (user_recv: after truncation)
  int error = 0;
  CompletionObject* local = nullptr;  // user_recv
  void* context = nullptr;
  Buffer eager;               // iovec: the eager part
  std::vector<Buffer> parts;  // am: [0] is the whole message; iovec: each zero-copy part
  Link* link = nullptr;       // the sender's link
  std::vector<net::Registration*> registrations;  // of the destinations, under local_registration
  // am and iovec: the parts still to read into receive blocks, taken by prepare() when the
  // first read may start (so a block is taken as late as possible, see the read budget).
  std::vector<RtsPart> remote;
  std::vector<Chunk> chunks;
  std::size_t issued = 0;
  std::size_t completed = 0;
  bool abandoned = false;  // a chunk's context may still be held by the transport
  RecvOp* live_prev = nullptr;  // Rendezvous's list of unfinished ops (under its live_mutex_)
  RecvOp* live_next = nullptr;
};

std::uint64_t PendingSends::add(SendOp* op, int rank) {
  std::lock_guard<std::mutex> guard(mutex_);
  std::uint32_t i;
  if (!free_.empty()) {
    i = free_.back();
    free_.pop_back();
  } else {
    if (slots_.size() >= UINT32_MAX) throw Error("rendezvous: more than 2^32 sends wait for their receivers");
    i = static_cast<std::uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  Slot& s = slots_[i];
  s.op = op;
  s.rank = rank;
  return (static_cast<std::uint64_t>(s.generation) << 32) | i;
}

SendOp* PendingSends::take(std::uint64_t id, int rank) {
  const auto i = static_cast<std::uint32_t>(id);
  std::lock_guard<std::mutex> guard(mutex_);
  if (i >= slots_.size()) return nullptr;
  Slot& s = slots_[i];
  if (s.op == nullptr || s.generation != static_cast<std::uint32_t>(id >> 32) || s.rank != rank) return nullptr;
  SendOp* op = s.op;
  free_slot(i);
  return op;
}

void PendingSends::free_slot(std::uint32_t i) {
  Slot& s = slots_[i];
  s.op = nullptr;
  s.confirmed = false;
  ++s.generation;
  free_.push_back(i);
}

void PendingSends::remove(std::uint64_t id) {
  std::lock_guard<std::mutex> guard(mutex_);
  free_slot(static_cast<std::uint32_t>(id));
}

bool PendingSends::confirm(std::uint64_t id) {
  const auto i = static_cast<std::uint32_t>(id);
  std::lock_guard<std::mutex> guard(mutex_);
  Slot& s = slots_[i];
  if (s.op == nullptr || s.generation != static_cast<std::uint32_t>(id >> 32)) return false;
  s.confirmed = true;
  return true;
}

SendOp* PendingSends::take_id(std::uint64_t id) {
  const auto i = static_cast<std::uint32_t>(id);
  std::lock_guard<std::mutex> guard(mutex_);
  Slot& s = slots_[i];
  if (s.op == nullptr || s.generation != static_cast<std::uint32_t>(id >> 32)) return nullptr;
  SendOp* op = s.op;
  free_slot(i);
  return op;
}

void PendingSends::take_failed(int rank, std::vector<SendOp*>& out) {
  std::lock_guard<std::mutex> guard(mutex_);
  for (std::uint32_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.op == nullptr || !s.confirmed || s.rank != rank) continue;
    out.push_back(s.op);
    free_slot(i);
  }
}

Status Rendezvous::post(OpKind op, int rank, Tag tag, std::uint16_t target, const void* buffer, std::size_t size,
                        CompletionObject* local, void* context) {
  Packet* p = dc_.pool().get();
  if (p == nullptr) return Status::make_retry(RetryReason::packet_pool);
  auto* send = new SendOp{};
  send->op = op;
  send->rank = rank;
  send->tag = tag;
  send->size = size;
  send->local = local;
  send->context = context;
  Link& l = dc_.link(rank);
  send->transport = l.transport;
  try {
    send->registrations.push_back(l.transport->register_memory(buffer, size, net::Access::remote_read | net::Access::send));
  } catch (...) {
    dc_.pool().put(p);
    delete send;
    throw;
  }
  net::Registration* mr = send->registrations[0];
  std::uint64_t id;
  try {
    id = pending_.add(send, rank);
  } catch (...) {
    l.transport->deregister(mr);
    dc_.pool().put(p);
    delete send;
    throw;
  }
  fill_header(p, op == OpKind::am ? MsgKind::rts_am : MsgKind::rts_msg, target, dc_.rank(), tag);
  encode(p->data() + kHeader,
         RtsBody{size, l.caps->rma_virtual_address ? reinterpret_cast<std::uint64_t>(buffer) : 0, mr->key(), id});
  dc_.open_op();
  send->ready.store(true, std::memory_order_release);
  // The RTS did not leave (retry, or a transport error thrown): the send is undone whole.
  auto undo = [&] {
    dc_.close_op();
    pending_.remove(id);
    l.transport->deregister(mr);
    delete send;
  };
  Status s;
  try {
    s = dc_.send_packet(p, rank, kHeader + sizeof(RtsBody));
  } catch (...) {
    undo();
    throw;
  }
  if (s.is_retry() || s.is_failed()) {
    undo();
    return s;
  }
  confirm(id, rank);
  return Status::make_posted();
}

Status Rendezvous::post_iovec(const AmIovecArgs& a, std::size_t total) {
  const std::size_t need = kHeader + sizeof(RtsBody) + a.eager.size + a.parts.size() * sizeof(RtsPart);
  Packet* p = dc_.pool().get();
  if (p == nullptr) return Status::make_retry(RetryReason::packet_pool);
  auto* send = new SendOp{};
  send->op = OpKind::am;
  send->rank = a.rank;
  send->tag = a.tag;
  send->size = a.eager.size + total;
  send->local = a.local;
  send->context = a.context;
  Link& l = dc_.link(a.rank);
  send->transport = l.transport;
  unsigned char* at = p->data() + kHeader + sizeof(RtsBody);
  if (a.eager.size != 0) std::memcpy(at, a.eager.buffer, a.eager.size);
  at += a.eager.size;
  try {
    for (const IoPart& part : a.parts) {
      std::uint64_t key = 0;
      if (part.size != 0) {
        send->registrations.push_back(
            l.transport->register_memory(part.buffer, part.size, net::Access::remote_read | net::Access::send));
        key = send->registrations.back()->key();
      }
      encode(at, RtsPart{part.size, l.caps->rma_virtual_address ? reinterpret_cast<std::uint64_t>(part.buffer) : 0, key});
      at += sizeof(RtsPart);
    }
  } catch (...) {
    for (net::Registration* r : send->registrations) l.transport->deregister(r);
    delete send;
    dc_.pool().put(p);
    throw;
  }
  std::uint64_t id;
  try {
    id = pending_.add(send, a.rank);
  } catch (...) {
    for (net::Registration* r : send->registrations) l.transport->deregister(r);
    delete send;
    dc_.pool().put(p);
    throw;
  }
  fill_header(p, MsgKind::rts_iovec, a.target.id, dc_.rank(), a.tag, static_cast<std::uint32_t>(a.parts.size()));
  encode(p->data() + kHeader, RtsBody{a.eager.size, 0, 0, id});
  dc_.open_op();
  send->ready.store(true, std::memory_order_release);
  auto undo = [&] {
    dc_.close_op();
    pending_.remove(id);
    for (net::Registration* r : send->registrations) l.transport->deregister(r);
    delete send;
  };
  Status s;
  try {
    s = dc_.send_packet(p, a.rank, need);
  } catch (...) {
    undo();
    throw;
  }
  if (s.is_retry() || s.is_failed()) {
    undo();
    return s;
  }
  confirm(id, a.rank);
  return Status::make_posted();
}

void Rendezvous::confirm(std::uint64_t id, int rank) {
  // The mutex inside confirm orders it with fail_peer's take_failed: if that ran first, the
  // flag it follows is visible here (see PendingSends).
  if (!pending_.confirm(id) || !dc_.peer_down(rank)) return;
  if (SendOp* send = pending_.take_id(id)) complete_send(send, peer_failed_error);
}

void Rendezvous::complete_send(SendOp* send, int error) {
  (void)send->ready.load(std::memory_order_acquire);
  for (net::Registration* r : send->registrations) send->transport->deregister(r);
  Completion c;
  c.op = send->op;
  c.rank = send->rank;
  c.tag = send->tag;
  c.size = send->size;
  c.context = send->context;
  c.error = error;
  CompletionObject* local = send->local;
  delete send;
  dc_.close_op();
  signal_local(local, std::move(c));
}

void Rendezvous::fail_peer(int rank) {
  std::vector<SendOp*> failed;
  pending_.take_failed(rank, failed);
  for (SendOp* send : failed) complete_send(send, peer_failed_error);
}

// The device goes while ops are unfinished (finalize gave up waiting, say for a peer that
// failed mid-read): each op is freed, but its chunks (whose contexts the transport may still
// hold) and its receive blocks (which a read may still be writing) are buried with the device,
// which frees them after its transports have closed.
Rendezvous::~Rendezvous() {
  while (RecvOp* op = live_head_) {
    untrack(op);
    if (op->goal != RecvOp::Goal::user_recv) {
      dc_.bury(std::move(op->chunks), std::move(op->parts));
    } else {
      dc_.bury(std::move(op->chunks));
    }
    delete op;
  }
}

void Rendezvous::track(RecvOp* op) {
  std::lock_guard<std::mutex> guard(live_mutex_);
  op->live_next = live_head_;
  if (live_head_ != nullptr) live_head_->live_prev = op;
  live_head_ = op;
}

void Rendezvous::untrack(RecvOp* op) {
  std::lock_guard<std::mutex> guard(live_mutex_);
  if (op->live_prev != nullptr) op->live_prev->live_next = op->live_next; else live_head_ = op->live_next;
  if (op->live_next != nullptr) op->live_next->live_prev = op->live_prev;
  op->live_prev = op->live_next = nullptr;
}

// Issues a RecvOp's reads as credits allow; true when all are issued.
bool Rendezvous::issue_reads(RecvOp* op) {
  net::Transport* t = op->link->transport;
  if (dc_.peer_down(op->rank) && op->issued < op->chunks.size()) {
    // The sender failed: nothing more to read; the op completes with the failure.
    op->error = peer_failed_error;
    op->completed += op->chunks.size() - op->issued;
    op->issued = op->chunks.size();
    return true;
  }
  while (op->issued < op->chunks.size()) {
    Chunk& c = op->chunks[op->issued];
    if (read_budget_ <= 0) return false;
    // Pushed reads complete asynchronously, so the budget does not hold them back: kPushWindow
    // does. A full window ends the budget too, so later steps take no receive block either.
    if (c.push && pushing_ != 0 && pushing_ + c.size > kPushWindow) {
      read_budget_ = 0;
      return false;
    }
    // Out of credits or transport resources: later reads wait too, so they neither overtake
    // this one nor take receive blocks they cannot fill yet.
    if (!dc_.take_credit()) {
      read_budget_ = 0;
      return false;
    }
    int rc = c.push ? t->get_pushed(op->rank, c.local, c.size, c.desc, c.remote_addr, c.key, &c.ctx)
                    : t->get(op->rank, c.local, c.size, c.desc, c.remote_addr, c.key, &c.ctx);
    if (rc == -EAGAIN) {
      dc_.return_credit();
      read_budget_ = 0;
      return false;
    }
    if (rc != 0) {
      dc_.return_credit();
      if (peer_gone_error(rc) || dc_.peer_down(op->rank)) {
        dc_.record_peer_failed(op->rank, net::error_text("get", rc));
        rc = peer_failed_error;
      } else {
        FERRY_LOG_AT(error, dc_.rank(), dc_.index(), "%s reading %zu bytes from rank %d",
                     net::error_text("get", rc).c_str(), c.size, op->rank);
      }
      op->error = rc;
      ++op->completed;  // treat as finished-with-error so the op can complete
    }
    read_budget_ -= static_cast<std::ptrdiff_t>(c.size);
    if (c.push && rc == 0) pushing_ += c.size;
    ++op->issued;
  }
  return true;
}

// Sends a FIN; false when it must be tried again later.
bool Rendezvous::send_fin(int rank, std::uint64_t send_op) {
  Packet* p = dc_.pool().get();
  if (p == nullptr) return false;
  encode(p->data(), WireHeader{MsgKind::fin, 0, 0, dc_.rank(), 0, 0});
  encode(p->data() + kHeader, FinBody{send_op});
  try {
    return !dc_.send_packet(p, rank, kHeader + sizeof(FinBody)).is_retry();
  } catch (const std::exception& e) {
    FERRY_LOG_AT(error, dc_.rank(), dc_.index(), "cannot send a rendezvous FIN to rank %d: %s", rank, e.what());
    return true;
  }
}

// Finishes a RecvOp whose reads are all complete: deliver, FIN, free.
void Rendezvous::finish(RecvOp* op) {
  if (op->abandoned) {
    // The registrations stay too: the transport may hold them. So do ferry's own destinations:
    // the failed message is delivered without them (a user receive's buffer is the user's; see
    // the README's "Peer failure").
    if (op->goal != RecvOp::Goal::user_recv) {
      dc_.bury(std::move(op->chunks), std::move(op->parts));
      op->parts.clear();
    } else {
      dc_.bury(std::move(op->chunks));
    }
  } else {
    for (net::Registration* r : op->registrations) op->link->transport->deregister(r);
  }
  op->registrations.clear();
  Completion c;
  c.rank = op->rank;
  c.tag = op->tag;
  c.size = op->size;
  c.error = op->error;
  const int rank = op->rank;
  const std::uint64_t send_op = op->send_op;
  switch (op->goal) {
    case RecvOp::Goal::user_recv:
      c.op = OpKind::recv;
      c.context = op->context;
      signal_local(op->local, std::move(c));
      break;
    case RecvOp::Goal::am:
      c.op = OpKind::remote_am;
      // A failed message carries nothing: its bytes may be partial.
      if (op->error == 0 && !op->parts.empty()) c.buffer = std::move(op->parts[0]);
      dc_.deliver(op->target, std::move(c));
      break;
    case RecvOp::Goal::iovec:
      c.op = OpKind::remote_am;
      if (op->error == 0) {
        c.buffer = std::move(op->eager);
        c.parts = std::move(op->parts);
      }
      dc_.deliver(op->target, std::move(c));
      break;
  }
  untrack(op);
  delete op;
  dc_.close_op();
  if (!send_fin(rank, send_op)) {
    dc_.defer([this, rank, send_op] { return send_fin(rank, send_op); });
  }
}

// Starts reading the message an RTS announces. `recv` is the matched user receive (rts_msg)
// or null (rts_am, rts_iovec). Consumes the RTS packet. Called by progress or by post_recv.
void Rendezvous::start_recv(Packet* rts, const RecvDescriptor* recv) {
  const auto h = decode<WireHeader>(rts->data());
  const auto body = decode<RtsBody>(rts->data() + kHeader);
  if (h.kind == MsgKind::rts_iovec) {
    // The eager part and the part table must lie within the bytes that arrived (on_recv
    // checked the fixed part).
    const std::size_t room = rts->arrived.length - kHeader - sizeof(RtsBody);
    if (body.size > room || h.aux > (room - body.size) / sizeof(RtsPart)) {
      FERRY_LOG_AT(warn, dc_.rank(), dc_.index(),
                   "dropped an iovec message from rank %d: %llu eager bytes and %u parts do not fit its %u bytes",
                   h.src, static_cast<unsigned long long>(body.size), h.aux, rts->arrived.length);
      dc_.count_malformed();
      dc_.pool().put(rts);
      return;
    }
  }
  auto* op = new RecvOp{};
  track(op);
  op->rank = h.src;
  op->tag = h.tag;
  op->target = h.target;
  op->send_op = body.send_op;
  Link& l = dc_.link(h.src);
  op->link = &l;
  const std::size_t max = l.caps->max_rma_size;
  // Under local_registration each destination needs its own registration and descriptor.
  auto reg_local = [&](void* dst, std::size_t n) -> void* {
    if (!l.caps->local_registration || n == 0) return nullptr;
    op->registrations.push_back(l.transport->register_memory(dst, n, net::Access::recv));
    return op->registrations.back()->desc();
  };
  try {
    switch (h.kind) {
      case MsgKind::rts_msg: {
        op->goal = RecvOp::Goal::user_recv;
        op->local = recv->local;
        op->context = recv->context;
        op->size = body.size <= recv->size ? body.size : recv->size;
        if (body.size > recv->size) op->error = -EMSGSIZE;
        void* desc = reg_local(recv->buffer, op->size);
        add_chunks(op->chunks, op, CtxKind::rdv_read, static_cast<unsigned char*>(recv->buffer), desc, op->size,
                   body.addr, body.key, max);
        break;
      }
      case MsgKind::rts_am: {
        op->goal = RecvOp::Goal::am;
        op->size = body.size;
        op->remote.push_back(RtsPart{body.size, body.addr, body.key});
        break;
      }
      case MsgKind::rts_iovec: {
        op->goal = RecvOp::Goal::iovec;
        const unsigned char* at = rts->data() + kHeader + sizeof(RtsBody);
        const std::size_t eager = body.size;
        op->size = eager;
        const unsigned char* table = at + eager;
        op->remote.reserve(h.aux);
        for (std::uint32_t i = 0; i < h.aux; ++i) {
          const auto part = decode<RtsPart>(table + i * sizeof(RtsPart));
          op->remote.push_back(part);
          op->size += part.size;
        }
        // The eager part stays in the RTS packet, handed over as the completion's buffer.
        op->eager = Buffer(rts->data() + kHeader + sizeof(RtsBody), eager, &release_rts_payload, &dc_.pool());
        rts = nullptr;
        break;
      }
      default:
        break;
    }
  } catch (const std::exception& e) {
    FERRY_LOG_AT(error, dc_.rank(), dc_.index(), "cannot receive a rendezvous from rank %d: %s", h.src, e.what());
    op->error = -ENOMEM;
    op->chunks.clear();  // nothing to read: complete with the error (the sender still gets its FIN)
  }
  if (rts != nullptr) dc_.pool().put(rts);
  dc_.open_op();
  if (op->chunks.empty() && op->remote.empty()) {
    finish(op);
    return;
  }
  bool schedule = false;
  {
    std::lock_guard<std::mutex> guard(waiting_mutex_);
    waiting_.push_back(op);
    schedule = !waiting_scheduled_;
    waiting_scheduled_ = true;
  }
  if (schedule) dc_.defer([this] { return run_waiting(); });
}

bool Rendezvous::step(RecvOp* op) {
  if (!op->remote.empty()) {
    if (read_budget_ <= 0) return false;  // its blocks are taken when its first read may go
    prepare(op);
  }
  if (!issue_reads(op)) return false;
  if (op->completed == op->chunks.size()) finish(op);
  return true;
}

bool Rendezvous::run_waiting() {
  for (;;) {
    RecvOp* op = nullptr;
    {
      std::lock_guard<std::mutex> guard(waiting_mutex_);
      if (waiting_.empty()) {
        waiting_scheduled_ = false;
        return true;
      }
      op = waiting_.front();
    }
    if (!step(op)) return false;  // run again, from this one, at the next progress call
    std::lock_guard<std::mutex> guard(waiting_mutex_);
    waiting_.pop_front();
  }
}

// Whether a read into receive block `block` over `l` asks the sender to write instead
// (FERRY_RDV_READ). The sender is waiting for this rendezvous's FIN, so it makes progress,
// which serves the request; a user's RMA get never goes this way (its target may not
// progress). Writing pays where the block is on 2 MiB pages: the single copy then pins the
// block's few huge pages rather than the sender's many small ones.
bool Rendezvous::pushes_into(const Link& l, const void* block) const noexcept {
  if (!l.caps->pushed_get || block == nullptr) return false;
  switch (dc_.config().rdv_read) {
    case RdvRead::read: return false;
    case RdvRead::push: return true;
    case RdvRead::automatic: break;
  }
  return recv_blocks::huge(block);
}

// Takes the receive blocks of an am or iovec RecvOp and cuts its reads into chunks. When memory
// is short the op reads nothing and completes with -ENOMEM (the sender still gets its FIN).
void Rendezvous::prepare(RecvOp* op) {
  Link& l = *op->link;
  try {
    op->parts.reserve(op->remote.size());
    for (const RtsPart& part : op->remote) {
      // Where the sender's address is known, the block starts at the same offset within a
      // cache line, so the copy runs co-aligned (see recv_blocks::take).
      const std::size_t offset = l.caps->rma_virtual_address ? static_cast<std::size_t>(part.addr) : 0;
      void* dst = part.size != 0 ? recv_blocks::take(part.size, offset) : nullptr;
      if (part.size != 0 && dst == nullptr) throw Error("rendezvous: cannot allocate " + str(part.size) + " bytes");
      op->parts.emplace_back(dst, part.size, &recv_blocks::release, nullptr);
      void* desc = nullptr;
      if (l.caps->local_registration && part.size != 0) {
        op->registrations.push_back(l.transport->register_memory(dst, part.size, net::Access::recv));
        desc = op->registrations.back()->desc();
      }
      const std::size_t first = op->chunks.size();
      add_chunks(op->chunks, op, CtxKind::rdv_read, static_cast<unsigned char*>(dst), desc, part.size, part.addr,
                 part.key, l.caps->max_rma_size);
      if (pushes_into(l, dst)) {
        for (std::size_t i = first; i < op->chunks.size(); ++i) op->chunks[i].push = true;
      }
    }
  } catch (const std::exception& e) {
    FERRY_LOG_AT(error, dc_.rank(), dc_.index(), "cannot receive a rendezvous from rank %d: %s", op->rank, e.what());
    op->error = -ENOMEM;
    op->parts.clear();
    op->chunks.clear();
  }
  op->remote.clear();
}

// The receiver read everything: the sender's buffer is free again.
void Rendezvous::on_fin(Packet* p) {
  const auto src = decode<WireHeader>(p->data()).src;
  const auto fin = decode<FinBody>(p->data() + kHeader);
  dc_.pool().put(p);
  SendOp* send = pending_.take(fin.send_op, src);
  if (send == nullptr && dc_.peer_down(src)) return;  // its send already completed with the failure
  if (send == nullptr) {
    FERRY_LOG_AT(warn, dc_.rank(), dc_.index(), "dropped a FIN from rank %d that names no pending send of it (id %llx)",
                 src, static_cast<unsigned long long>(fin.send_op));
    dc_.count_malformed();
    return;
  }
  complete_send(send, 0);
}

void Rendezvous::on_read(Chunk* c, int error, bool abandoned) {
  auto* op = static_cast<RecvOp*>(c->owner);
  dc_.return_credit();
  if (c->push) pushing_ -= c->size;
  if (abandoned) op->abandoned = true;
  if (error != 0) {
    if (peer_gone_error(error) || dc_.peer_down(op->rank)) {
      dc_.record_peer_failed(op->rank, net::error_text("get", error));
      error = peer_failed_error;
    } else {
      FERRY_LOG_AT(error, dc_.rank(), dc_.index(), "rendezvous read from rank %d failed: %s", op->rank,
                   net::error_text("get", error).c_str());
    }
    op->error = error;
  }
  if (++op->completed == op->chunks.size() && op->issued == op->chunks.size()) finish(op);
}

}  // namespace ferry::detail
