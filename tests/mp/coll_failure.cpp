// A rank SIGKILLed in the middle of collectives. Every rank posts a stream of allreduces (and
// broadcasts) on the world team, `threads` threads each on a team of its own; the last rank
// kills itself with some of them in flight. Every survivor must then, within the bound:
//  - see every collective it posted complete exactly once, correctly or with
//    peer_failed_error naming the victim, never hang;
//  - get Status failed naming the victim from a new post on a team that holds it, and
//    ferry::PeerFailed from a blocking collective and from Team::split;
//  - go on among the survivors on a team made of them (Team::subset sends no message).
// Prints "peer failure OK" per survivor (peer_failure.sh counts them).
//
// Usage (under ferryrun --keep-going): ferry-mp-coll-failure [threads]
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/cpu_relax.hpp"
#include "ferry/ferry.hpp"

#include "failure_common.hpp"

namespace {

using namespace failure_test;
using ferry::DataType;
using ferry::ReduceOp;
using ferry::Team;

constexpr int kInFlight = 8;

// Posts allreduces on `team`, kInFlight at a time, until one ends with the victim's failure;
// checks every result. Returns the number that completed with the failure.
long stream_until_failure(ferry::Device& dev, Team& team, int victim, int me, bool die_midway) {
  const std::int64_t n = team.size();
  long failed = 0;
  for (long round = 0;; ++round) {
    std::vector<std::int64_t> send(kInFlight), recv(kInFlight, -1);
    ferry::Synchronizer sync(kInFlight);
    int done = 0, refused = 0;
    for (int k = 0; k < kInFlight; ++k) {
      send[static_cast<std::size_t>(k)] = team.rank() + k;
      const ferry::Status st = team.post_allreduce({.send = &send[static_cast<std::size_t>(k)],
                                                    .recv = &recv[static_cast<std::size_t>(k)], .count = 1,
                                                    .type = DataType::i64, .op = ReduceOp::sum, .local = &sync});
      if (st.is_done()) ++done;
      if (st.is_failed()) {
        if (st.rank != victim) fail("a post failed naming rank " + std::to_string(st.rank));
        ++refused;
      }
    }
    if (die_midway && round == 20) {
      // Some of this round's collectives are surely in flight on the survivors now.
      ::kill(::getpid(), SIGKILL);
    }
    const auto start = Clock::now();
    ferry::detail::IdleBackoff idle;
    while (sync.count() + static_cast<std::size_t>(done + refused) < kInFlight) {
      idle(dev.progress());
      if (seconds_since(start) > 30) fail("collectives still in flight 30 s after their post (round " + std::to_string(round) + ")");
    }
    for (std::size_t k = 0; k < sync.count(); ++k) {
      const ferry::Completion& c = sync.results()[k];
      if (c.op != ferry::OpKind::coll) fail("a completion of kind " + std::string(ferry::to_string(c.op)));
      if (c.error == 0) continue;
      if (c.error != ferry::peer_failed_error || c.rank != victim) fail("a collective ended with " + c.error_string());
      ++failed;
    }
    if (failed == 0 && refused == 0) {
      for (int k = 0; k < kInFlight; ++k) {
        if (recv[static_cast<std::size_t>(k)] != n * (n - 1) / 2 + n * k) fail("a wrong allreduce result " + std::to_string(recv[static_cast<std::size_t>(k)]));
      }
    }
    (void)me;
    if (failed + refused > 0) return failed + refused;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = threads_argument(argc, argv, 8);
  ferry::Runtime rt;
  started(rt);  // the test script checks that exactly these processes are gone afterwards
  const int me = rt.rank(), n = rt.size(), victim = n - 1;
  ferry::Device& dev = rt.device();
  Team world = Team::world(rt);
  std::vector<Team> teams;
  for (int t = 0; t < threads; ++t) teams.push_back(world.split(0, t % 2 == 0 ? me : -me));
  rt.barrier();

  std::atomic<long> ended{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] { ended += stream_until_failure(dev, teams[static_cast<std::size_t>(t)], victim, me, me == victim && t == 0); });
  }
  for (auto& th : pool) th.join();
  if (me == victim) fail("the victim outlived its SIGKILL");
  if (ended.load() < threads) fail("fewer failed collectives than threads");

  // New posts on a team with the victim: failed, naming it.
  std::int64_t one = 1, sum = 0;
  ferry::Synchronizer never;
  const ferry::Status st = world.post_allreduce({.send = &one, .recv = &sum, .count = 1, .local = &never});
  if (!st.is_failed() || st.rank != victim) fail(std::string("a post after the failure answered ") + ferry::to_string(st.kind));
  try {
    world.barrier();
    fail("Team::barrier passed with a failed member");
  } catch (const ferry::PeerFailed& e) {
    if (e.rank() != victim) fail("Team::barrier's PeerFailed names rank " + std::to_string(e.rank()));
  }
  try {
    (void)world.split(0, me);
    fail("Team::split passed with a failed member");
  } catch (const ferry::PeerFailed& e) {
    if (e.rank() != victim) fail("Team::split's PeerFailed names rank " + std::to_string(e.rank()));
  }
  // The survivors go on among themselves.
  std::vector<int> alive;
  for (int r = 0; r < n; ++r) {
    if (r != victim) alive.push_back(r);
  }
  Team survivors = world.subset(alive);
  for (int rep = 0; rep < 10; ++rep) {
    survivors.allreduce(&one, &sum, 1, DataType::i64, ReduceOp::sum);
    if (sum != n - 1) fail("the survivors' allreduce gave " + std::to_string(sum));
  }
  survivors.barrier();
  std::printf("rank %d: peer failure OK (%ld collectives ended with rank %d's failure)\n", me, ended.load(), victim);
  std::fflush(stdout);
  try {
    rt.finalize();
  } catch (const ferry::PeerFailed&) {
  }
  return 0;
}
