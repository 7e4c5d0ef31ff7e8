#include "core/protocols/rma.hpp"

#include <cerrno>
#include <string>

#include "common/log.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {

namespace {

// An RMA error to or from `rank`: a peer-gone error (or any error once the rank is known to
// have failed) records the failure and becomes peer_failed_error.
int rma_error(DeviceContext& dc, int rank, int error, const char* call) {
  if (error != 0 && (peer_gone_error(error) || dc.peer_down(rank))) {
    dc.record_peer_failed(rank, net::error_text(call, error));
    return peer_failed_error;
  }
  return error;
}

}  // namespace

// A put or get of more than one chunk; a notifying put writes its last chunk with data after
// all others completed, so the target never sees the notification before the data.
struct RmaOp {
  OpKind op;
  int rank;
  std::size_t size;
  CompletionObject* local;
  void* context;
  bool notify;
  std::uint64_t notify_data;
  int error = 0;
  bool abandoned = false;  // a chunk's context may still be held by the transport
  Link* link = nullptr;
  net::Registration* registration = nullptr;  // of the local buffer, under local_registration
  std::vector<Chunk> chunks;
  std::size_t issued = 0;
  std::size_t completed = 0;
};

bool Rma::issue(RmaOp* op) {
  net::Transport* t = op->link->transport;
  const std::size_t n = op->chunks.size();
  if (dc_.peer_down(op->rank) && op->issued < n) {
    // The target failed: nothing more goes; the op completes with the failure.
    op->error = peer_failed_error;
    op->completed += n - op->issued;
    op->issued = n;
    return true;
  }
  while (op->issued < n) {
    const bool last = op->issued == n - 1;
    // A notifying put writes its last chunk with data only once every other chunk completed,
    // and not at all when one of them failed: the target must never be told of data that is
    // not there.
    if (last && op->notify && op->completed < n - 1) return false;
    if (last && op->notify && op->error != 0) {
      ++op->completed;
      ++op->issued;
      break;
    }
    Chunk& c = op->chunks[op->issued];
    if (!dc_.take_credit()) return false;
    int rc;
    if (op->op == OpKind::get) {
      rc = t->get(op->rank, c.local, c.size, c.desc, c.remote_addr, c.key, &c.ctx);
    } else if (last && op->notify) {
      rc = t->put_data(op->rank, c.local, c.size, c.desc, op->notify_data, c.remote_addr, c.key, &c.ctx);
    } else {
      rc = t->put(op->rank, c.local, c.size, c.desc, c.remote_addr, c.key, &c.ctx);
    }
    if (rc == -EAGAIN) {
      dc_.return_credit();
      return false;
    }
    if (rc != 0) {
      dc_.return_credit();
      op->error = rma_error(dc_, op->rank, rc, op->op == OpKind::get ? "get" : "put");
      ++op->completed;
    }
    ++op->issued;
  }
  return true;
}

void Rma::finish(RmaOp* op) {
  if (op->abandoned) {
    dc_.bury(std::move(op->chunks));  // and the registration stays: the transport may hold both
  } else {
    release_registration(op->link->transport, op->registration);
  }
  Completion c;
  c.op = op->op;
  c.rank = op->rank;
  c.size = op->size;
  c.context = op->context;
  c.error = op->error;
  CompletionObject* local = op->local;
  delete op;
  dc_.close_op();
  signal_local(local, std::move(c));
}

