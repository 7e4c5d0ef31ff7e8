// ucx_rma_over_am.cpp — the UCX transport's RMA over active messages (am_rma.hpp), to peers whose
// endpoint has no RMA lane: the requester's puts and gets and their answers, the target's
// checks against its registrations, its answers sent from the poll (a get's bytes in pieces to
// a peer on this host), and pushed gets written by cross-memory attach.
#include "net/ucx/ucx_transport.hpp"

#include "net/util/cma.hpp"

namespace ferry::net::ucx {

// put and put_data (ctx set), inject_put (ctx null: its bytes copied into the slot, no event).
int UcxTransport::am_put(int rank, ucp_ep_h ep, const void* buf, std::size_t len, std::uint64_t addr, std::uint64_t key,
                         OpContext* ctx, OpKindUcx kind, std::uint64_t data) {
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

int UcxTransport::am_get(int rank, ucp_ep_h ep, void* buf, std::size_t len, std::uint64_t addr, std::uint64_t key,
                         OpContext* ctx, bool push) {
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
int UcxTransport::am_posted(RmaOps::Op* op, void* r) {
  if (r == nullptr) {
    rma_sent(op, UCS_OK);
    return 0;
  }
  if (UCS_PTR_IS_ERR(r)) {
    OpContext* ctx = nullptr;
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

void UcxTransport::on_rma_sent(void* request, ucs_status_t status, void* user) {
  if (tearing_down_ == nullptr) {
    auto* op = static_cast<RmaOps::Op*>(user);
    static_cast<UcxTransport*>(op->owner)->rma_sent(op, status);
  }
  ucp_request_free(request);
}

void UcxTransport::rma_sent(RmaOps::Op* op, ucs_status_t status) noexcept {
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
std::uint32_t UcxTransport::rma_send_flags(int rank, bool small) const noexcept {
  return small || !away(rank) ? UCP_AM_SEND_FLAG_EAGER : 0;
}

ucs_status_t UcxTransport::on_put_ack(void* arg, const void* header, std::size_t header_length, void*, std::size_t,
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
ucs_status_t UcxTransport::on_get_reply(void* arg, const void* header, std::size_t header_length, void* data,
                                        std::size_t length, const ucp_am_recv_param_t* param) {
  auto* t = static_cast<UcxTransport*>(arg);
  // Declining a rendezvous one is returning without receiving it (UCX answers its sender).
  if (tearing_down_ != nullptr || header_length != sizeof(RmaReply)) return UCS_OK;
  RmaReply a;
  std::memcpy(&a, header, sizeof(a));
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  OpContext* ctx = nullptr;
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

void UcxTransport::on_get_data(void* request, ucs_status_t status, std::size_t, void* user) {
  if (tearing_down_ == nullptr) {
    auto* ctx = static_cast<OpContext*>(user);
    state(ctx).transport->push(completed(ctx, state(ctx).rank, to_errno(status)));
  }
  ucp_request_free(request);
}

// The target's side. A request names a registration of this rank's, a range and what it
// wants; it is checked before any byte moves (a failed check answers -EINVAL).
bool UcxTransport::region_allows(std::uint64_t key, std::uint64_t addr, std::uint64_t length, Access want) {
  std::lock_guard<detail::SpinLock> g(packed_lock_);
  const auto it = packed_.find(key);
  if (it == packed_.end() || !has(it->second.access, want)) return false;
  const Region& r = it->second;
  return addr >= r.base && length <= r.length && addr - r.base <= r.length - length;
}

void UcxTransport::refused_request(const char* what, int from, std::uint64_t key, std::uint64_t addr,
                                   std::uint64_t length) {
  if (refused_logged_.exchange(true, std::memory_order_relaxed)) return;
  FERRY_LOG(warn, "ucx: refused a %s from rank %d of %llu bytes at %#llx with key %llu: no such registration, range or access here (said once)",
            what, from, static_cast<unsigned long long>(length), static_cast<unsigned long long>(addr),
            static_cast<unsigned long long>(key));
}

ucs_status_t UcxTransport::on_put(void* arg, const void* header, std::size_t header_length, void* data,
                                  std::size_t length, const ucp_am_recv_param_t* param) {
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

void UcxTransport::on_put_data(void* request, ucs_status_t status, std::size_t, void* user) {
  auto* pending = static_cast<PendingPut*>(user);
  if (tearing_down_ == nullptr) static_cast<UcxTransport*>(pending->transport)->put_done(pending->head, to_errno(status));
  delete pending;
  ucp_request_free(request);
}

// A put's bytes are in place (or refused): its notification, then its acknowledgement.
void UcxTransport::put_done(const PutHeader& h, int error) noexcept {
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
bool UcxTransport::get_allowed(const GetHeader& q, unsigned refusal) {
  if (q.from < 0 || static_cast<std::size_t>(q.from) >= eps_.size()) return false;
  if (region_allows(q.key, q.addr, q.length, Access::remote_read)) return true;
  refused_request("get", q.from, q.key, q.addr, q.length);
  answer(Answer{refusal, q.from, RmaReply{rank_, -EINVAL, q.id, 0}, 0, 0});
  return false;
}

ucs_status_t UcxTransport::on_get(void* arg, const void* header, std::size_t header_length, void*, std::size_t,
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
ucs_status_t UcxTransport::on_get_push(void* arg, const void* header, std::size_t header_length, void*, std::size_t,
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
void UcxTransport::serve_pushes() {
  for (const Push& q : pushes_) {
    const int rc = cma_write(cma_pid(q.from), reinterpret_cast<const void*>(q.addr), q.length, q.dest);
    answer(Answer{kAmPushDone, q.from, RmaReply{rank_, rc, q.id, 0}, 0, 0});
  }
  pushes_.clear();
  const detail::BiasedGuard guard(lock_);
  send_answers();
}

// The requester's: a pushed get is done (or failed) at the target.
ucs_status_t UcxTransport::on_push_done(void* arg, const void* header, std::size_t header_length, void*,
                                        std::size_t length, const ucp_am_recv_param_t*) {
  auto* t = static_cast<UcxTransport*>(arg);
  if (tearing_down_ != nullptr || header_length != sizeof(RmaReply)) return UCS_OK;
  RmaReply a;
  std::memcpy(&a, header, sizeof(a));
  OpContext* ctx = nullptr;
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
void UcxTransport::answer(const Answer& a) noexcept {
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
void UcxTransport::send_answers() {
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
bool UcxTransport::send_answer(Answer& a) {
  ucp_ep_h ep = ep_of(a.to);
  if (ep == nullptr) {  // a requester not yet connected is connected back
    const int rc = reach_held(a.to, ep);
    if (rc == -EAGAIN) return false;  // the bootstrap is busy: the next poll tries again
    if (rc != 0) return true;         // failed meanwhile: nobody to answer
  }
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
Piece* UcxTransport::take_piece(int to) noexcept {
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

void UcxTransport::give_piece(Piece* piece) noexcept {
  std::lock_guard<detail::SpinLock> g(pieces_lock_);
  --pieces_to_[static_cast<std::size_t>(piece->to)];
  free_pieces_.push_back(piece);  // capacity reserved for every piece: no allocation
}

void UcxTransport::on_piece_sent(void* request, ucs_status_t, void* user) {
  auto* piece = static_cast<Piece*>(user);
  static_cast<UcxTransport*>(piece->owner)->give_piece(piece);
  ucp_request_free(request);
}

}  // namespace ferry::net::ucx
