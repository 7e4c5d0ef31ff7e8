// runtime_impl.hpp — the runtime: bootstrap, transports, devices, and the remote-target table.
//
// Remote targets: targets_[id] holds the address of the completion object exposed under id, or
// 0; its low bit (free: the object is at least pointer-aligned) is set when the object does not
// batch (CompletionObject::batches(), read once by expose()), so the fast path that signals
// such an object at once needs no virtual call to ask. Delivery (inside progress, any thread)
// loads it with acquire, pairing with the release store in expose(), so the object is fully
// constructed when signalled. A message for an id that is not exposed yet is parked under
// park_mutex_ (a slow path: it only happens when a sender is ahead of the receiver's setup) and
// handed over by expose().
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "core/config.hpp"
#include "core/device.hpp"
#include "core/heartbeats.hpp"
#include "core/liveness.hpp"
#include "core/lock_model.hpp"
#include "core/progress.hpp"
#include "ferry/runtime.hpp"
#include "net/backend.hpp"

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
  const Resolved<RuntimeSettings>& options() const noexcept { return options_; }
  bootstrap::Bootstrap& boot() { return *boot_; }
  // The network backend's provider ("tcp;ofi_rxm", "ucx"), or "none" when no peer is reached
  // through a network backend.
  std::string provider() const { return network_ != nullptr ? network_->provider() : "none"; }
  std::string transport() const { return devices_.empty() ? "" : devices_[0]->transport_names(); }
  std::string transport_of(int rank) const { return devices_.empty() ? "" : devices_[0]->describe_peer(rank); }
  std::vector<Device>& handles() { return handles_; }

  // Collective: a dissemination barrier over device 0 that keeps every device progressing
  // while it waits, so peers that need this rank's progress are never starved.
  void barrier();
  // A barrier step arrived from `src`; the step kDepartStep says the sender finalized.
  void barrier_arrived(int src, std::uint32_t step) noexcept;
  // The barrier-kind message a finalizing rank sends every peer before its process may end:
  // its end is a departure, not a failure (see check_peers). Barrier steps use tags below 512.
  static constexpr std::uint32_t kDepartStep = 0x10000;

  // Peer failure (see Runtime::failed_ranks). peer_failed() records that `rank` failed, once,
  // and tells every device (each acts on it in its next progress, under its poll lock).
  // Any thread; `how` says what showed it.
  void peer_failed(int rank, const std::string& how) noexcept;
  // Relaxed: a post that reads a stale 0 goes to the transport, which fails or is dropped like
  // one posted just before the failure; ordering against a device's pending-operation tables
  // comes from their own locks (see DeviceImpl::fail_peer).
  bool failed(int rank) const noexcept { return failed_[static_cast<std::size_t>(rank)].load(std::memory_order_relaxed) != 0; }
  const std::atomic<std::uint8_t>* failed_table() const noexcept { return failed_.get(); }
  // Bumped by every new failure; a device compares it with the value it last acted on.
  // Acquire pairs with the release increment in peer_failed(): a device that sees the new
  // count sees the failed_ flag set before it.
  std::uint32_t failure_count() const noexcept { return failure_count_.load(std::memory_order_acquire); }
  std::vector<int> failed_ranks() const;
  // At most once per FERRY_PEER_CHECK_MS (by whichever progress call comes first): checks the
  // watched peers' processes; one seen ended is failed at the next check unless it departed
  // (kDepartStep). Cheap when it is not yet time: one clock read. Peers on other hosts are
  // the keepalive thread's (keep_alive).
  void check_peers() noexcept;
  // Throws PeerFailed naming the first failed rank, if any; `call` names the caller.
  void throw_if_failed(const char* call) const;

  void expose(CompletionObject& object, std::uint16_t id);
  void unexpose(std::uint16_t id) noexcept;
  void deliver(std::uint16_t id, Completion&& completion) noexcept;
  // The object exposed under `id`, or null (not exposed yet, or out of range): deliver's
  // fast path, for a caller that signals the object itself.
  CompletionObject* exposed(std::uint16_t id) const noexcept {
    return id < config_.max_targets ? object_at(targets_[id].load(std::memory_order_acquire)) : nullptr;
  }
  // The object exposed under `id` if it does not batch (it is signalled at once), else null.
  CompletionObject* exposed_at_once(std::uint16_t id) const noexcept {
    if (id >= config_.max_targets) return nullptr;
    const std::uintptr_t v = targets_[id].load(std::memory_order_acquire);
    return (v & kAtOnce) != 0 ? object_at(v) : nullptr;
  }
  std::size_t max_targets() const noexcept { return config_.max_targets; }

 private:
  // Finalize: sends kDepartStep to every peer (see check_peers).
  void depart() noexcept;
  // The keepalive thread's body (the channel polled, heartbeats out, silence checks; departing
  // heartbeats when it stops), and its end (idempotent).
  void keep_alive() noexcept;
  void stop_keepalive() noexcept;
  // Teardown: progresses `device` (through its lock model) until its own operations are
  // complete or `seconds` pass. Returns the number still in flight.
  std::size_t drain(DeviceImpl& device, double seconds);
  // The barrier's own traffic on device 0, and progress on every device, entering each device
  // as its lock model lets a post in (never beside the thread that owns it: a UCX worker in
  // serialised mode, an offload thread).
  bool post_barrier_step(int to, std::uint32_t step);
  bool progress_devices();  // true when any device or lock model did something

  Resolved<RuntimeSettings> options_;
  const Config& config_ = options_.settings;  // the typed values of options_
  std::unique_ptr<bootstrap::Bootstrap> boot_;
  int rank_ = 0;
  int size_ = 1;
  // The backends this process opened, in each device's transport order; declared before
  // devices_, so they outlive every transport they made.
  std::vector<std::unique_ptr<net::Backend>> backends_;
  net::Backend* network_ = nullptr;  // the one that reaches other hosts, or null
  // The keepalive's channel (on fabric_), when the job spans hosts and FERRY_PEER_TIMEOUT_MS
  // is not 0; used only by the keepalive thread once it runs.
  std::unique_ptr<HeartbeatChannel> heartbeats_;
  std::vector<std::unique_ptr<DeviceImpl>> devices_;
  // Per device, its lock model or null (lockless, serialized). Declared after devices_, so destroyed
  // before them: an offload thread stops before its device's endpoint closes.
  std::vector<std::unique_ptr<LockModelImpl>> lock_models_;
  std::vector<Device> handles_;
  static constexpr std::uintptr_t kAtOnce = 1;  // targets_'s low bit: the object does not batch
  static CompletionObject* object_at(std::uintptr_t v) noexcept {
    return reinterpret_cast<CompletionObject*>(v & ~kAtOnce);
  }
  std::unique_ptr<std::atomic<std::uintptr_t>[]> targets_;
  std::mutex park_mutex_;
  std::vector<std::pair<std::uint16_t, Completion>> parked_;
  std::atomic<bool> finalized_{false};
  std::unique_ptr<std::atomic<std::uint8_t>[]> failed_;  // by rank: 1 once the rank failed
  std::atomic<std::uint32_t> failure_count_{0};
  std::atomic<int> first_failed_{-1};
  PeerWatch watch_;
  std::mutex watch_mutex_;  // check_peers takes it with try_lock: one checker at a time
  std::atomic<std::int64_t> next_check_ns_{0};  // steady clock; relaxed: a hint, the mutex guards the watch
  // By rank: 1 once its departure message (data path) or departing heartbeat (keepalive
  // channel) arrived. Relaxed: check_peers reads it one check interval after the watch saw the
  // process end, long after the message was polled; the keepalive thread and peer_failed only
  // need it eventually (a peer failed just before its departure is seen is still a peer that
  // stopped answering), and it guards no other data.
  std::unique_ptr<std::atomic<std::uint8_t>[]> departed_;
  std::vector<int> suspects_;  // under watch_mutex_: processes seen ended at the last check
  Keepalive keepalive_;  // started before the keepalive thread, checked only by it
  std::thread keepalive_thread_;
  std::mutex keepalive_mutex_;
  std::condition_variable keepalive_wake_;
  bool keepalive_stop_ = false;  // under keepalive_mutex_
  pid_t launcher_ = 0;         // FERRY_LAUNCHER_WATCH: the parent at start-up (0: not watched)
  std::unique_ptr<ProgressThreads> progress_threads_;  // FERRY_PROGRESS=thread:N; stopped first in finalize()
  // Barrier steps received, by epoch parity and round. Ranks can be at most one epoch apart
  // (nobody finishes epoch e+1 before everyone finished e), so parity tells epochs apart.
  // Relaxed increments: a step carries no data, the count is all that is read.
  std::atomic<int> barrier_steps_[2][32] = {};
  std::uint32_t barrier_epoch_ = 0;  // only the thread calling barrier() touches it
  friend class ferry::Runtime;
};

}  // namespace ferry::detail
