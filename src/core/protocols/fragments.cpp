#include "core/protocols/fragments.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/log.hpp"
#include "core/recv_blocks.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {

Fragments::Fragments(DeviceContext& dc) : dc_(dc) {
  partials_.reserve(64);  // whether any link fragments is settled only once the transports are connected
}

Fragments::~Fragments() {
  for (Partial& m : partials_) {
    recv_blocks::give(m.heap);
    m.packet->pool->put_shared(m.packet);
  }
  while (Packet* p = head_) {
    head_ = p->next;
    if (p->backlog.frame != p->data()) std::free(p->backlog.frame);
    p->pool->put_shared(p);
  }
}

// The pieces go straight from the caller's buffer; only a tail the provider refuses is copied
// (into the packet taken up front, so an empty pool is a retry before anything is sent).
Status Fragments::post(Link& l, MsgKind kind, std::uint16_t target, Tag tag, int rank, const void* buffer,
                       std::size_t size) {
  Packet* spare = dc_.pool().get();
  if (spare == nullptr) return Status::make_retry(RetryReason::packet_pool);
  const std::uint32_t id = next_id_.fetch_add(1, std::memory_order_relaxed);  // a name, orders nothing
  alignas(16) unsigned char frame[kMaxFragmentFrame];
  encode(frame, WireHeader{MsgKind::frag, static_cast<std::uint8_t>(kind), target, dc_.rank(), tag, id});
  const auto* src = static_cast<const unsigned char*>(buffer);
  const std::size_t payload = l.fragment_payload;
  for (std::size_t off = 0; off < size; off += payload) {
    const std::size_t n = std::min(payload, size - off);
    encode(frame + kHeader, FragBody{static_cast<std::uint32_t>(off), static_cast<std::uint32_t>(size)});
    int rc;
    if (l.gather_size != 0) {  // straight from the caller's buffer into the message
      rc = l.transport->inject_parts(rank, frame, kFragmentHeader, src + off, n);
    } else {
      std::memcpy(frame + kFragmentHeader, src + off, n);
      rc = l.transport->inject(rank, frame, kFragmentHeader + n);
    }
    if (rc == 0) continue;
    if (rc != -EAGAIN || off == 0) {
      dc_.pool().put(spare);
      if (rc == -EAGAIN) return Status::make_retry(RetryReason::transport);
      return dc_.transport_error(l, "inject", rc, rank);
    }
    // The provider took the first pieces: the rest must follow them, so it joins the backlog.
    // Layout: [frame header][remaining bytes], in the spare packet or, for a message larger
    // than a packet, a heap block; each later piece's header is written just in front of its
    // bytes, over bytes already sent.
    unsigned char* d = spare->data();
    if (kFragmentHeader + (size - off) > spare->capacity) {
      d = static_cast<unsigned char*>(std::malloc(kFragmentHeader + (size - off)));
      if (d == nullptr) {
        dc_.pool().put(spare);
        throw Error("post: cannot allocate " + std::to_string(size - off) + " bytes for a message's pieces the provider refused");
      }
    }
    std::memcpy(d, frame, kHeader);
    std::memcpy(d + kFragmentHeader, src + off, size - off);
    spare->backlog = BacklogTail{d, rank, static_cast<std::uint32_t>(size), static_cast<std::uint32_t>(size - off), 0};
    spare->next = nullptr;
    {
      // Counted under the lock, with the link: counted after the unlock, a flusher's decrement
      // for another tail could bring the count to zero while this tail still waits, and this
      // thread's next message would overtake it. Relaxed: the lock publishes the packet, and
      // the only reader that must see this increment is this thread.
      std::lock_guard<SpinLock> guard(lock_);
      if (tail_ != nullptr) tail_->next = spare; else head_ = spare;
      tail_ = spare;
      count_.fetch_add(1, std::memory_order_relaxed);
    }
    return Status::make_done();
  }
  dc_.pool().put(spare);
  return Status::make_done();
}

