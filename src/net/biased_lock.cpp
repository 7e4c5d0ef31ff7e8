// biased_lock.cpp — thread numbers and the slow path of BiasedLock (see biased_lock.hpp).
#include "net/biased_lock.hpp"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <thread>

#include "common/cpu_relax.hpp"
#include "common/tsan.hpp"
#include "net/hazard.hpp"

namespace ferry::net {

namespace biased_detail {

constinit thread_local std::uint64_t tls_id __attribute__((tls_model("initial-exec"))) = 0;

std::uint64_t assign_id() noexcept {
  // Relaxed: the numbers only need to differ, not to order anything.
  static std::atomic<std::uint64_t> next{1};
  tls_id = next.fetch_add(1, std::memory_order_relaxed);
  return tls_id;
}

}  // namespace biased_detail

namespace {
bool can_bias() noexcept {
#ifdef FERRY_TSAN
  return false;
#else
  return hazard_detail::expedited();  // registers expedited membarrier for the process once
#endif
}
}  // namespace

BiasedLock::BiasedLock() noexcept : bias_(can_bias() ? 0 : kRevoked) {}

BiasedLock::Held BiasedLock::lock_slow() noexcept {
  const std::uint64_t me = biased_detail::self();
  spin_.lock();  // slow paths one at a time
  const std::uint64_t b = bias_.load(std::memory_order_acquire);
  if (b == kRevoked) return Held{};  // revoked for good: spin_ is the lock
  unsigned next = 0;
  if (b != 0) {
    // Another thread's tenure (this thread's own would have let its fast path in: only a
    // holder of spin_ changes bias_). Revoke it: the owner backs out or is waited for.
    const unsigned t = static_cast<unsigned>(b & 0xff);
    bias_.store(kRevoked, std::memory_order_seq_cst);
    syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0);
    // The owner's critical section is one non-blocking call; yield to it if it was preempted.
    for (int spins = 0; inside_[t].load(std::memory_order_acquire); ++spins) {
      if (spins < 1024) detail::cpu_relax(); else std::this_thread::yield();
    }
    next = t + 1;
    if (next == kTenures) return Held{};  // the last tenure: revoked for good, spin_ held
  }
  // This thread's tenure. Its fast entries are ordered after the revocation by program order.
  bias_.store(me << 8 | next, std::memory_order_release);
  inside_[next].store(true, std::memory_order_relaxed);
  spin_.unlock();
  return Held{true, next};
}

}  // namespace ferry::net
