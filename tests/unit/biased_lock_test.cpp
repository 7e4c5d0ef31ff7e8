// BiasedLock (common/biased_lock.hpp): mutual exclusion while the bias moves between threads and
// after it is revoked; the bias follows a thread that takes over, until the tenures run out.
#include "common/biased_lock.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "test_scale.hpp"

namespace {

using ferry::detail::BiasedGuard;
using ferry::detail::BiasedLock;

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

// A thread that takes and drops the lock when told (so one thread can hold it while another
// tries, in each state of the bias).
class Locker {
 public:
  explicit Locker(BiasedLock& lock) : lock_(lock), thread_([this] { run(); }) {}
  ~Locker() {
    order_.store(kExit);
    thread_.join();
  }
  void take() { order_.store(kTake); }
  void drop() { order_.store(kDrop); }
  bool holds() const { return holds_.load(); }
  // Whether holds() becomes `want` within 10 s.
  bool reaches(bool want) const {
    for (int i = 0; i < 10000; ++i) {
      if (holds() == want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }

 private:
  enum : int { kNone, kTake, kDrop, kExit };
  void run() {
    BiasedLock::Held how;
    for (;;) {
      const int order = order_.exchange(kNone);
      if (order == kExit) return;
      if (order == kTake) {
        how = lock_.lock();
        holds_.store(true);
      } else if (order == kDrop) {
        holds_.store(false);
        lock_.unlock(how);
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
  }
  BiasedLock& lock_;
  std::atomic<int> order_{kNone};
  std::atomic<bool> holds_{false};
  std::thread thread_;
};

// In each state (the first owner holds; the thread that took the bias over holds and the old
// owner asks; the lock revoked for good) a holder keeps the other thread out until it lets go.
TEST(BiasedLock, AHolderKeepsTheOtherThreadOutInEveryState) {
  BiasedLock lock;
  Locker a(lock), b(lock);
  const auto one_holds_other_waits = [&](Locker& holder, Locker& asker, const char* state) {
    holder.take();
    ASSERT_TRUE(holder.reaches(true)) << state << ": the holder never got the lock";
    asker.take();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(asker.holds()) << state << ": the asker got in while the holder held the lock";
    holder.drop();
    ASSERT_TRUE(asker.reaches(true)) << state << ": the asker never got the lock after the holder let go";
    asker.drop();
    ASSERT_TRUE(asker.reaches(false));
  };
  one_holds_other_waits(a, b, "first owner holds");   // b takes the bias over from a
  one_holds_other_waits(b, a, "new owner holds");     // the old owner, a, waits, then takes it back
  for (unsigned turn = 0; turn < BiasedLock::kTenures && lock.biased(); ++turn) one_holds_other_waits(a, b, "taking turns");
  EXPECT_FALSE(lock.biased());
  one_holds_other_waits(a, b, "revoked for good");
  one_holds_other_waits(b, a, "revoked for good");
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
