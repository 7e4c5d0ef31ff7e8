// biased_lock.cpp — thread numbers and the slow path of BiasedLock (see biased_lock.hpp).
#include "common/biased_lock.hpp"

#include "common/cpu_relax.hpp"
#include "common/tsan.hpp"
#include "common/membarrier.hpp"

namespace ferry::detail {

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
  return membarrier::expedited();  // registers expedited membarrier for the process once
#endif
}
}  // namespace

BiasedLock::BiasedLock() noexcept : bias_(can_bias() ? 0 : kRevoked) {}

BiasedLock::Held BiasedLock::lock_slow() noexcept {
  const std::uint64_t me = biased_detail::self();
  // Slow paths one at a time. spin_ may be held across a long call (a progress call, close's
  // flush) once the lock is revoked, so a waiter yields after a short spin.
  detail::IdleBackoff wait_lock;
  while (!spin_.try_lock()) wait_lock(false);
  const std::uint64_t b = bias_.load(std::memory_order_acquire);
  if (b == kRevoked) return Held{};  // revoked for good: spin_ is the lock
  unsigned next = 0;
  if (b != 0) {
    // Another thread's tenure (this thread's own would have let its fast path in: only a
    // holder of spin_ changes bias_). Revoke it: the owner backs out or is waited for.
    const unsigned t = static_cast<unsigned>(b & 0xff);
    bias_.store(kRevoked, std::memory_order_seq_cst);
    membarrier::barrier_all();
    // The owner's critical section is one non-blocking call; yield to it if it was preempted.
    detail::IdleBackoff wait_owner;
    while (inside_[t].load(std::memory_order_acquire)) wait_owner(false);
    next = t + 1;
    if (next == kTenures) return Held{};  // the last tenure: revoked for good, spin_ held
  }
  // This thread's tenure. Its fast entries are ordered after the revocation by program order.
  bias_.store(me << 8 | next, std::memory_order_release);
  inside_[next].store(true, std::memory_order_relaxed);
  spin_.unlock();
  return Held{true, next};
}

}  // namespace ferry::detail
