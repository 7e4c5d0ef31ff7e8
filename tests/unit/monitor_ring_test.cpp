// The monitoring ring (core/monitor_ring.hpp): every rank guarded from another host, guardian
// and ward agreeing, links symmetric and few, healing around failures, and notices reaching
// every survivor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <deque>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "core/monitor_ring.hpp"

namespace {

using namespace ferry::detail;

// Hosts of the given sizes, ranks dealt in blocks (ranks 0..a-1 on host 0, ...).
std::vector<int> blocks(const std::vector<int>& sizes) {
  std::vector<int> host;
  for (std::size_t h = 0; h < sizes.size(); ++h) host.insert(host.end(), static_cast<std::size_t>(sizes[h]), static_cast<int>(h));
  return host;
}

const GoneFn kNone = [](int) { return false; };

std::vector<int> wards_of(const RingLayout& ring, int r, const GoneFn& gone) {
  std::vector<int> out;
  wards(ring, r, gone, out);
  return out;
}

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// Every live rank has a live guardian on another host on some side, each guardian counts it
// among its wards, each ward has the guardian as one of its guardians, all within links.
void expect_consistent(const RingLayout& ring, const GoneFn& gone) {
  for (int r = 0; r < ring.size(); ++r) {
    if (gone(r)) continue;
    const std::vector<int> mine = links(ring, r);
    const int before = guardian(ring, r, -1, gone), after = guardian(ring, r, +1, gone);
    EXPECT_TRUE(before >= 0 || after >= 0) << "rank " << r << " has no guardian";
    for (const int g : {before, after}) {
      if (g < 0) continue;
      EXPECT_NE(ring.host_of(g), ring.host_of(r)) << "rank " << r << "'s guardian " << g << " is on its host";
      EXPECT_FALSE(gone(g));
      EXPECT_TRUE(contains(mine, g)) << "guardian " << g << " of rank " << r << " is not a link";
      EXPECT_TRUE(contains(wards_of(ring, g, gone), r)) << "rank " << g << " guards " << r << " but does not watch it";
    }
    for (const int w : wards_of(ring, r, gone)) {
      EXPECT_TRUE(guardian(ring, w, -1, gone) == r || guardian(ring, w, +1, gone) == r)
          << "rank " << r << " watches " << w << ", which does not send it heartbeats";
      EXPECT_TRUE(contains(mine, w));
    }
  }
}

TEST(MonitorRing, NeighboursOnTheRingSitOnOtherHosts) {
  const RingLayout ring(blocks({4, 4, 4}));
  for (int p = 0; p < ring.size(); ++p) {
    EXPECT_NE(ring.host_of(ring.rank_at(p)), ring.host_of(ring.rank_at((p + 1) % ring.size())));
    EXPECT_EQ(ring.position_of(ring.rank_at(p)), p);
  }
}

TEST(MonitorRing, GuardiansAndWardsAgreeOnEveryLayout) {
  for (const std::vector<int>& sizes :
       std::vector<std::vector<int>>{{1, 1}, {2, 2}, {8, 8, 8, 8, 8, 8, 8, 8}, {1, 4}, {64, 8}, {3, 1, 7, 2}, {5, 5, 1}}) {
    SCOPED_TRACE(::testing::PrintToString(sizes));
    expect_consistent(RingLayout(blocks(sizes)), kNone);
  }
}

TEST(MonitorRing, HostsInterleavedInAnyOrderAreFound) {
  std::mt19937 rng(7);
  std::vector<int> host(200);
  for (int& h : host) h = static_cast<int>(rng() % 9) * 11;  // any values name hosts
  const RingLayout ring(host);
  expect_consistent(ring, kNone);
}

TEST(MonitorRing, WithHostsOfEqualSizeEachRankSendsTwoAndWatchesTwo) {
  const RingLayout ring(blocks(std::vector<int>(16, 8)));  // 128 ranks
  for (int r = 0; r < ring.size(); ++r) {
    EXPECT_EQ(wards_of(ring, r, kNone).size(), 2u) << "rank " << r;
    EXPECT_NE(guardian(ring, r, -1, kNone), guardian(ring, r, +1, kNone));
  }
}

TEST(MonitorRing, LinksAreSymmetricAndGrowAsTheLogarithm) {
  for (const int n : {16, 256, 4096}) {
    const RingLayout ring(blocks(std::vector<int>(static_cast<std::size_t>(n / 8), 8)));
    std::vector<std::vector<int>> all(static_cast<std::size_t>(n));
    std::size_t most = 0;
    for (int r = 0; r < n; ++r) {
      all[static_cast<std::size_t>(r)] = links(ring, r);
      most = std::max(most, all[static_cast<std::size_t>(r)].size());
    }
    for (int r = 0; r < n; ++r) {
      for (const int s : all[static_cast<std::size_t>(r)]) {
        EXPECT_TRUE(contains(all[static_cast<std::size_t>(s)], r)) << r << " links " << s << " but not back, n=" << n;
      }
    }
    EXPECT_LE(most, static_cast<std::size_t>(4 * kReach + 2 * std::log2(n) + 2)) << "n=" << n;
  }
}

TEST(MonitorRing, AKilledHostsRanksAreEachWatchedBeforeAndTheRingHealsAfter) {
  const RingLayout ring(blocks({8, 8, 8, 8}));
  // Before: each rank of host 2 is some survivor's ward, so its silence is seen.
  for (int r = 16; r < 24; ++r) {
    bool watched = false;
    for (int g = 0; g < ring.size(); ++g)
      if (ring.host_of(g) != 2 && contains(wards_of(ring, g, kNone), r)) watched = true;
    EXPECT_TRUE(watched) << "rank " << r;
  }
  // After: the survivors guard each other around the gap.
  const GoneFn host2 = [&](int r) { return ring.host_of(r) == 2; };
  expect_consistent(ring, host2);
}

TEST(MonitorRing, FailuresSideBySideUpToTheReachHeal) {
  const RingLayout ring(blocks(std::vector<int>(8, 4)));
  const int victim = ring.rank_at(10);
  std::set<int> dead;
  for (int k = 1; k < kReach; ++k) dead.insert(ring.rank_at(10 + k));  // its next kReach-1 neighbours
  const GoneFn gone = [&](int r) { return dead.count(r) != 0; };
  EXPECT_GE(guardian(ring, victim, +1, gone), 0);
  expect_consistent(ring, gone);
}

TEST(MonitorRing, OneHostHasNoLinks) {
  const RingLayout ring(blocks({6}));
  EXPECT_TRUE(ring.one_host());
  EXPECT_TRUE(links(ring, 3).empty());
  EXPECT_EQ(guardian(ring, 3, +1, kNone), -1);
}

// Monitors over a scripted channel: a message sent in one step arrives at the next.
struct Net {
  struct Message {
    int from, to;
    Beat kind;
    int subject;
  };
  std::shared_ptr<const RingLayout> ring;
  std::vector<std::unique_ptr<RingMonitor>> monitors;
  std::vector<std::set<int>> known;  // by rank: ranks it knows failed
  std::vector<bool> dead;
  std::deque<Message> wire, next;
  std::uint64_t sent = 0;

