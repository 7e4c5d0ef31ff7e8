// A rank SIGKILLed in the middle of an atomic flood. Every rank's threads fetch-add a counter
// on the last rank (the victim), several atomics in flight each; the victim kills itself with
// the survivors' atomics in flight. Every survivor must then, within the bound:
//  - see every atomic it posted complete exactly once, with a fetched value or with
//    peer_failed_error naming the victim, never hang;
//  - get Status failed naming the victim from a new atomic on its memory;
//  - go on with atomics among the survivors (a counter on rank 0, exact).
// Prints "peer failure OK" per survivor (peer_failure.sh counts them).
//
// Usage (under ferryrun --keep-going): ferry-mp-atomic-failure [threads]
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/cpu_relax.hpp"
#include "ferry/ferry.hpp"

#include "failure_common.hpp"

namespace {

using namespace failure_test;
using ferry::AtomicOp;
using ferry::DataType;

constexpr int kInFlight = 8;

// Fetch-adds the victim's counter, kInFlight at a time, until one ends with the victim's
// failure. Returns the number that ended with it (or were refused naming it).
long flood_until_failure(ferry::Device& dev, const ferry::RemoteKey& key, int victim, bool die_midway) {
  long failed = 0;
  std::vector<std::uint64_t> fetched(kInFlight);
  for (long round = 0;; ++round) {
    ferry::Synchronizer sync(kInFlight);
    int done = 0, refused = 0;
    for (int k = 0; k < kInFlight; ++k) {
      ferry::Status st;
      ferry::detail::IdleBackoff idle;
      while ((st = dev.post_atomic({.rank = victim, .remote = key, .op = AtomicOp::fetch_add, .type = DataType::u64, .operand = 1,
                                    .result = &fetched[static_cast<std::size_t>(k)], .local = &sync}))
                 .is_retry()) {
        idle(dev.progress());
      }
      if (st.is_done()) ++done;
      if (st.is_failed()) {
        if (st.rank != victim) fail("an atomic's post failed naming rank " + std::to_string(st.rank));
        ++refused;
      }
    }
    if (die_midway && round == 50) ::kill(::getpid(), SIGKILL);  // the others' atomics are in flight now
    const auto start = Clock::now();
    ferry::detail::IdleBackoff idle;
    while (sync.count() + static_cast<std::size_t>(done + refused) < kInFlight) {
      idle(dev.progress());
      if (seconds_since(start) > 30) fail("atomics still in flight 30 s after their post (round " + std::to_string(round) + ")");
    }
    for (std::size_t k = 0; k < sync.count(); ++k) {
      const ferry::Completion& c = sync.results()[k];
      if (c.op != ferry::OpKind::atomic) fail("a completion of kind " + std::string(ferry::to_string(c.op)));
      if (c.error == 0) continue;
      if (c.error != ferry::peer_failed_error || c.rank != victim) fail("an atomic ended with " + c.error_string());
      ++failed;
    }
    if (failed + refused > 0) return failed + refused;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = threads_argument(argc, argv, 2);
  ferry::Runtime rt;
  started(rt);  // the test script checks that exactly these processes are gone afterwards
  const int me = rt.rank(), n = rt.size(), victim = n - 1;
  ferry::Device& dev = rt.device();
  std::uint64_t counter = 0;
  ferry::MemoryRegion region = dev.register_memory(&counter, sizeof counter);
  const ferry::RemoteKey mine = region.remote_key();
  rt.kv_put("counter", std::string(reinterpret_cast<const char*>(&mine), sizeof mine));
  rt.kv_fence();
  const auto key_of = [&](int r) {
    const std::string bytes = rt.kv_get(r, "counter");
    ferry::RemoteKey k;
    if (bytes.size() != sizeof k) fail("a key of " + std::to_string(bytes.size()) + " bytes");
    std::memcpy(&k, bytes.data(), sizeof k);
    return k;
  };
  const ferry::RemoteKey of_victim = key_of(victim), of_0 = key_of(0);
  rt.barrier();

  std::atomic<long> ended{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] { ended += flood_until_failure(dev, of_victim, victim, me == victim && t == 0); });
  }
  for (auto& th : pool) th.join();
  if (me == victim) fail("the victim outlived its SIGKILL");
  if (ended.load() < threads) fail("fewer failed atomics than threads");

  // A new atomic on the victim's memory: failed, naming it.
  std::uint64_t v = 0;
  ferry::Synchronizer never;
  const ferry::Status st = dev.post_atomic({.rank = victim, .remote = of_victim, .op = AtomicOp::fetch_add, .type = DataType::u64,
                                           .operand = 1, .result = &v, .local = &never});
  if (!st.is_failed() || st.rank != victim) fail(std::string("an atomic after the failure answered ") + ferry::to_string(st.kind));

  // The survivors go on: each adds 1 to rank 0's counter 100 times; then a survivors' team
  // barrier, and rank 0's counter holds exactly their sum.
  constexpr int kAdds = 100;
  for (int i = 0; i < kAdds; ++i) {
    ferry::Synchronizer sync;
    ferry::Status s;
    ferry::detail::IdleBackoff idle;
    while ((s = dev.post_atomic({.rank = 0, .remote = of_0, .op = AtomicOp::add, .type = DataType::u64, .operand = 1, .local = &sync}))
               .is_retry()) {
      idle(dev.progress());
    }
    if (s.is_failed()) fail("an atomic among the survivors failed naming rank " + std::to_string(s.rank));
    while (s.is_posted() && !sync.test()) idle(dev.progress());
    if (s.is_posted() && !sync.results()[0].ok()) fail("an atomic among the survivors ended with " + sync.results()[0].error_string());
  }
  std::vector<int> alive;
  for (int r = 0; r < n; ++r) {
    if (r != victim) alive.push_back(r);
  }
  ferry::Team survivors = ferry::Team::world(rt).subset(alive);
  survivors.barrier();
  if (me == 0 && __atomic_load_n(&counter, __ATOMIC_SEQ_CST) != static_cast<std::uint64_t>((n - 1) * kAdds)) {
    fail("rank 0's counter holds " + std::to_string(counter) + ", not " + std::to_string((n - 1) * kAdds));
  }
  survivors.barrier();
  std::printf("rank %d: peer failure OK (%ld atomics ended with rank %d's failure)\n", me, ended.load(), victim);
  std::fflush(stdout);
  try {
    rt.finalize();
  } catch (const ferry::PeerFailed&) {
  }
  return 0;
}
