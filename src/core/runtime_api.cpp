// runtime_api.cpp — the bodies of the public handles (Runtime, Exposure, version) over
// RuntimeImpl and the owners it wires (target table, failures, barrier): argument checks that
// name the argument, then the call.
#include "core/recv_blocks.hpp"
#include "core/runtime_impl.hpp"
#include "ferry/error.hpp"

namespace ferry {

// ---- public handles --------------------------------------------------------------------------

Runtime::Runtime(const RuntimeOptions& options) : impl_(std::make_unique<detail::RuntimeImpl>(options)) {}
Runtime::~Runtime() = default;
int Runtime::rank() const noexcept { return impl_->rank(); }
int Runtime::size() const noexcept { return impl_->size(); }
int Runtime::device_count() const noexcept { return static_cast<int>(impl_->handles().size()); }
Device& Runtime::device(int index) {
  if (impl_->finalized()) throw Error("device: called after the runtime was finalized");
  if (index < 0 || index >= device_count()) {
    throw Error("device: index=" + std::to_string(index) + " is out of range; this runtime has " +
                std::to_string(device_count()) + " devices (FERRY_DEVICES)");
  }
  return impl_->handles()[static_cast<std::size_t>(index)];
}
std::string Runtime::provider() const { return impl_->provider(); }
std::string Runtime::transport() const { return impl_->transport(); }
std::string Runtime::transport_of(int rank) const {
  if (rank < 0 || rank >= size()) {
    throw Error("transport_of: rank=" + std::to_string(rank) + " is out of range; the job has " + std::to_string(size()) + " ranks");
  }
  return impl_->transport_of(rank);
}
std::string Runtime::bootstrap() const { return std::string(impl_->boot().kind()); }
const Resolved<RuntimeSettings>& Runtime::options() const noexcept { return impl_->options(); }
Exposure Runtime::expose(CompletionObject& object, std::uint16_t id) {
  if (impl_->finalized()) throw Error("expose: called after the runtime was finalized");
  impl_->targets().expose(object, id);
  return Exposure(impl_.get(), id);
}
void Runtime::finalize() { impl_->finalize(); }
void Runtime::barrier() {
  if (impl_->finalized()) throw Error("barrier: called after the runtime was finalized");
  impl_->barrier().wait();
}
std::vector<int> Runtime::failed_ranks() const { return impl_->failures().failed_ranks(); }
Footprint Runtime::footprint() const { return impl_->footprint(); }
std::size_t Runtime::trim_memory() {
  std::size_t bytes = detail::recv_blocks::release_cached();
  for (int d = 0; d < device_count(); ++d) bytes += device(d).trim_memory();
  return bytes;
}
std::uint32_t Runtime::failure_count() const noexcept { return impl_->failures().failure_count(); }
void Runtime::kv_put(const std::string& key, const std::string& value) {
  const std::lock_guard<std::mutex> hold(impl_->boot_mutex());
  impl_->boot().put(key, value);
}
void Runtime::kv_fence() {
  const std::lock_guard<std::mutex> hold(impl_->boot_mutex());
  impl_->boot().fence();
}
std::string Runtime::kv_get(int rank, const std::string& key) {
  if (rank < 0 || rank >= size()) {
    throw Error("kv_get: rank=" + std::to_string(rank) + " is out of range; the job has " + std::to_string(size()) + " ranks");
  }
  const std::lock_guard<std::mutex> hold(impl_->boot_mutex());
  return impl_->boot().get(rank, key);
}

Exposure& Exposure::operator=(Exposure&& other) noexcept {
  if (this != &other) {
    if (rt_ != nullptr) rt_->targets().unexpose(id_);
    rt_ = other.rt_;
    id_ = other.id_;
    other.rt_ = nullptr;
  }
  return *this;
}
Exposure::~Exposure() {
  if (rt_ != nullptr) rt_->targets().unexpose(id_);
}

// Lockless devices call straight through (one predictable branch on the handle's own field);
// the other lock models go through the device's LockModelImpl.
Status Device::post_am(const AmArgs& a) {
  if (lock_model_ != nullptr) return lock_model_->post(a);
  return impl_->post_am(a);
}
Status Device::post_am_iovec(const AmIovecArgs& a) {
  if (lock_model_ != nullptr) return lock_model_->post(a);
  return impl_->post_am_iovec(a);
}
Status Device::post_send(const SendArgs& a) {
  if (lock_model_ != nullptr) return lock_model_->post(a);
  return impl_->post_send(a);
}
Status Device::post_recv(const RecvArgs& a) {
  if (lock_model_ != nullptr) return lock_model_->post(a);
  return impl_->post_recv(a);
}
Status Device::post_put(const PutArgs& a) {
  if (lock_model_ != nullptr) return lock_model_->post(a);
  return impl_->post_put(a);
}
Status Device::post_get(const GetArgs& a) {
  if (lock_model_ != nullptr) return lock_model_->post(a);
  return impl_->post_get(a);
}
Status Device::post_atomic(const AtomicArgs& a) {
  if (lock_model_ != nullptr) return lock_model_->post(a);
  return impl_->post_atomic(a);
}
bool Device::progress() {
  if (lock_model_ != nullptr) return lock_model_->progress();
  return impl_->progress();
}
MemoryRegion Device::register_memory(void* data, std::size_t size) { return impl_->register_memory(data, size); }
MemoryRegion Device::allocate_memory(std::size_t size) { return impl_->allocate_memory(size); }
int Device::index() const noexcept { return impl_->index(); }
DeviceStats Device::stats() const noexcept {
  DeviceStats s = lock_model_ != nullptr ? lock_model_->stats() : DeviceStats{};
  s.malformed = impl_->malformed();
  s.delivered_inline = impl_->delivered_inline();
  return s;
}
DeviceFootprint Device::footprint() const noexcept { return impl_->footprint(); }
std::size_t Device::trim_memory() { return impl_->trim_memory(); }
std::size_t Device::eager_limit() const noexcept { return impl_->eager_limit(); }
std::size_t Device::iovec_eager_limit(std::size_t parts) const noexcept { return impl_->iovec_eager_limit(parts); }

MemoryRegion::MemoryRegion() noexcept = default;
MemoryRegion::MemoryRegion(std::unique_ptr<detail::RegionImpl> impl) noexcept : impl_(std::move(impl)) {}
MemoryRegion::MemoryRegion(MemoryRegion&&) noexcept = default;
MemoryRegion& MemoryRegion::operator=(MemoryRegion&&) noexcept = default;
MemoryRegion::~MemoryRegion() = default;
void* MemoryRegion::data() const noexcept { return impl_ ? impl_->data : nullptr; }
std::size_t MemoryRegion::size() const noexcept { return impl_ ? impl_->size : 0; }
RemoteKey MemoryRegion::remote_key() const {
  if (!impl_) throw Error("remote_key: the MemoryRegion is empty");
  RemoteKey k;
  k.base = reinterpret_cast<std::uint64_t>(impl_->data);
  k.size = impl_->size;
  k.key = impl_->key;
  k.rank = impl_->device->rank();
  k.device = impl_->device->index();
  k.shared = impl_->block.shared;
  return k;
}

const char* version() noexcept { return FERRY_VERSION_STRING; }

}  // namespace ferry
