// barrier.cpp — the runtime's dissemination barrier and the departure a finalizing rank
// announces (Barrier).
#include "core/barrier.hpp"

#include <chrono>
#include <exception>

#include "common/cpu_relax.hpp"
#include "common/log.hpp"
#include "core/failure_detector.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {

void Barrier::arrived(int src, std::uint32_t step) noexcept {
  if (src < 0 || src >= size_) return;
  if (step == kDepartStep) {
    failures_.departed(src);
    return;
  }
  // Release, paired with the barrier's acquire (see the contract in barrier.hpp).
  steps_[(step >> 8) & 1][step & 31].fetch_add(1, std::memory_order_release);
}

void Barrier::wait() {
  failures_.throw_if_failed("barrier");
  // The barrier's steps travel on device 0, whose progress this thread cannot run again from
  // inside it: the wait would never end.
  if (devices_.progressing_device0()) {
    throw Error("barrier: called from inside device 0's progress (from a Handler's callback, say); its steps "
                "arrive through that progress, which must return first");
  }
  // Operations this rank posted before the barrier are performed before it: a deferring lock
  // model (lockq, offload) may still hold some in its queue.
  devices_.perform_deferred();
  const std::uint32_t parity = epoch_++ & 1;
  int round = 0;
  // Ranks reach a barrier at different times: the early ones yield their core once progress
  // finds nothing for a while, to the late ones when ranks outnumber cores.
  IdleBackoff idle;
  for (int dist = 1; dist < size_; dist *= 2, ++round) {
    const int to = (rank_ + dist) % size_;
    const std::uint32_t step = (parity << 8) | static_cast<std::uint32_t>(round);
    while (!devices_.post_barrier_step(to, step)) {
      idle(devices_.progress_devices());
      failures_.throw_if_failed("barrier");
    }
    std::atomic<int>& arrived = steps_[parity][round];
    // A failed peer ends the wait only while the step is missing: its sender, or a rank the
    // sender waits for, may be the failed one, and nothing else would end it.
    while (arrived.load(std::memory_order_acquire) == 0) {
      idle(devices_.progress_devices());
      if (arrived.load(std::memory_order_acquire) == 0) failures_.throw_if_failed("barrier");
    }
    // Relaxed: only the count matters here; the acquire above ordered the data.
    arrived.fetch_sub(1, std::memory_order_relaxed);
  }
}

// So the end of this rank's process that follows is not taken for a failure. Best effort
// within a second: a peer that misses it (its queue full all that time) reports this rank
// failed, which is what it would see anyway.
void Barrier::depart() noexcept {
  if (size_ == 1) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  try {
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || failures_.failed(r) || !devices_.in_touch(r)) continue;
      IdleBackoff idle;
      while (!devices_.post_barrier_step(r, kDepartStep) && std::chrono::steady_clock::now() < deadline) {
        idle(devices_.progress_devices());
      }
    }
  } catch (const std::exception& e) {
    FERRY_LOG_AT(warn, rank_, -1, "finalize: could not tell every peer this rank is leaving: %s", e.what());
  }
}

}  // namespace ferry::detail
