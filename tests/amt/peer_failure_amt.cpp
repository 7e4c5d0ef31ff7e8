// Peer failure through the parcel layer and the AMT runtime. The last rank (the victim)
// SIGKILLs itself while the survivors keep calls to it in flight (futures of an echo action
// with 100 KB zero-copy arguments and replies). Every survivor must then see each future
// either hold its intact value or throw ferry::PeerFailed naming the victim; a new call to the
// victim must throw the same; a collective in flight that the victim never joined, a barrier
// and an atomic on its counter after the failure must throw it too; calls and atomics among
// survivors must keep returning intact values; and finalize must throw ferry::PeerFailed
// naming the victim.
//
// Usage (under ferryrun --keep-going): ferry-amt-peer-failure
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ferry/amt.hpp"

namespace {

using Clock = std::chrono::steady_clock;
int g_rank = -1;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "rank %d: FAIL: %s\n", g_rank, what.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

std::vector<unsigned char> payload(int seed, std::size_t n) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>((seed * 131 + i * 7 + (i >> 10)) & 0xFF);
  return v;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::atomic<long> g_calls{0};  // echo calls this rank served
std::atomic<int> g_done{0};    // survivors done calling this rank
std::atomic<int> g_ready{0};   // survivors past their calls before the failure

}  // namespace

int main() {
  ferry::amt::Options options;
  options.threads = 2;
  ferry::amt::Runtime rt(options);
  g_rank = rt.rank();
  const int me = rt.rank(), n = rt.size(), victim = n - 1;
  if (n < 2) fail("needs at least 2 ranks");
  std::fprintf(stderr, "rank %d pid %d\n", me, static_cast<int>(getpid()));
  auto echo = rt.action("echo", [](std::vector<unsigned char> v) {
    g_calls.fetch_add(1, std::memory_order_relaxed);
    return v;
  });
  auto done = rt.action("done", [] { g_done.fetch_add(1, std::memory_order_relaxed); });
  auto ready = rt.action("ready", [] { g_ready.fetch_add(1, std::memory_order_relaxed); });
  constexpr std::size_t kSize = 100000;

  // Before the failure: everyone calls everyone, values checked.
  for (int round = 0; round < 4; ++round) {
    for (int to = 0; to < n; ++to) {
      if (to == me) continue;
      const auto sent = payload(me * 100 + round, kSize);
      if (rt.async_future(to, echo, sent).get() != sent) fail("corrupt echo from rank " + std::to_string(to) + " before the failure");
    }
  }

  // A counter on every rank, and a collective every rank takes part in.
  const ferry::amt::Counter counter = rt.counter();
  if (rt.all_reduce(1, std::plus<>{}).get() != n) fail("the all_reduce before the failure");

  if (me == victim) {
    // Die once every survivor is past its calls before the failure and calls to it are under
    // way: "ready" from each, then 8 more calls.
    const auto start = Clock::now();
    long at_ready = -1;
    while (at_ready < 0 || g_calls.load() < at_ready + 8) {
      if (at_ready < 0 && g_ready.load() == n - 1) at_ready = g_calls.load();
      if (seconds_since(start) > 30) fail("the survivors' calls did not reach the victim");
      if (!rt.help()) std::this_thread::yield();
    }
    std::fprintf(stderr, "rank %d: killing itself (SIGKILL) after %ld calls\n", me, g_calls.load());
    std::fflush(stderr);
    ::raise(SIGKILL);
  }

  // Survivors: windows of calls to the victim until one fails with its failure.
  rt.async(victim, ready);
  // A collective the victim never joins, and an atomic on its counter: the failure ends both.
  auto never = rt.all_reduce(1, std::plus<>{});
  auto atomic = rt.fetch_add(victim, counter, 1);
  long ok = 0, failed = 0;
  const auto start = Clock::now();
  for (int window = 0; failed == 0; ++window) {
    if (seconds_since(start) > 30) fail("no call to the victim failed within 30 s");
    std::vector<std::vector<unsigned char>> sent;
    std::vector<ferry::amt::Future<std::vector<unsigned char>>> futures;
    for (int i = 0; i < 8; ++i) {
      sent.push_back(payload(me * 1000 + window * 8 + i, kSize));
      futures.push_back(rt.async_future(victim, echo, sent.back()));
    }
    for (std::size_t i = 0; i < futures.size(); ++i) {
      try {
        if (futures[i].get() != sent[i]) fail("corrupt echo from the victim");
        ++ok;
      } catch (const ferry::PeerFailed& e) {
        if (e.rank() != victim) fail(std::string("a future named the wrong rank: ") + e.what());
        ++failed;
      }
    }
  }
  try {
    (void)rt.async_future(victim, echo, payload(1, 16)).get();
    fail("a call to the victim after its failure returned");
  } catch (const ferry::PeerFailed& e) {
    if (e.rank() != victim) fail(std::string("the late call named the wrong rank: ") + e.what());
  }

  const auto names_victim = [&](auto&& get, const char* what) {
    try {
      (void)get();
      return false;
    } catch (const ferry::PeerFailed& e) {
      if (e.rank() != victim) fail(std::string(what) + " named the wrong rank: " + e.what());
      return true;
    }
  };
  if (!names_victim([&] { return never.get(); }, "the collective in flight")) fail("a collective without the victim completed");
  (void)names_victim([&] { return atomic.get(); }, "the atomic in flight");  // it may have been answered first
  if (!names_victim([&] { rt.barrier().get(); return 0; }, "a barrier after the failure")) fail("a barrier after the failure completed");
  if (!names_victim([&] { return rt.fetch_add(victim, counter, 1).get(); }, "a late atomic")) fail("an atomic on the victim completed");
  if (rt.fetch_add(0, counter, 1).get() < 0) fail("an atomic among the survivors");

  // Survivors among themselves.
  int others = 0;
  for (int to = 0; to < n - 1; ++to) {
    if (to == me) continue;
    ++others;
    for (int round = 0; round < 8; ++round) {
      const auto sent = payload(me * 7 + round, kSize);
      if (rt.async_future(to, echo, sent).get() != sent) fail("corrupt echo from survivor " + std::to_string(to));
    }
  }

  // No survivor leaves while another may still call it.
  for (int to = 0; to < n - 1; ++to)
    if (to != me) rt.async(to, done);
  const auto t0 = Clock::now();
  while (g_done.load() < others) {
    if (seconds_since(t0) > 30) fail("the other survivors did not finish");
    if (!rt.help()) std::this_thread::yield();
  }

  try {
    rt.finalize();
    fail("finalize returned although the victim is dead");
  } catch (const ferry::PeerFailed& e) {
    if (e.rank() != victim) fail(std::string("finalize named the wrong rank: ") + e.what());
  }
  std::printf("rank %d: amt peer failure OK: victim %d; %ld calls to it returned, %ld failed with it; %d survivors answered\n",
              me, victim, ok, failed, others);
  return 0;
}
