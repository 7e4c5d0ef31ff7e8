// BiasedLock (net/biased_lock.hpp): mutual exclusion while the bias moves between threads and
// after it is revoked; the bias follows a thread that takes over, until the tenures run out.
#include "net/biased_lock.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "test_scale.hpp"

namespace {

using ferry::net::BiasedGuard;
using ferry::net::BiasedLock;

// Threads increment a plain counter under the lock and mark the section occupied; an entry
// that finds it occupied, or a lost increment, is a broken exclusion. Many fresh locks, so
// the first owner, the tenure transfers and the revocation all happen while others wait or
// sit inside. (A revoker that does not wait for the owner fails this within a few runs.)
TEST(BiasedLock, ExcludesWhileTheBiasMovesAndAfterItIsRevoked) {
  const std::size_t rounds = ferry::test::scaled(3000, 100);
  const std::size_t per_thread = 200;
  constexpr int kThreads = 3;
  std::uint64_t overlaps = 0, lost = 0;
  for (std::size_t round = 0; round < rounds; ++round) {
    BiasedLock lock;
    std::uint64_t counter = 0;  // plain: only the lock protects it
    std::atomic<bool> occupied{false};
    std::atomic<std::uint64_t> overlap{0};
    ferry::test::Gate gate;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        gate.wait();
        for (std::size_t i = 0; i < per_thread; ++i) {
          const BiasedGuard guard(&lock);
          if (occupied.exchange(true, std::memory_order_relaxed)) overlap.fetch_add(1, std::memory_order_relaxed);
          counter = counter + 1;
          // A section long enough for a revoker to arrive while the owner is in it.
          for (int spin = 0; spin < 64; ++spin) std::atomic_signal_fence(std::memory_order_seq_cst);
          occupied.store(false, std::memory_order_relaxed);
        }
      });
    }
    gate.open();
    for (std::thread& t : threads) t.join();
    overlaps += overlap.load();
    if (counter != kThreads * per_thread) lost += kThreads * per_thread - counter;
  }
  EXPECT_EQ(overlaps, 0u) << "two threads inside at once";
  EXPECT_EQ(lost, 0u) << "increments lost";
}

// One thread sets up, another drives: the second takes the bias over. Threads that keep
// taking turns use up the tenures, and the lock is then a spin lock for good.
TEST(BiasedLock, TheBiasFollowsATakeOverUntilTheTenuresRunOut) {
  BiasedLock lock;
  if (!lock.biased()) GTEST_SKIP() << "no expedited membarrier here (or TSan): the lock is a plain spin lock";
  {
    const BiasedGuard g(&lock);
  }
  EXPECT_TRUE(lock.biased());
  std::thread([&] {
    for (int i = 0; i < 1000; ++i) {
      const BiasedGuard g(&lock);
    }
  }).join();
  EXPECT_TRUE(lock.biased()) << "a second thread took the bias over";
  for (unsigned turn = 0; turn < BiasedLock::kTenures && lock.biased(); ++turn) {
    std::thread([&] {
      const BiasedGuard g(&lock);
    }).join();
  }
  EXPECT_FALSE(lock.biased()) << "threads taking turns used up the tenures";
  // Still a lock: each thread enters and leaves.
  std::thread([&] {
    const BiasedGuard g(&lock);
  }).join();
  const BiasedGuard g(&lock);
}

}  // namespace