bool Fragments::flush() {
  std::unique_lock<SpinLock> guard(lock_, std::try_to_lock);
  if (!guard.owns_lock()) return false;
  while (Packet* packet = head_) {
    BacklogTail* p = &packet->backlog;
    unsigned char* d = p->frame;
    Link& l = dc_.link(p->rank);
    // To a failed rank the rest goes nowhere (its queue may never drain): drop it, so the
    // backlog never holds up the messages to the other ranks.
    while (p->remaining() != 0 && !dc_.peer_down(p->rank)) {
      const std::size_t n = std::min<std::size_t>(l.fragment_payload, p->remaining());
      unsigned char* piece = d + p->sent;  // its bytes start at piece + kFragmentHeader
      if (p->sent != 0) std::memcpy(piece, d, kHeader);  // sent >= fragment_payload > kHeader: no overlap
      encode(piece + kHeader, FragBody{p->offset(), p->size});
      const int rc = l.transport->inject(p->rank, piece, kFragmentHeader + n);
      if (rc == -EAGAIN) return false;
      if (rc != 0) {
        // The peer is unreachable: the rest of this message cannot be delivered. Said, not hidden.
        if (peer_gone_error(rc)) dc_.record_peer_failed(p->rank, net::error_text("inject", rc));
        FERRY_LOG_AT(error, dc_.rank(), dc_.index(), "dropped the rest of a %zu-byte message to rank %d: %s",
                     static_cast<std::size_t>(p->size), p->rank, net::error_text("inject", rc).c_str());
        break;
      }
      p->sent += static_cast<std::uint32_t>(n);
    }
    head_ = packet->next;
    if (head_ == nullptr) tail_ = nullptr;
    if (d != packet->data()) std::free(d);
    dc_.pool().put(packet);
    count_.fetch_sub(1, std::memory_order_release);
  }
  return true;
}

void Fragments::fail_peer(int rank) {
  for (std::size_t i = 0; i < partials_.size();) {
    Partial& m = partials_[i];
    if (m.src != rank) {
      ++i;
      continue;
    }
    if (m.heap != nullptr) recv_blocks::give(m.heap);
    dc_.pool().put(m.packet);
    m = partials_.back();
    partials_.pop_back();
  }
}

Fragments::Whole Fragments::on_fragment(Packet* p, std::size_t length, const unsigned char* payload) {
  unsigned char* d = p->data();
  const auto h = decode<WireHeader>(d);
  // Too short to hold a FragBody: offset > total marks it malformed below.
  const auto f = length >= kFragmentHeader ? decode<FragBody>(d + kHeader) : FragBody{1, 0};
  const std::size_t n = length >= kFragmentHeader ? length - kFragmentHeader : 0;
  const auto kind = static_cast<MsgKind>(h.reserved);
  const std::size_t limit = std::max<std::size_t>(p->capacity - kHeader, dc_.fragment_limit());
  if ((kind != MsgKind::am && kind != MsgKind::msg) || f.total > limit || f.offset > f.total ||
      n > f.total - f.offset) {
    FERRY_LOG_AT(warn, dc_.rank(), dc_.index(), "dropped a malformed fragment of %zu bytes from rank %d", length, h.src);
    dc_.count_malformed();
    dc_.pool().put(p);
    return {};
  }
  for (Partial& m : partials_) {
    if (m.src != h.src || m.id != h.aux) continue;
    // The buffer was sized by the first fragment's total: a later one that disagrees, or that
    // would carry more bytes than the message has left, is not this message's.
    if (f.total != m.total || n > m.total - m.received) {
      FERRY_LOG_AT(warn, dc_.rank(), dc_.index(),
                   "dropped a fragment from rank %d that disagrees with its message (total %u, not %u)", h.src,
                   f.total, m.total);
      dc_.count_malformed();
      dc_.pool().put(p);
      return {};
    }
    std::memcpy((m.heap != nullptr ? m.heap : m.packet->data() + kHeader) + f.offset, payload, n);
    dc_.pool().put(p);
    m.received += static_cast<std::uint32_t>(n);
    if (m.received < f.total) return {};
    Packet* whole = m.packet;
    unsigned char* heap = m.heap;
    m = partials_.back();
    partials_.pop_back();
    if (heap == nullptr) whole->arrived.length = static_cast<std::uint32_t>(kHeader + f.total);
    return {whole, heap, f.total};
  }
  if (f.total > p->capacity - kHeader) {
    // Larger than a packet: the payload gathers in a heap block, the packet keeps the header.
    auto* heap = static_cast<unsigned char*>(recv_blocks::take(f.total));
    if (heap == nullptr) {
      FERRY_LOG_AT(error, dc_.rank(), dc_.index(), "dropped a %u-byte message from rank %d: out of memory", f.total, h.src);
      dc_.pool().put(p);
      return {};
    }
    std::memcpy(heap + f.offset, payload, n);
    encode(d, WireHeader{kind, 0, h.target, h.src, h.tag, 0});
    partials_.push_back(Partial{h.src, h.aux, p, heap, static_cast<std::uint32_t>(n), f.total});
    return {};
  }
  // The first piece to arrive: its packet becomes the message (header of the message's own
  // kind, payload at its offset), so reassembly takes no buffer of its own.
  std::memmove(d + kHeader + f.offset, payload, n);
  encode(d, WireHeader{kind, 0, h.target, h.src, h.tag, 0});
  if (n == f.total) {
    p->arrived.length = static_cast<std::uint32_t>(kHeader + n);
    return {p, nullptr, n};
  }
  partials_.push_back(Partial{h.src, h.aux, p, nullptr, static_cast<std::uint32_t>(n), f.total});
  return {};
}

}  // namespace ferry::detail