  struct Out final : RingMonitor::Outbox {
    Net* net;
    int from;
    int send(int to, Beat kind, int subject) noexcept override {
      net->next.push_back(Message{from, to, kind, subject});
      ++net->sent;
      return 0;
    }
  };

  explicit Net(const std::vector<int>& host) : ring(std::make_shared<const RingLayout>(host)) {
    for (int r = 0; r < ring->size(); ++r) monitors.push_back(std::make_unique<RingMonitor>(ring, r, 1000, 100));
    known.resize(host.size());
    dead.assign(host.size(), false);
  }
  void learn(int r, int subject) {
    if (subject == r || !known[static_cast<std::size_t>(r)].insert(subject).second) return;
    monitors[static_cast<std::size_t>(r)]->spread(subject);
  }
  // One 100 ms step at `t`.
  void step(std::int64_t t) {
    wire.swap(next);
    next.clear();
    for (const Message& m : wire) {
      if (dead[static_cast<std::size_t>(m.to)]) continue;
      if (m.kind == Beat::alive) monitors[static_cast<std::size_t>(m.to)]->heard(m.from);
      if (m.kind == Beat::failed) learn(m.to, m.subject);
    }
    for (int r = 0; r < ring->size(); ++r) {
      if (dead[static_cast<std::size_t>(r)]) continue;
      Out out;
      out.net = this;
      out.from = r;
      const GoneFn gone = [&](int s) { return known[static_cast<std::size_t>(r)].count(s) != 0; };
      std::vector<int> silent;
      monitors[static_cast<std::size_t>(r)]->tick(t, 100000000, known[static_cast<std::size_t>(r)].size(), gone, out,
                                                   silent);
      for (int s : silent) learn(r, s);
      monitors[static_cast<std::size_t>(r)]->flush(gone, out);
    }
  }
  bool all_know(const std::vector<int>& failed) const {
    for (std::size_t r = 0; r < dead.size(); ++r) {
      if (dead[r]) continue;
      for (int f : failed)
        if (known[r].count(f) == 0) return false;
    }
    return true;
  }
};

TEST(MonitorRing, EverySurvivorLearnsOfAKilledHostWithinTheTimeoutAndAFewSteps) {
  Net net(blocks(std::vector<int>(8, 8)));
  std::int64_t t = 0;
  for (int i = 0; i < 20; ++i) net.step(t += 100000000);
  EXPECT_TRUE(net.all_know({})) << "nobody failed yet";
  for (std::size_t r = 0; r < net.known.size(); ++r) EXPECT_TRUE(net.known[r].empty()) << "rank " << r << " blamed someone";
  std::vector<int> host3;
  for (int r = 24; r < 32; ++r) {
    net.dead[static_cast<std::size_t>(r)] = true;
    host3.push_back(r);
  }
  int steps = 0;
  while (!net.all_know(host3) && steps < 100) {
    net.step(t += 100000000);
    ++steps;
  }
  // 1000 ms of silence is 10 steps (and one to notice it); each notice hop takes one.
  EXPECT_LE(steps, 10 + 2 + 8) << "steps until every survivor knew";
  EXPECT_TRUE(net.all_know(host3));
  for (std::size_t r = 0; r < net.known.size(); ++r) {
    if (net.dead[r]) continue;
    EXPECT_EQ(net.known[r].size(), host3.size()) << "rank " << r << " blamed a survivor";
  }
}

TEST(MonitorRing, HeartbeatsPerRankDoNotGrowWithTheJob) {
  // Heartbeats out per rank per timeout: 4 to each of two guardians, at 64 ranks and at 1024.
  for (const int n : {64, 1024}) {
    Net net(blocks(std::vector<int>(static_cast<std::size_t>(n / 8), 8)));
    std::int64_t t = 0;
    for (int i = 0; i < 10; ++i) net.step(t += 100000000);  // one timeout
    EXPECT_LE(net.sent, static_cast<std::uint64_t>(n) * 2 * 5) << "n=" << n;
    EXPECT_GE(net.sent, static_cast<std::uint64_t>(n) * 2 * 3) << "n=" << n;
  }
}

}  // namespace
