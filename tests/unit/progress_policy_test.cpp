// progress_policy_test.cpp — the Daps-style stealing policy of the ferry parcelport
// (src/parcel/progress_policy.hpp), driven with a fake progress function.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "common/random.hpp"
#include "parcel/progress_policy.hpp"
#include "test_scale.hpp"

namespace {

using ferry::parcel::detail::StealPolicy;
using ferry::detail::XorShift;

// The property progress stealing must keep: one device's progress never runs on two threads
// at once, however owners, stealers and hints interleave. The fake progress call counts the
// threads inside it per device (a counter of its own, not the policy's flag) and records any
// overlap; owners flip busy/idle at random so that devices keep becoming stealable.
TEST(StealPolicy, NeverProgressesOneDeviceOnTwoThreadsAtOnce) {
  // One owner per device, so a device becomes stealable whenever its owner is busy.
  constexpr int kDevices = 4, kThreads = 4;
  StealPolicy policy(kDevices);
  std::atomic<int> inside[kDevices] = {};
  std::atomic<long> overlaps{0}, calls{0}, steals{0};
  const std::size_t rounds = ferry::test::scaled(200000, 5000);
  ferry::test::Gate gate;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int own = t % kDevices;
      XorShift rng(static_cast<std::uint32_t>(t) + 1);
      policy.add_owner(own, -1);
      bool busy = false;
      gate.wait();
      // The rounds, and then (on a machine too loaded for the threads to overlap) more, up to
      // a time limit, until some steal has happened: the property is only tested by steals.
      const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      for (std::size_t i = 0;
           i < rounds || (steals.load(std::memory_order_relaxed) == 0 && std::chrono::steady_clock::now() < limit);
           ++i) {
        if ((rng.next() & 7) == 0) {  // sometimes start or finish a "task"
          busy = !busy;
          policy.owner_busy(own, busy);
        }
        if (busy) continue;  // a busy worker runs its task, it does not poll
        policy.poll(own, -1, rng, [&](int d) {
          if (inside[d].fetch_add(1, std::memory_order_acq_rel) != 0) overlaps.fetch_add(1, std::memory_order_relaxed);
          calls.fetch_add(1, std::memory_order_relaxed);
          if (d != own) steals.fetch_add(1, std::memory_order_relaxed);
          for (int spin = 0; spin < 20; ++spin) std::atomic_signal_fence(std::memory_order_seq_cst);
          inside[d].fetch_sub(1, std::memory_order_acq_rel);
          return (rng.next() & 1) != 0;  // "found work" half the time: hints come and go
        });
      }
      if (busy) policy.owner_busy(own, false);
    });
  }
  gate.open();
  for (auto& th : threads) th.join();
  EXPECT_EQ(overlaps.load(), 0) << "a device was progressed by two threads at once";
  EXPECT_GT(calls.load(), 0);
  EXPECT_GT(steals.load(), 0) << "no steal happened: the test did not exercise stealing";
}

// Victim choice: only unattended devices (every owner busy, or no owner) that likely have
// work; the caller's NUMA node first, another node only when nothing local qualifies.
TEST(StealPolicy, PicksBusyOwnersWithWorkPreferringTheLocalNode) {
  StealPolicy p(4);
  p.add_owner(0, 0);
  p.add_owner(1, 0);
  p.add_owner(2, 1);
  p.add_owner(3, 1);
  EXPECT_EQ(p.pick_victim(0, 0, 0, false), -1) << "every device is attended";
  p.owner_busy(2, true);
  EXPECT_EQ(p.pick_victim(0, 0, 0, false), 2) << "a remote-node device when nothing local qualifies";
  p.owner_busy(1, true);
  EXPECT_EQ(p.pick_victim(0, 0, 0, false), 1) << "the local node first";
  EXPECT_EQ(p.pick_victim(0, 0, 2, false), 1) << "the local node first, wherever the scan starts";
  EXPECT_EQ(p.pick_victim(1, 0, 0, false), 2) << "never the caller's own device";
  // A progress call that found nothing clears the hint; a probe ignores it; expect_work sets it.
  EXPECT_EQ(p.try_progress(1, [](int) { return false; }), 0);
  EXPECT_FALSE(p.likely_work(1));
  EXPECT_EQ(p.pick_victim(0, 0, 0, false), 2);
  EXPECT_EQ(p.pick_victim(0, 0, 1, true), 1);
  p.expect_work(1);
  EXPECT_EQ(p.pick_victim(0, 0, 0, false), 1);
  // Two owners: the device is unattended only when both are busy.
  StealPolicy q(2);
  q.add_owner(1, -1);
  q.add_owner(1, -1);
  q.owner_busy(1, true);
  EXPECT_EQ(q.pick_victim(0, -1, 0, false), -1);
  q.owner_busy(1, true);
  EXPECT_EQ(q.pick_victim(0, -1, 0, false), 1);
  // A device no thread owns is always stealable.
  StealPolicy r(2);
  r.add_owner(0, -1);
  EXPECT_EQ(r.pick_victim(0, -1, 0, false), 1);
}

// A thread that finds a device in progress moves on at once: it never waits for the holder.
TEST(StealPolicy, NeverWaitsForADeviceInProgress) {
  StealPolicy p(2);
  std::atomic<bool> holding{false}, release{false};
  std::thread holder([&] {
    p.try_progress(0, [&](int) {
      holding.store(true);
      while (!release.load()) std::this_thread::yield();
      return true;
    });
  });
  while (!holding.load()) std::this_thread::yield();
  EXPECT_EQ(p.try_progress(0, [](int) -> bool { ADD_FAILURE() << "ran while held"; return false; }), -1);
  // poll() with device 0 held: skips it and steals device 1 (no owner, likely work).
  XorShift rng(7);
  int ran_on = -1;
  EXPECT_TRUE(p.poll(0, -1, rng, [&](int d) {
    ran_on = d;
    return true;
  }));
  EXPECT_EQ(ran_on, 1);
  EXPECT_EQ(p.pick_victim(1, -1, 0, false), -1) << "a device in progress is no victim";
  release.store(true);
  holder.join();
  EXPECT_FALSE(p.in_progress(0));
}

TEST(XorShift, BelowStaysInRangeAndCoversIt) {
  XorShift rng(1);
  int seen[3] = {};
  for (int i = 0; i < 3000; ++i) {
    const int v = rng.below(3);
    ASSERT_GE(v, 0);
    ASSERT_LT(v, 3);
    ++seen[v];
  }
  for (int c : seen) EXPECT_GT(c, 800);
}

}  // namespace
