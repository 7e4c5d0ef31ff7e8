// device_failure.cpp — a peer's failure, acted on by the device: its transports told, and
// every receive, rendezvous, fragmented message and atomic pending to or from it failed.
#include "core/device.hpp"

#include <cstddef>
#include <cstdint>

namespace ferry::detail {

void DeviceImpl::fail_peer(int rank) {
  for (Link& l : links_) l.transport->peer_failed(rank);
  fail_recvs(rank);
  rendezvous_.fail_peer(rank);
  fragments_.fail_peer(rank);
  atomics_.fail_peer(rank);
}

void DeviceImpl::check_failures() {
  trim_if_idle();
  failures_.check_peers();
  const std::uint32_t count = failures_.failure_count();
  if (count != failures_seen_) {
    failures_seen_ = count;
    if (handled_.empty()) handled_.assign(static_cast<std::size_t>(size_), 0);
    for (int r = 0; r < size_; ++r) {
      if (handled_[static_cast<std::size_t>(r)] != 0 || !peer_down(r)) continue;
      handled_[static_cast<std::size_t>(r)] = 1;
      fail_peer(r);
    }
  }
  // After the device's own operations with a failed peer ended. Acquire, paired with
  // extension()'s release: the extension is constructed.
  if (DeviceExtension* e = extension_.load(std::memory_order_acquire)) e->slow_path();
}

void DeviceImpl::fail_recvs(int rank) {
  matching_.take_recvs_from(rank, [&](Packet* r) {
    const RecvDescriptor d = r->recv;
    recv_descriptors_->put(r);
    Completion c;
    c.op = OpKind::recv;
    c.rank = rank;
    c.tag = d.want.tag;
    c.context = d.context;
    c.error = peer_failed_error;
    signal_local(d.local, std::move(c));
  });
}

}  // namespace ferry::detail
