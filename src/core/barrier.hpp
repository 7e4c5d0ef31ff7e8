// barrier.hpp — the runtime's barrier: a dissemination barrier over device 0, the steps that
// arrived for it, and the departure message a finalizing rank sends every peer.
//
// Contract: wait() and depart() run on one thread at a time (the application's, or
// finalize's); the epoch is that thread's alone. arrived() runs inside any device's progress,
// on any thread. Each step's count is incremented with release and read with acquire by
// wait() as it waits, so what the thread that took a step in did before (a peer's put it
// applied, say, under the offload model) happens before what wait()'s caller does after it. The decrement that consumes a step is
// relaxed: only the count matters there, the acquire that saw it ordered the data.
// The barrier reaches the devices only through BarrierDevices, not the runtime.
#pragma once

#include <atomic>
#include <cstdint>

namespace ferry::detail {

class PeerFailures;

// What the barrier needs of the runtime's devices. Implemented by the runtime, which knows
// each device's lock model: a device is entered as its lock model lets a post in (never beside
// the thread that owns it: a UCX worker in serialised mode, an offload thread).
class BarrierDevices {
 public:
  // Posts barrier step `step` to `to` on device 0; false when it must be retried.
  virtual bool post_barrier_step(int to, std::uint32_t step) = 0;
  // Progress on every device; true when any device or lock model did something.
  virtual bool progress_devices() = 0;
  // Whether the calling thread is inside device 0's progress.
  virtual bool progressing_device0() const noexcept = 0;
  // Waits until every deferring lock model has performed the posts it held.
  virtual void perform_deferred() = 0;
  // Whether `rank` may hold a connection to this rank on some device (DeviceImpl::in_touch):
  // a rank connected on first use that never talked with this one needs no departure.
  virtual bool in_touch(int rank) const noexcept = 0;

 protected:
  ~BarrierDevices() = default;
};

class Barrier {
 public:
  Barrier(int rank, int size, PeerFailures& failures, BarrierDevices& devices) noexcept
      : rank_(rank), size_(size), failures_(failures), devices_(devices) {}
  Barrier(const Barrier&) = delete;
  Barrier& operator=(const Barrier&) = delete;

  // Collective: keeps every device progressing while it waits, so peers that need this rank's
  // progress are never starved. Throws PeerFailed once a peer failed while a step is missing.
  void wait();
  // A barrier step arrived from `src`; the step kDepartStep says the sender finalized.
  void arrived(int src, std::uint32_t step) noexcept;
  // The barrier-kind message a finalizing rank sends every peer before its process may end:
  // its end is a departure, not a failure (see PeerFailures::check_peers). Barrier steps use
  // tags below 512.
  static constexpr std::uint32_t kDepartStep = 0x10000;
  // Finalize: sends kDepartStep to every peer not failed, best effort within a second.
  void depart() noexcept;

 private:
  const int rank_;
  const int size_;
  PeerFailures& failures_;
  BarrierDevices& devices_;
  // Steps received, by epoch parity and round. Ranks can be at most one epoch apart (nobody
  // finishes epoch e+1 before everyone finished e), so parity tells epochs apart.
  std::atomic<int> steps_[2][32] = {};
  std::uint32_t epoch_ = 0;  // only the thread calling wait() touches it
};

}  // namespace ferry::detail
