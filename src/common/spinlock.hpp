// spinlock.hpp — a test-and-test-and-set lock for short critical sections.
//
// Contract: try_lock never waits. lock() spins (with a pause hint) and is used only where the
// critical section is a bounded handful of pointer updates (the matching lists); progress
// paths use try_lock only, so a preempted holder never stalls a poller.
//
// Memory orders: acquire on taking the lock and release on dropping it order the protected
// data; the spinning pre-check is relaxed because it only predicts whether the exchange can
// succeed and the exchange itself re-validates with acquire.
#pragma once

#include <atomic>

#include "common/cpu_relax.hpp"

namespace ferry::detail {

class SpinLock {
 public:
  bool try_lock() noexcept {
    return !locked_.load(std::memory_order_relaxed) && !locked_.exchange(true, std::memory_order_acquire);
  }
  void lock() noexcept {
    while (!try_lock()) {
      while (locked_.load(std::memory_order_relaxed)) cpu_relax();
    }
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

}  // namespace ferry::detail
