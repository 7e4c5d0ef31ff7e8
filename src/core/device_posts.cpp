// device_posts.cpp — the posts (post_am, post_am_iovec, post_send, post_recv, post_put,
// post_get, a barrier step), the argument checks each runs first (and validate runs alone),
// and memory registration.
#include "core/device.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "ferry/error.hpp"

namespace ferry::detail {

// ---- checks -----------------------------------------------------------------------------

namespace {

constexpr std::size_t kMaxSize = std::size_t{1} << 62;  // beyond this, size arithmetic is suspect

std::string str(std::size_t v) { return std::to_string(v); }

// The checks are inline compares; only the throwing halves are out of line (and cold), so
// the fast path pays a few predictable branches.
[[noreturn, gnu::cold, gnu::noinline]] void throw_target(const char* call, std::uint16_t id, std::size_t max) {
  throw Error(std::string(call) + ": target=" + std::to_string(id) + " is out of range; FERRY_MAX_TARGETS=" +
              std::to_string(max));
}

[[noreturn, gnu::cold, gnu::noinline]] void throw_finalized(const char* call) {
  throw Error(std::string(call) + ": called after the runtime was finalized");
}

[[noreturn, gnu::cold, gnu::noinline]] void throw_rank(const char* call, int rank, int size) {
  throw Error(std::string(call) + ": rank=" + std::to_string(rank) + " is out of range; the job has " +
              std::to_string(size) + " ranks (0.." + std::to_string(size - 1) + ")");
}

[[noreturn, gnu::cold, gnu::noinline]] void throw_buffer(const char* call, const char* name, const void* buffer,
                                                         std::size_t size) {
  if (buffer == nullptr) throw Error(std::string(call) + ": " + name + "=null with size=" + str(size));
  throw Error(std::string(call) + ": size=" + str(size) + " is too large");
}

[[noreturn, gnu::cold, gnu::noinline]] void throw_tag(const char* call, Tag tag) {
  throw Error(std::string(call) + ": tag=" + std::to_string(tag) + " is out of range; tags are 0.." +
              std::to_string(max_tag));
}

inline void check_buffer(const char* call, const char* name, const void* buffer, std::size_t size) {
  if (__builtin_expect((buffer == nullptr && size != 0) || size > kMaxSize, 0)) throw_buffer(call, name, buffer, size);
}

inline void check_tag(const char* call, Tag tag) {
  if (__builtin_expect(tag > max_tag, 0)) throw_tag(call, tag);
}

// A remote key's checks, for a put or a get.
void check_remote(const char* call, int rank, int device, const RemoteKey& key, std::size_t offset, std::size_t size) {
  if (key.rank < 0 && key.size == 0) throw Error(std::string(call) + ": remote key is empty (never set from a MemoryRegion)");
  if (key.rank != rank) {
    throw Error(std::string(call) + ": remote key belongs to rank " + std::to_string(key.rank) + ", not rank=" +
                std::to_string(rank));
  }
  if (key.device != device) {
    throw Error(std::string(call) + ": remote key was registered on device " + std::to_string(key.device) +
                ", but the operation uses device " + std::to_string(device));
  }
  if (offset > key.size || size > key.size - offset) {
    throw Error(std::string(call) + ": offset=" + str(offset) + " + size=" + str(size) +
                " is outside the remote region of " + str(key.size) + " bytes");
  }
}

}  // namespace

inline void DeviceImpl::check_alive(const char* call) const {
  if (__builtin_expect(finalized_.load(std::memory_order_relaxed), 0)) throw_finalized(call);
}

inline void DeviceImpl::check_rank(const char* call, int rank) const {
  if (__builtin_expect(rank < 0 || rank >= size_, 0)) throw_rank(call, rank, size_);
}

inline void DeviceImpl::check(const AmArgs& a) const {
  check_alive("post_am");
  check_rank("post_am", a.rank);
  check_buffer("post_am", "buffer", a.buffer, a.size);
  check_tag("post_am", a.tag);
  check_target("post_am", a.target.id);
}

inline std::size_t DeviceImpl::check(const AmIovecArgs& a) const {
  check_alive("post_am_iovec");
  check_rank("post_am_iovec", a.rank);
  check_buffer("post_am_iovec", "eager.buffer", a.eager.buffer, a.eager.size);
  check_tag("post_am_iovec", a.tag);
  check_target("post_am_iovec", a.target.id);
  std::size_t total = 0;
  for (std::size_t i = 0; i < a.parts.size(); ++i) {
    check_buffer("post_am_iovec", ("parts[" + str(i) + "].buffer").c_str(), a.parts[i].buffer, a.parts[i].size);
    if (total + a.parts[i].size < total) throw Error("post_am_iovec: the parts' sizes overflow");
    total += a.parts[i].size;
  }
  check_iovec_fits(a);
  return total;
}

inline void DeviceImpl::check(const SendArgs& a) const {
  check_alive("post_send");
  check_rank("post_send", a.rank);
  check_buffer("post_send", "buffer", a.buffer, a.size);
  check_tag("post_send", a.tag);
}

inline void DeviceImpl::check(const RecvArgs& a) const {
  check_alive("post_recv");
  if (a.rank != any_source) check_rank("post_recv", a.rank);
  check_buffer("post_recv", "buffer", a.buffer, a.size);
  if (a.tag != any_tag) check_tag("post_recv", a.tag);
}

inline std::uint64_t DeviceImpl::check(const PutArgs& a) const {
  check_alive("post_put");
  check_rank("post_put", a.rank);
  check_buffer("post_put", "buffer", a.buffer, a.size);
  check_remote("post_put", a.rank, index_, a.remote, a.offset, a.size);
  return notify_data(a);
}

inline void DeviceImpl::check(const GetArgs& a) const {
  check_alive("post_get");
  check_rank("post_get", a.rank);
  check_buffer("post_get", "buffer", a.buffer, a.size);
  check_remote("post_get", a.rank, index_, a.remote, a.offset, a.size);
}

inline void DeviceImpl::check(const AtomicArgs& a) const {
  check_alive("post_atomic");
  check_rank("post_atomic", a.rank);
  const auto op = static_cast<std::uint8_t>(a.op);
  const auto type = static_cast<std::uint8_t>(a.type);
  if (!valid_atomic_op(op)) throw Error("post_atomic: op=" + str(op) + " is not an AtomicOp");
  if (type > static_cast<std::uint8_t>(DataType::f64)) throw Error("post_atomic: type=" + str(type) + " is not a DataType");
  if (atomic_width(a.type) == 0) {
    throw Error(std::string("post_atomic: type=") + to_string(a.type) + " is not an atomic type (i32, u32, i64, u64, f64)");
  }
  if (refuse_atomic(op, type) != nullptr) {
    throw Error(std::string("post_atomic: op=") + to_string(a.op) + " is not defined for type=f64 (it takes fetch_add and add)");
  }
  const std::size_t width = atomic_width(a.type);
  if (a.offset % width != 0 || (a.remote.base + a.offset) % width != 0) {
    throw Error("post_atomic: offset=" + str(a.offset) + " into the region at " + str(a.remote.base) +
                " is not aligned to type=" + to_string(a.type) + "'s " + str(width) + " bytes");
  }
  check_remote("post_atomic", a.rank, index_, a.remote, a.offset, width);
}

template <class A>
void DeviceImpl::validate(const A& args) const {
  (void)check(args);
}

template void DeviceImpl::validate(const AmArgs&) const;
template void DeviceImpl::validate(const AmIovecArgs&) const;
template void DeviceImpl::validate(const SendArgs&) const;
template void DeviceImpl::validate(const RecvArgs&) const;
template void DeviceImpl::validate(const PutArgs&) const;
template void DeviceImpl::validate(const GetArgs&) const;
template void DeviceImpl::validate(const AtomicArgs&) const;

inline void DeviceImpl::check_target(const char* call, std::uint16_t id) const {
  // The collectives' id is beyond the application's: a message to it is checked by their
  // engine like any bytes from the wire.
  if (__builtin_expect(id >= targets_.max_targets(), 0) && id != TargetTable::kCollectiveTarget) {
    throw_target(call, id, targets_.max_targets());
  }
}

// ---- posts ------------------------------------------------------------------------------

Status DeviceImpl::post_am(const AmArgs& a) {
  check(a);
  if (__builtin_expect(peer_down(a.rank), 0)) return Status::make_failed(a.rank);
  if (!fragments_.clear()) return Status::make_retry(RetryReason::transport);
  Link& l = link(a.rank);
  if (l.fragmented(a.size)) return fragments_.post(l, MsgKind::am, a.target.id, a.tag, a.rank, a.buffer, a.size);
  if (a.size > eager_limit_) {
    return rendezvous_.post(OpKind::am, a.rank, a.tag, a.target.id, a.buffer, a.size, a.local, a.context);
  }
  return post_eager(*this, l, MsgKind::am, a.target.id, a.tag, a.rank, a.buffer, a.size);
}

Status DeviceImpl::post_send(const SendArgs& a) {
  check(a);
  if (__builtin_expect(peer_down(a.rank), 0)) return Status::make_failed(a.rank);
  if (!fragments_.clear()) return Status::make_retry(RetryReason::transport);
  Link& l = link(a.rank);
  if (l.fragmented(a.size)) return fragments_.post(l, MsgKind::msg, 0, a.tag, a.rank, a.buffer, a.size);
  if (a.size > eager_limit_) {
    return rendezvous_.post(OpKind::send, a.rank, a.tag, 0, a.buffer, a.size, a.local, a.context);
  }
  return post_eager(*this, l, MsgKind::msg, 0, a.tag, a.rank, a.buffer, a.size);
}

Status DeviceImpl::post_am_iovec(const AmIovecArgs& a) {
  const std::size_t total = check(a);
  if (peer_down(a.rank)) return Status::make_failed(a.rank);
  return rendezvous_.post_iovec(a, total);
}

std::size_t DeviceImpl::iovec_eager_limit(std::size_t parts) const noexcept {
  const std::size_t overhead = kHeader + sizeof(RtsBody) + parts * sizeof(RtsPart);
  return overhead >= config_.packet_size ? 0 : config_.packet_size - overhead;
}

bool DeviceImpl::post_barrier_step(int rank, std::uint32_t step) {
  // Fragments waiting in the backlog go first, as before any post: a message sent before the
  // barrier then reaches its target before this step does (each link keeps order).
  if (!fragments_.clear()) return false;
  Packet* p = pool_->get();
  if (p == nullptr) return false;
  fill_header(p, MsgKind::barrier, 0, rank_, step);
  return !send_packet(p, rank, kHeader).is_retry();
}

Status DeviceImpl::post_recv(const RecvArgs& a) {
  check(a);
  const RecvDescriptor spec{{a.rank, a.tag}, a.buffer, a.size, a.local, a.context};
  // From a failed rank only a message that arrived before the failure can still match.
  const bool from_failed = a.rank != any_source && peer_down(a.rank);
  const auto res = matching_.add_recv(a.rank, a.tag, [&]() -> Packet* {
    if (from_failed) return nullptr;
    Packet* r = recv_descriptors_->get();
    if (r != nullptr) r->recv = spec;
    return r;
  });
  Packet* m = res.message;
  if (m == nullptr) {
    if (from_failed) return Status::make_failed(a.rank);
    if (res.queued == nullptr) return Status::make_retry(RetryReason::packet_pool);
    // Read after the matching lock (taken by fail_peer's sweep too): a receive queued for a
    // rank that failed meanwhile is failed here if the sweep ran before it was queued.
    if (__builtin_expect(a.rank != any_source && peer_down(a.rank), 0)) fail_recvs(a.rank);
    return Status::make_posted();
  }
  const auto h = decode<WireHeader>(m->data());
  if (h.kind == MsgKind::rts_msg) {
    rendezvous_.start_recv(m, &spec);
    return Status::make_posted();
  }
  // An eager message was already here: copy it out and finish now.
  const std::size_t have = message_size(m);
  if (have > a.size) {  // truncation is reported through the completion object
    deliver_message(spec, m);
    return Status::make_posted();
  }
  if (have != 0) std::memcpy(a.buffer, message_payload(m), have);
  Status s = Status::make_done();
  s.rank = h.src;
  s.tag = h.tag;
  s.size = have;
  release_message(m);
  return s;
}

// ---- RMA and memory registration ----------------------------------------------------------

// Checks a put's notification and returns its remote CQ data (0 without notification).
std::uint64_t DeviceImpl::notify_data(const PutArgs& a) const {
  if (!a.notify) return 0;
  if (a.notify_target.id >= targets_.max_targets()) {
    throw Error("post_put: notify_target=" + std::to_string(a.notify_target.id) + " is out of range; FERRY_MAX_TARGETS=" +
                str(targets_.max_targets()));
  }
  if (a.notify_tag > 0xFFFF) throw Error("post_put: notify_tag=" + std::to_string(a.notify_tag) + " is out of range 0..65535");
  const net::Caps& caps = *route_[static_cast<std::size_t>(a.rank)]->caps;
  if (caps.remote_data_bytes < 4) {
    throw Error("post_put: notify needs 4 bytes of remote data; transport " + caps.name + " offers " +
                str(caps.remote_data_bytes));
  }
  std::uint64_t data = (static_cast<std::uint64_t>(a.notify_target.id) << 16) | a.notify_tag;
  if (caps.remote_data_bytes >= 8) data |= static_cast<std::uint64_t>(rank_) << 32;
  return data;
}

// Checks that an iovec message's descriptor fits one packet.
void DeviceImpl::check_iovec_fits(const AmIovecArgs& a) const {
  const std::size_t need = kHeader + sizeof(RtsBody) + a.eager.size + a.parts.size() * sizeof(RtsPart);
  if (need > config_.packet_size) {
    throw Error("post_am_iovec: eager.size=" + str(a.eager.size) + " with " + str(a.parts.size()) + " parts needs " +
                str(need) + " bytes; a packet holds " + str(config_.packet_size) + " (FERRY_PACKET_SIZE)");
  }
}

Status DeviceImpl::post_put(const PutArgs& a) {
  const std::uint64_t data = check(a);
  if (__builtin_expect(peer_down(a.rank), 0)) return Status::make_failed(a.rank);
  return rma_.post(RmaRequest{OpKind::put, a.rank, static_cast<unsigned char*>(const_cast<void*>(a.buffer)), a.size,
                                    a.remote, a.offset, a.local, a.context, a.notify, data});
}

Status DeviceImpl::post_get(const GetArgs& a) {
  check(a);
  if (__builtin_expect(peer_down(a.rank), 0)) return Status::make_failed(a.rank);
  if (a.size == 0) return Status::make_done();
  return rma_.post(RmaRequest{OpKind::get, a.rank, static_cast<unsigned char*>(a.buffer), a.size, a.remote, a.offset,
                                    a.local, a.context, false, 0});
}

MemoryRegion DeviceImpl::register_memory(void* data, std::size_t size) {
  check_alive("register_memory");
  check_buffer("register_memory", "data", data, size);
  if (size == 0) throw Error("register_memory: size=0; a region needs at least one byte");
  auto r = std::make_unique<RegionImpl>();
  r->data = data;
  r->size = size;
  return register_region(std::move(r));
}

MemoryRegion DeviceImpl::allocate_memory(std::size_t size) {
  check_alive("allocate_memory");
  if (size == 0) throw Error("allocate_memory: size=0; a region needs at least one byte");
  auto r = std::make_unique<RegionImpl>();
  r->block = allocate_shared(size, rank_);
  r->data = r->block.data;
  r->size = size;
  return register_region(std::move(r));
}

MemoryRegion DeviceImpl::register_region(std::unique_ptr<RegionImpl> r) {
  void* const data = r->data;
  const std::size_t size = r->size;
  r->device = this;
  const net::Access access = net::Access::send | net::Access::recv | net::Access::remote_read | net::Access::remote_write;
  for (Link& l : links_) {
    r->registrations.emplace_back(l.transport, l.transport->register_memory(data, size, access));
    // The key peers name the region by is the one of a transport that uses keys (a network
    // backend); shared memory addresses regions by their virtual address alone.
    if (r->registrations.size() == 1 || r->registrations.back().second->key() != 0) {
      r->key = r->registrations.back().second->key();
    }
  }
  regions_.add(data, size, r->key);
  return MemoryRegion(std::move(r));
}

Status DeviceImpl::post_atomic(const AtomicArgs& a) {
  check(a);
  if (a.rank == rank_) {
    if (!atomics_.perform_local(a)) {
      throw Error("post_atomic: the remote key names no region registered on this device (it was deregistered)");
    }
    return Status::make_done();
  }
  if (__builtin_expect(peer_down(a.rank), 0)) return Status::make_failed(a.rank);
  // A peer's allocated region on this host: a CPU atomic on this process's mapping of it.
  if (a.remote.shared != 0 && host_of_[static_cast<std::size_t>(a.rank)] == host_of_[static_cast<std::size_t>(rank_)]) {
    if (unsigned char* at = mappings_.find(a.remote)) {
      atomics_.perform_at(at + a.offset, a);
      return Status::make_done();
    }
  }
  if (!fragments_.clear()) return Status::make_retry(RetryReason::transport);
  return atomics_.post(a);
}

RegionImpl::~RegionImpl() {
  if (device != nullptr) device->forget_region(*this);
  for (auto& [transport, registration] : registrations) transport->deregister(registration);
  free_shared(block);
}

}  // namespace ferry::detail
