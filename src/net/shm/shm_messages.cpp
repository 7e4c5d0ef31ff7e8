// shm_messages.cpp — the shared-memory transport's message path: inject and send into the
// target's cell queue, and poll, which hands out local completions and drains this rank's
// queue (messages lent where they lie, remote writes, and the RMA cells it passes to
// shm_rma.cpp).
#include "net/shm/shm_transport.hpp"

#include <cerrno>
#include <new>

#include "common/log.hpp"
#include "common/small_copy.hpp"

namespace ferry::net::shm {

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

int ShmTransport::send(int rank, const void* buf, std::size_t len, void*, OpContext* ctx) {
  const int rc = inject(rank, buf, len);
  if (rc == 0) complete(ctx, len, rank, 0);
  return rc;
}

// Receives are lent (Caps::receives): nothing to post, nothing to give up.
int ShmTransport::post_recv(void*, std::size_t, void*, OpContext*) { return -ENOSYS; }

void ShmTransport::cancel_all() noexcept {}

// --- Progress ------------------------------------------------------------------------------

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
  // The reader's position, the lent count and the limits live in locals through the loop: an
  // Event's stores could otherwise alias them, and each would be reloaded per message. They go
  // back to the members before anything out of line runs.
  std::uint64_t head = head_;
  int lent = 0;
  const int lend_limit = lend_limit_;
  const std::uint32_t payload_max = static_cast<std::uint32_t>(cell_payload_);
  const int size = size_;
  for (std::uint64_t budget = rx_.count(); n < max && budget > 0; --budget) {
    CellHeader* c = rx_.peek(head);
    if (c == nullptr) {
      // A sender that died between claiming this cell and publishing it never will.
      if (!failed_.empty() &&
          rx_.skip_dead_claim(head, [this](int r) { return r >= 0 && r < size_ && failed_[static_cast<std::size_t>(r)] != 0; })) {
        FERRY_LOG(warn, "shm: passed a queue cell a failed rank claimed and never published");
        ++head;
        continue;
      }
      break;
    }
    // Read each field once: the sender's process could still scribble on the cell.
    const std::uint32_t kind = c->kind;
    const std::uint32_t len = c->length;
    const std::int32_t src = c->rank;
    const bool well_formed = len <= payload_max && static_cast<std::uint32_t>(src) < static_cast<std::uint32_t>(size);
    if (__builtin_expect(kind == static_cast<std::uint32_t>(CellKind::message) && well_formed, 1)) {
      // No room for it in this poll: it waits in its cell, and so does every cell behind it.
      if (lent >= lend_limit) break;
      // Field by field: `ev = Event{}` first built the whole event on the stack and copied it.
      Event& ev = events[n++];
      ev.context = nullptr;
      ev.length = len;
      ev.data = 0;
      ev.rank = src;
      ev.error = 0;
      ev.remote_write = false;
      ev.lent = cell_payload(c);
      ev.abandoned = false;
      if (lent++ == 0) lent_first_ = head;
      ++head;
      continue;  // the cell stays the caller's until the next poll
    }
    head_ = head;
    lent_count_ = lent;
    if (kind == 0 || kind > kCellKindMax || !well_formed) {
      FERRY_LOG(warn, "shm: skipped a malformed cell (kind %u, length %u, rank %d)", kind, len, src);
    } else {
      switch (static_cast<CellKind>(kind)) {
        case CellKind::message: break;  // taken above
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
    ++head;
  }
  head_ = head;
  lent_count_ = lent;
  return finish_poll(n);
}

int ShmTransport::finish_poll(int n) {
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

}  // namespace ferry::net::shm
