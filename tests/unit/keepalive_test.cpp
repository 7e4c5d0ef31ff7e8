// Keepalive: the silence accounting that fails a peer on another host (FERRY_PEER_TIMEOUT_MS).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/liveness.hpp"

namespace {

using ferry::detail::Keepalive;

constexpr std::int64_t kMs = 1000000;

// 4 ranks; this one watches 2 and 3 with a 1000 ms timeout, checked every 100 ms.
Keepalive watching_two_and_three() {
  Keepalive k;
  k.start({3, 2}, 1000, 100);
  return k;
}

TEST(Keepalive, APeerSilentForTheTimeoutIsNamedOnce) {
  Keepalive k = watching_two_and_three();
  std::vector<int> silent;
  for (int i = 0; i < 9; ++i) k.check(100 * kMs, silent);
  EXPECT_TRUE(silent.empty()) << "named after 900 ms of a 1000 ms timeout";
  k.check(100 * kMs, silent);
  EXPECT_EQ(silent, (std::vector<int>{2, 3}));
  silent.clear();
  for (int i = 0; i < 20; ++i) k.check(100 * kMs, silent);
  EXPECT_TRUE(silent.empty()) << "a peer is named only once";
}

TEST(Keepalive, AHeartbeatRestartsTheSilence) {
  Keepalive k = watching_two_and_three();
  std::vector<int> silent;
  for (int i = 0; i < 30; ++i) {
    k.heard(3);  // rank 3 beats every check, rank 2 never
    k.check(100 * kMs, silent);
  }
  EXPECT_EQ(silent, (std::vector<int>{2}));
}

TEST(Keepalive, OnlyHeartbeatsHeardSinceTheLastCheckCount) {
  // A heartbeat heard once restarts the silence once: it does not shield its sender later.
  Keepalive k = watching_two_and_three();
  std::vector<int> silent;
  k.heard(2);
  k.heard(3);
  k.check(100 * kMs, silent);
  for (int i = 0; i < 9; ++i) k.check(100 * kMs, silent);
  EXPECT_TRUE(silent.empty());
  k.check(100 * kMs, silent);
  EXPECT_EQ(silent, (std::vector<int>{2, 3}));
}

TEST(Keepalive, RanksOutsideTheJobAreIgnored) {
  Keepalive k = watching_two_and_three();
  k.heard(-1);
  k.heard(4);
  k.heard(1 << 30);
  std::vector<int> silent;
  for (int i = 0; i < 10; ++i) k.check(100 * kMs, silent);
  EXPECT_EQ(silent, (std::vector<int>{2, 3}));
}

TEST(Keepalive, OneLongGapCountsAtMostTwoIntervals) {
  // A checker that slept 10 s (a stopped process, an overloaded machine) counts 200 ms of it.
  Keepalive k = watching_two_and_three();
  std::vector<int> silent;
  k.check(10000 * kMs, silent);
  EXPECT_TRUE(silent.empty());
  for (int i = 0; i < 7; ++i) k.check(100 * kMs, silent);
  EXPECT_TRUE(silent.empty());
  k.check(100 * kMs, silent);
  EXPECT_EQ(silent.size(), 2u);
}

TEST(Keepalive, OnlyWatchedPeersAreNamed) {
  Keepalive k = watching_two_and_three();
  k.watch({3});
  std::vector<int> silent;
  for (int i = 0; i < 10; ++i) k.check(100 * kMs, silent);
  EXPECT_EQ(silent, (std::vector<int>{3})) << "rank 2 is a peer but not watched";
}

TEST(Keepalive, APeerNewlyWatchedStartsItsSilenceThen) {
  // Rank 2, unwatched for 900 ms, gets its full timeout once watched: a guardian that takes
  // over a ward does not blame it for the time before.
  Keepalive k = watching_two_and_three();
  k.watch({3});
  std::vector<int> silent;
  for (int i = 0; i < 9; ++i) k.check(100 * kMs, silent);
  k.watch({2, 3});
  k.check(100 * kMs, silent);
  EXPECT_EQ(silent, (std::vector<int>{3}));
  silent.clear();
  for (int i = 0; i < 8; ++i) k.check(100 * kMs, silent);
  EXPECT_TRUE(silent.empty()) << "rank 2 named 900 ms after it became watched";
  k.check(100 * kMs, silent);
  EXPECT_EQ(silent, (std::vector<int>{2}));
}

TEST(Keepalive, WithNoPeersNothingIsWatched) {
  Keepalive k;
  EXPECT_TRUE(k.empty());
  k.heard(1);  // not started: ignored
  k.start({}, 1000, 100);
  std::vector<int> silent;
  k.check(5000 * kMs, silent);
  EXPECT_TRUE(silent.empty());
}

}  // namespace