Status Rma::post(const RmaRequest& r) {
  Link& l = dc_.link(r.rank);
  const net::Caps& caps = *l.caps;
  net::Transport* t = l.transport;
  const std::uint64_t addr = (caps.rma_virtual_address ? r.remote.base : 0) + r.offset;
  const net::Access access = r.op == OpKind::get ? net::Access::recv : net::Access::send;
  // Tiny puts need no context and no completion.
  if (r.op == OpKind::put && !r.notify && r.size <= caps.inject_size) {
    const int rc = t->inject_put(r.rank, r.local, r.size, addr, r.remote.key);
    if (rc == 0) return Status::make_done();
    if (rc == -EAGAIN) return Status::make_retry(RetryReason::transport);
    return dc_.transport_error(l, "inject_put", rc, r.rank);
  }
  if (r.size <= caps.max_rma_size) {
    // One transfer: its state rides in a packet, so nothing is allocated.
    Packet* p = dc_.pool().get();
    if (p == nullptr) return Status::make_retry(RetryReason::packet_pool);
    net::Registration* mr = nullptr;
    try {
      if (caps.local_registration && r.size != 0) mr = t->register_memory(r.local, r.size, access);
    } catch (...) {
      dc_.pool().put(p);  // the packet goes back with the error
      throw;
    }
    if (!dc_.take_credit()) {
      release_registration(t, mr);
      dc_.pool().put(p);
      return Status::make_retry(RetryReason::send_queue);
    }
    p->rma = RmaSingle{r.op, r.rank, r.size, r.local_comp, r.context, mr};
    p->ctx.set_kind(CtxKind::rma_single);  // release: after every field the completion reads
    void* desc = mr != nullptr ? mr->desc() : nullptr;
    int rc;
    if (r.op == OpKind::get) {
      rc = t->get(r.rank, r.local, r.size, desc, addr, r.remote.key, &p->ctx);
    } else if (r.notify) {
      rc = t->put_data(r.rank, r.local, r.size, desc, r.notify_data, addr, r.remote.key, &p->ctx);
    } else {
      rc = t->put(r.rank, r.local, r.size, desc, addr, r.remote.key, &p->ctx);
    }
    if (rc == 0) return Status::make_posted();
    dc_.return_credit();
    release_registration(t, mr);
    dc_.pool().put(p);
    if (rc == -EAGAIN) return Status::make_retry(RetryReason::transport);
    return dc_.transport_error(l, r.op == OpKind::get ? "get" : "put", rc, r.rank);
  }
  // Larger than one transfer: chunks, issued by progress.
  auto* op = new RmaOp{};
  op->op = r.op;
  op->rank = r.rank;
  op->size = r.size;
  op->local = r.local_comp;
  op->context = r.context;
  op->notify = r.notify;
  op->notify_data = r.notify_data;
  op->link = &l;
  try {
    if (caps.local_registration) op->registration = t->register_memory(r.local, r.size, access);
  } catch (...) {
    delete op;
    throw;
  }
  add_chunks(op->chunks, op, CtxKind::rma_chunk, r.local, op->registration != nullptr ? op->registration->desc() : nullptr,
             r.size, addr, r.remote.key, caps.max_rma_size);
  dc_.open_op();
  // The deferred step owns the record: it issues the chunks as credits allow and finishes the
  // operation once every chunk has completed (events only count them), so the record is freed
  // in one place, after its last use. Steps and events both run under the poll lock.
  dc_.defer([this, op] {
    issue(op);
    if (op->completed < op->chunks.size()) return false;
    finish(op);
    return true;
  });
  return Status::make_posted();
}

void Rma::on_notification(const net::Event& e) {
  // With 8 bytes of remote data the writer's rank travels in the data (some providers, e.g.
  // rxm, give no source address for RMA completions); with 4 bytes the transport names it.
  // Both come from the wire: a rank outside the job or a target past FERRY_MAX_TARGETS drops
  // the notification (the data itself was written where the writer's key allowed).
  const std::uint64_t rank = e.rank >= 0 ? static_cast<std::uint64_t>(e.rank) : e.data >> 32;
  const auto target = static_cast<std::uint16_t>((e.data >> 16) & 0xFFFF);
  const std::size_t max_targets = dc_.targets().max_targets();
  if (rank >= static_cast<std::uint64_t>(dc_.size()) || target >= max_targets) {
    FERRY_LOG_AT(warn, dc_.rank(), dc_.index(),
                 "dropped a put notification naming rank %llu and target %u (the job has %d ranks, FERRY_MAX_TARGETS=%zu)",
                 static_cast<unsigned long long>(rank), target, dc_.size(), max_targets);
    dc_.count_malformed();
    return;
  }
  Completion c;
  c.op = OpKind::remote_put;
  c.rank = static_cast<int>(rank);
  c.tag = static_cast<Tag>(e.data & 0xFFFF);
  c.size = e.length;
  dc_.deliver(target, std::move(c));
}

void Rma::on_single(Packet* p, net::Transport* t, int error, bool abandoned) {
  const RmaSingle op = p->rma;
  dc_.return_credit();
  if (!abandoned) release_registration(t, op.mr);
  Completion c;
  c.op = op.op;
  c.rank = op.rank;
  c.size = op.size;
  c.context = op.context;
  c.error = rma_error(dc_, op.rank, error, op.op == OpKind::get ? "get" : "put");
  // An abandoned packet never returns to the pool: the transport may still hold its context.
  if (!abandoned) dc_.pool().put(p);
  signal_local(op.local, std::move(c));
}

void Rma::on_chunk(Chunk* chunk, int error, bool abandoned) {
  auto* op = static_cast<RmaOp*>(chunk->owner);
  dc_.return_credit();
  if (abandoned) op->abandoned = true;
  if (error != 0) op->error = rma_error(dc_, op->rank, error, op->op == OpKind::get ? "get" : "put");
  ++op->completed;  // the deferred step finishes the operation (and issues a notifying last chunk)
}

}  // namespace ferry::detail
