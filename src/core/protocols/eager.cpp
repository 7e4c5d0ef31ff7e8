#include "core/protocols/eager.hpp"

#include <cerrno>

#include "common/small_copy.hpp"

namespace ferry::detail {

Status inject_small(DeviceContext& dc, Link& l, MsgKind kind, std::uint16_t target, Tag tag, int rank,
                    const void* buffer, std::size_t size) {
  alignas(16) unsigned char frame[kStackInject];
  encode(frame, WireHeader{kind, 0, target, dc.rank(), tag, 0});
  copy_small(frame + kHeader, buffer, size);  // a few words, usually: inline, no call into libc
  const int rc = l.transport->inject(rank, frame, kHeader + size);
  if (rc == 0) return Status::make_done();
  if (rc == -EAGAIN) return Status::make_retry(RetryReason::provider);
  return dc.transport_error(l, "inject", rc, rank);
}

Status inject_gathered(DeviceContext& dc, Link& l, MsgKind kind, std::uint16_t target, Tag tag, int rank,
                       const void* buffer, std::size_t size) {
  alignas(16) unsigned char header[kHeader];
  encode(header, WireHeader{kind, 0, target, dc.rank(), tag, 0});
  const int rc = l.transport->inject_parts(rank, header, kHeader, buffer, size);
  if (rc == 0) return Status::make_done();
  if (rc == -EAGAIN) return Status::make_retry(RetryReason::provider);
  return dc.transport_error(l, "inject", rc, rank);
}

}  // namespace ferry::detail
