// device.cpp — a device's life: construction (the inline sink each transport delivers to),
// start (the first receive buffers or spare packets), teardown, and what it says about itself
// (transport names, peers, operations in flight).
#include "core/device.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>

#include "core/recv_blocks.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {

DeviceImpl::DeviceImpl(const DeviceParts& parts, int index, const Config& config,
                       std::vector<std::unique_ptr<net::Transport>> transports, const std::vector<int>& route)
    : DeviceContext(parts, index, config, std::move(transports), route),
      recv_descriptors_(std::make_unique<PacketPool>(config.recv_descriptors, 64)),
      fragments_(*this),
      rendezvous_(*this),
      rma_(*this),
      atomics_(*this, regions_),
      mappings_(parts.size),
      host_of_(parts.host_of) {
  spare_target_ = static_cast<int>(std::min<std::size_t>(config.prepost, kPollBatch));
  for (Link& l : links_) {
    if (l.transport->caps().delivers_inline) l.transport->set_inline_sink(net::InlineSink{&DeviceImpl::on_inline, this, &l});
  }
}

DeviceImpl::~DeviceImpl() {
  // Nothing may signal the extension once it goes; it holds received Buffers, whose packets go
  // back to the pool.
  if (extension_owner_ != nullptr) targets_.unexpose_collectives();
  extension_owner_.reset();
  // Cancel what the transports still hold, then give the packets back so the pool can go.
  for (Link& l : links_) l.transport->cancel_all();
  for (int i = 0; i < spare_count_; ++i) pool_->put_shared(spare_[static_cast<std::size_t>(i)]);
  matching_.drain([](Packet* r) { r->pool->put_shared(r); },
                  [](Packet* m) {
                    recv_blocks::give(m->arrived.heap);
                    m->pool->put_shared(m);
                  });
}

void DeviceImpl::start() {
  plan_fragments();
  std::lock_guard<SpinLock> guard(poll_lock_);
  for (Link& l : links_) {
    if (l.lends) {
      if (top_up_spares() == 0) throw Error("device " + std::to_string(index_) + ": no packet to receive into on " + l.caps->name);
      continue;
    }
    repost(l);
    if (l.posted_recvs == 0) {
      throw Error("device " + std::to_string(index_) + ": could not post any receive buffer on " + l.caps->name);
    }
  }
}

std::string DeviceImpl::transport_names() const {
  std::string out;
  for (const Link& l : links_) out += (out.empty() ? "" : "+") + l.caps->name;
  return out;
}

std::string DeviceImpl::describe_peer(int rank) const {
  if (rank < 0 || static_cast<std::size_t>(rank) >= route_.size()) return "";
  return route_[static_cast<std::size_t>(rank)]->transport->describe_peer(rank);
}

std::size_t DeviceImpl::in_flight() const noexcept { return context_in_flight() + fragments_.backlog(); }

void DeviceImpl::add_connecting_on_demand(std::size_t transport) {
  on_demand_.push_back(&this->transport(transport));
  links_[transport].on_demand = true;
  if (heard_ == nullptr) heard_ = std::make_unique<std::atomic<std::uint8_t>[]>(static_cast<std::size_t>(size_));
}

bool DeviceImpl::in_touch(int rank) const noexcept {
  const Link& l = *route_[static_cast<std::size_t>(rank)];
  return !l.on_demand || l.transport->has_endpoint(rank) ||
         heard_[static_cast<std::size_t>(rank)].load(std::memory_order_relaxed) != 0;
}

std::size_t DeviceImpl::trim_memory() {
  for (const Link& l : links_) {
    if (l.caps->registration_pins) return 0;
  }
  const std::size_t bytes = pool_->trim();
  trims_.fetch_add(1, std::memory_order_relaxed);
  trimmed_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  return bytes;
}

// The list untouched for FERRY_TRIM_IDLE_MS: its packets were not needed for that long, so
// their pages go back (once: a trim's own take and return leave a version that is not trimmed
// again until traffic changes it). The free list, not the device's calls, marks rest: a rank
// that polls while it waits still rests, and one thread's cache keeps the few packets a
// trickle of messages uses. The process's cache of large receive buffers rests, and is freed,
// by the same measure (its own use count; recv_blocks::release_if_rested).
void DeviceImpl::trim_if_idle() noexcept {
  if (config_.trim_idle_ms <= 0) return;
  const std::uint32_t version = pool_->list_version();
  const bool pool_left = version == trim_left_version_;
  if (pool_left && recv_blocks::cached_bytes() == 0) return;
  const std::int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now().time_since_epoch()).count();
  const std::int64_t rest = std::int64_t{config_.trim_idle_ms} * 1000000;
  (void)recv_blocks::release_if_rested(now, rest);
  if (pool_left) return;
  if (version != trim_seen_version_ || trim_seen_ns_ == 0) {
    trim_seen_version_ = version;
    trim_seen_ns_ = now;
    return;
  }
  if (now - trim_seen_ns_ < rest) return;
  try {
    (void)trim_memory();
  } catch (...) {
    return;  // out of memory for the list of packets: try again at the next check
  }
  trim_left_version_ = pool_->list_version();
}

DeviceFootprint DeviceImpl::footprint() const noexcept {
  std::size_t peers = peers_connected_;
  for (const net::Transport* t : on_demand_) peers += t->peers_connected();
  return DeviceFootprint{.packets_made = pool_->made(),
                         .packets_max = pool_->count(),
                         .packet_bytes = pool_->made_bytes(),
                         .descriptors_made = recv_descriptors_->made(),
                         .descriptor_bytes = recv_descriptors_->made_bytes(),
                         .peers_connected = peers,
                         .trims = trims_.load(std::memory_order_relaxed),
                         .trimmed_bytes = trimmed_bytes_.load(std::memory_order_relaxed)};
}

}  // namespace ferry::detail
