// runtime_impl.hpp — the runtime: bootstrap, provider, devices, and the remote-target table.
//
// Remote targets: targets_[id] points at the completion object exposed under id, or is null.
// Delivery (inside progress, any thread) loads it with acquire, pairing with the release
// store in expose(), so the object is fully constructed when signalled. A message for an id
// that is not exposed yet is parked under park_mutex_ (a slow path: it only happens when a
// sender is ahead of the receiver's setup) and handed over by expose().
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "core/config.hpp"
#include "core/device.hpp"
#include "ferry/runtime.hpp"
#include "net/fabric.hpp"

namespace ferry::detail {

class RuntimeImpl {
 public:
  explicit RuntimeImpl(const RuntimeOptions& options);
  ~RuntimeImpl();

  void finalize();
  bool finalized() const noexcept { return finalized_.load(std::memory_order_relaxed); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const Config& config() const noexcept { return config_; }
  bootstrap::Bootstrap& boot() { return *boot_; }
  net::Fabric& fabric() { return *fabric_; }
  std::vector<Device>& handles() { return handles_; }

  void expose(CompletionObject& object, std::uint16_t id);
  void unexpose(std::uint16_t id) noexcept;
  void deliver(std::uint16_t id, Completion&& completion) noexcept;
  std::size_t max_targets() const noexcept { return config_.max_targets; }

 private:
  Config config_;
  std::unique_ptr<bootstrap::Bootstrap> boot_;
  int rank_ = 0;
  int size_ = 1;
  std::unique_ptr<net::Fabric> fabric_;
  std::vector<std::unique_ptr<DeviceImpl>> devices_;
  std::vector<Device> handles_;
  std::unique_ptr<std::atomic<CompletionObject*>[]> targets_;
  std::mutex park_mutex_;
  std::vector<std::pair<std::uint16_t, Completion>> parked_;
  std::atomic<bool> finalized_{false};
  friend class ferry::Runtime;
};

}  // namespace ferry::detail
