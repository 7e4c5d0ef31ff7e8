// eager.hpp — the small-message protocol: header and payload in one transport message.
//
// A message whose header and payload the transport injects (copies at once) goes without a
// packet or a completion: a transport that gathers takes the header and the caller's buffer as
// two parts and copies each once, straight into the message; one that does not gets the two
// assembled in a frame on the stack, up to the frame's size. A larger one goes through a pool
// packet and the transport's send (or inject), whose completion returns the packet. Either way
// the post completes at once. No allocation, no blocking lock.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstring>

#include "common/small_copy.hpp"
#include "core/device_context.hpp"

namespace ferry::detail {

// Messages up to this size (header included) that the transport injects are built on the
// stack instead of in a packet.
inline constexpr std::size_t kStackInject = 256;

// Injects [header][buffer] from a stack frame; kHeader + size <= kStackInject and the link's inject size.
// Inline, as inject_gathered: on the reply path of a handler that answers they save a call and
// its frame per message.
inline Status inject_small(DeviceContext& dc, Link& l, MsgKind kind, std::uint16_t target, Tag tag, int rank,
                           const void* buffer, std::size_t size) {
  alignas(16) unsigned char frame[kStackInject];
  encode(frame, WireHeader{kind, 0, target, dc.rank(), tag, 0});
  copy_small(frame + kHeader, buffer, size);  // a few words, usually: inline, no call into libc
  const int rc = l.transport->inject(rank, frame, kHeader + size);
  if (__builtin_expect(rc == 0, 1)) return Status::make_done();
  if (rc == -EAGAIN) return Status::make_retry(RetryReason::transport);
  return dc.transport_error(l, "inject", rc, rank);
}
// Injects the header and the caller's buffer as two parts; kHeader + size <= l.gather_size.
inline Status inject_gathered(DeviceContext& dc, Link& l, MsgKind kind, std::uint16_t target, Tag tag, int rank,
                              const void* buffer, std::size_t size) {
  alignas(16) unsigned char header[kHeader];
  encode(header, WireHeader{kind, 0, target, dc.rank(), tag, 0});
  const int rc = l.transport->inject_parts(rank, header, kHeader, buffer, size);
  if (__builtin_expect(rc == 0, 1)) return Status::make_done();
  if (rc == -EAGAIN) return Status::make_retry(RetryReason::transport);
  return dc.transport_error(l, "inject", rc, rank);
}

// Sends an eager am or msg of `size` <= dc.packet_eager_limit() payload bytes to `rank` over `l`.
inline Status post_eager(DeviceContext& dc, Link& l, MsgKind kind, std::uint16_t target, Tag tag, int rank,
                         const void* buffer, std::size_t size) {
  // A gathering transport (ferry's shared memory) copies header and payload once each, into the
  // message itself: no frame to build and copy first.
  if (kHeader + size <= l.gather_size) return inject_gathered(dc, l, kind, target, tag, rank, buffer, size);
  // Otherwise a small frame on the stack is the cheapest (one copy of a few lines into the transport).
  if (kHeader + size <= kStackInject && kHeader + size <= l.inject_size) {
    return inject_small(dc, l, kind, target, tag, rank, buffer, size);
  }
  Packet* p = dc.pool().get();
  if (p == nullptr) return Status::make_retry(RetryReason::packet_pool);
  fill_header(p, kind, target, dc.rank(), tag);
  if (size != 0) std::memcpy(p->data() + kHeader, buffer, size);
  return dc.send_packet(p, rank, kHeader + size);
}

}  // namespace ferry::detail
