// A host goes down, end to end: a job on several hosts (ranks r / FERRY_TEST_RANKS_PER_HOST),
// and every rank of the last host at once either stops (SIGSTOP: a host that no longer answers
// and closes nothing, so only the keepalive's ring can tell) or dies (SIGKILL: its connections
// reset too). No survivor shares a host with a victim, so no process watch sees them: each
// victim is the ward of a survivor on another host, and the others learn of it from notices.
// Every survivor must:
//  - have failed_ranks() == the victims, all of them, within the bound after the barrier at
//    which they went (the timeout, two check intervals and 600 ms; FERRY_TEST_DETECT_BOUND_MS
//    overrides it), and never a survivor among them;
//  - get ferry::PeerFailed from barrier() and finalize();
//  - go on exchanging byte-exact messages with every other survivor.
//
// With FERRY_TEST_VICTIMS=k only the last k ranks go. On one host (no split_hosts.sh) that is
// the process watch's test on a quiet link: no survivor sends to a victim, so no transport
// error can tell first, and the bound is two check intervals and 600 ms.
//
// Usage (under ferryrun --keep-going, split_hosts.sh): ferry-mp-host-down stop|kill
// Victims print "rank R pid P" to stderr before they go; the script ends stopped ones.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"

#include "failure_common.hpp"

namespace {

using namespace failure_test;

constexpr std::uint16_t kInbox = 1;      // before the host goes
constexpr std::uint16_t kSurvivors = 2;  // survivors among themselves, after
constexpr ferry::Tag kBefore = 1, kAfter = 2, kDone = 3;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string how = argc > 1 ? argv[1] : "";
  if (how != "stop" && how != "kill") fail("usage: ferry-mp-host-down stop|kill (got '" + how + "')");
  const int per_host = env_int("FERRY_TEST_RANKS_PER_HOST", 2);
  const int going = env_int("FERRY_TEST_VICTIMS", per_host);
  ferry::Runtime rt;
  g_rank = rt.rank();
  const int me = rt.rank(), n = rt.size();
  if (going < 1 || going >= n) fail("FERRY_TEST_VICTIMS=" + std::to_string(going) + " must leave survivors");
  std::fprintf(stderr, "rank %d pid %d\n", me, static_cast<int>(getpid()));
  const int first_victim = n - going;
  std::vector<int> victims, survivors;
  for (int r = 0; r < n; ++r) (r >= first_victim ? victims : survivors).push_back(r);
  ferry::Device& dev = rt.device();
  ferry::CompletionQueue inbox;
  ferry::Exposure exposure = rt.expose(inbox, kInbox);
  ferry::CompletionQueue after;
  ferry::Exposure after_exposure = rt.expose(after, kSurvivors);
  const std::vector<std::vector<unsigned char>> bufs = sized_buffers(me);
  rt.barrier();
  exchange_with_all(dev, inbox, me, n, bufs, kBefore, kInbox);
  rt.barrier();

  if (me >= first_victim) {
    std::fflush(stderr);
    ::raise(how == "stop" ? SIGSTOP : SIGKILL);
    // Stopped: the script SIGKILLs this process once the survivors are done.
    fail("a victim ran on after SIGSTOP");
  }
  const Clock::time_point down = Clock::now();
  const int timeout_ms = env_int("FERRY_PEER_TIMEOUT_MS", 4000), check_ms = env_int("FERRY_PEER_CHECK_MS", 200);
  const double bound_s = env_int("FERRY_TEST_DETECT_BOUND_MS", timeout_ms + 2 * check_ms + 600) / 1000.0;
  std::vector<int> failed;
  while (seconds_since(down) < kDeadline) {
    dev.progress();
    failed = rt.failed_ranks();
    for (int f : failed) {
      if (f < first_victim) fail("rank " + std::to_string(f) + " was reported failed; it is alive");
    }
    if (failed.size() == victims.size()) break;
  }
  const double took = seconds_since(down);
  std::sort(failed.begin(), failed.end());
  if (failed != victims) fail("after " + std::to_string(took) + " s, " + std::to_string(failed.size()) + " of the " +
                              std::to_string(victims.size()) + " victims were reported failed");
  if (took > bound_s) {
    fail("every victim was reported failed only " + std::to_string(took) + " s after the barrier; the bound is " +
         std::to_string(bound_s) + " s");
  }
  std::vector<int> others;
  for (int r : survivors)
    if (r != me) others.push_back(r);
  exchange_after_failure(dev, inbox, after, kSurvivors, others, bufs, kAfter, kDone,
                         [&](int r) { return r >= first_victim; });
  bool threw = false;
  try {
    rt.barrier();
  } catch (const ferry::PeerFailed& e) {
    threw = e.rank() >= first_victim;
  }
  if (!threw) fail("barrier() did not throw PeerFailed naming a victim");
  threw = false;
  try {
    rt.finalize();
  } catch (const ferry::PeerFailed&) {
    threw = true;
  }
  if (!threw) fail("finalize() did not throw PeerFailed");
  std::printf("rank %d: host down OK (%s): %zu victims reported in %.3f s (bound %.3f s)\n", me, how.c_str(),
              victims.size(), took, bound_s);
  std::fflush(stdout);
  return 0;
}
