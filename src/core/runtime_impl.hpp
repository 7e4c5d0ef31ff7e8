// runtime_impl.hpp — the runtime as wiring: it resolves the options, runs the bootstrap, opens
// the backends, builds the devices and their lock models, hands out the public handles, and
// owns the three objects that do the runtime's own jobs, giving each device what it uses of
// them (DeviceParts):
//  - TargetTable (target_table.hpp): the remote targets, which the receive path reads;
//  - PeerFailures (failure_detector.hpp): failure detection (keepalive, peer checks, launcher);
//  - Barrier (barrier.hpp): the barrier and the departure message, over device 0.
// The public handles' bodies are in runtime_api.cpp, the plan of transports in job_plan.cpp.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "core/barrier.hpp"
#include "core/config.hpp"
#include "core/device.hpp"
#include "core/failure_detector.hpp"
#include "core/lock_model.hpp"
#include "core/progress.hpp"
#include "core/target_table.hpp"
#include "ferry/runtime.hpp"
#include "net/backend.hpp"

namespace ferry::detail {

class RuntimeImpl final : private BarrierDevices {
 public:
  explicit RuntimeImpl(const RuntimeOptions& options);
  ~RuntimeImpl();

  void finalize();
  bool finalized() const noexcept { return finalized_.load(std::memory_order_relaxed); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const Config& config() const noexcept { return config_; }
  const Resolved<RuntimeSettings>& options() const noexcept { return options_; }
  bootstrap::Bootstrap& boot() { return *boot_; }
  // After start-up the bootstrap is shared by the application's kv calls and the transports'
  // connects on first use (address_lookup): whoever uses it holds this. A connect only tries it
  // (busy: the post answers retry), so a rank inside kv_fence makes no new connection until
  // the fence returns.
  std::mutex& boot_mutex() noexcept { return boot_mutex_; }
  // The network backend's provider ("tcp;ofi_rxm", "ucx"), or "none" when no peer is reached
  // through a network backend.
  std::string provider() const { return network_ != nullptr ? network_->provider() : "none"; }
  std::string transport() const { return devices_.empty() ? "" : devices_[0]->transport_names(); }
  std::string transport_of(int rank) const { return devices_.empty() ? "" : devices_[0]->describe_peer(rank); }
  std::vector<Device>& handles() { return handles_; }

  TargetTable& targets() noexcept { return *targets_; }
  Footprint footprint() const;
  PeerFailures& failures() noexcept { return *failures_; }
  const PeerFailures& failures() const noexcept { return *failures_; }
  Barrier& barrier() noexcept { return *barrier_; }
  // By rank, the lowest rank on its host: ranks with one value share a host (a "host" Team).
  const std::vector<std::uint32_t>& host_of() const noexcept { return host_of_; }
  // What a device built on this runtime uses of it.
  DeviceParts device_parts() noexcept { return DeviceParts{rank_, size_, *targets_, *failures_, *barrier_, host_of_}; }

 private:
  // BarrierDevices: the barrier's own traffic on device 0, and progress on every device,
  // entering each device as its lock model lets a post in.
  bool post_barrier_step(int to, std::uint32_t step) override;
  bool progress_devices() override;
  bool progressing_device0() const noexcept override { return devices_[0]->progressing_here(); }
  void perform_deferred() override;
  bool in_touch(int rank) const noexcept override {
    for (const auto& d : devices_) {
      if (d->in_touch(rank)) return true;
    }
    return false;
  }
  // Teardown: progresses `device` (through its lock model) until its own operations are
  // complete or `seconds` pass. Returns the number still in flight.
  std::size_t drain(DeviceImpl& device, double seconds);

  Resolved<RuntimeSettings> options_;
  const Config& config_ = options_.settings;  // the typed values of options_
  // A connect on first use's lookup of `key` ("ferry.ep.<device>.<transport>").
  net::AddressLookup address_lookup(std::string key);

  std::unique_ptr<bootstrap::Bootstrap> boot_;
  std::mutex boot_mutex_;
  std::size_t bootstrap_reads_ = 0;  // start-up's (Footprint)
  std::size_t address_reads_ = 0;    // start-up's reads of peers' addresses
  // Reads of connects on first use since. Relaxed: counts for the footprint.
  std::atomic<std::size_t> lazy_reads_{0};
  std::size_t keepalive_links_ = 0;
  int rank_ = 0;
  int size_ = 1;
  std::vector<std::uint32_t> host_of_;
  // The backends this process opened, in each device's transport order; declared before
  // failures_ (whose keepalive channel is made by the network backend) and devices_, so they
  // outlive every transport they made.
  std::vector<std::unique_ptr<net::Backend>> backends_;
  net::Backend* network_ = nullptr;  // the one that reaches other hosts, or null
  // The runtime's own jobs; declared before devices_, which hold references to them.
  std::unique_ptr<TargetTable> targets_;
  std::unique_ptr<PeerFailures> failures_;
  std::unique_ptr<Barrier> barrier_;
  std::vector<std::unique_ptr<DeviceImpl>> devices_;
  // Per device, its lock model or null (lockless, serialized). Declared after devices_, so destroyed
  // before them: an offload thread stops before its device's endpoint closes.
  std::vector<std::unique_ptr<LockModelImpl>> lock_models_;
  std::vector<Device> handles_;
  std::atomic<bool> finalized_{false};
  std::unique_ptr<ProgressThreads> progress_threads_;  // FERRY_PROGRESS=thread:N; stopped first in finalize()
  friend class ferry::Runtime;
};

}  // namespace ferry::detail
