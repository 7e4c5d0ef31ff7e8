// Peer failure, end to end. The last rank (the victim) SIGKILLs itself in the middle of a
// flood from every other rank, with operations of every kind pending to and from it: a
// receive naming it, a rendezvous send it will never receive, active messages (eager,
// fragmented, rendezvous) and gets in flight. Every survivor must then, within the bound:
//  - see every operation it posted either complete normally or complete with
//    peer_failed_error naming the victim (none lost, none signalled twice);
//  - get Status failed naming the victim from new posts to it, and failed_ranks() == {victim};
//  - get ferry::PeerFailed naming the victim from barrier() and finalize();
//  - keep exchanging byte-exact messages with the other survivors (4 ranks and more).
// Data exchanged before the failure is checked byte for byte too.
//
// Usage (under ferryrun --keep-going): ferry-mp-peer-failure [threads]
// FERRY_TEST_STAMP=<file>: the victim writes its CLOCK_MONOTONIC time of death there, so the
// survivors (on the same host) can report how long detection took.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.hpp"

#include "failure_common.hpp"

namespace {

using namespace failure_test;

constexpr std::uint16_t kInbox = 1;      // before the failure, and the flood
constexpr std::uint16_t kSurvivors = 2;  // survivors among themselves, after it
constexpr ferry::Tag kBefore = 1, kAfter = 2, kDone = 3, kFlood = 4, kNeverSent = 7, kNeverReceived = 8;

}  // namespace

int main(int argc, char** argv) {
  const int threads = threads_argument(argc, argv, 16);
  ferry::Runtime rt;
  started(rt);  // the test script checks that exactly these processes are gone afterwards
  const int me = rt.rank(), n = rt.size(), victim = n - 1;
  ferry::Device& dev = rt.device();
  ferry::CompletionQueue inbox;
  ferry::Exposure exposure = rt.expose(inbox, kInbox);
  ferry::CompletionQueue survivors;
  ferry::Exposure survivors_exposure = rt.expose(survivors, kSurvivors);

  // A region every rank can read, and the victim's key.
  std::vector<unsigned char> region_bytes(1 << 20);
  fill(region_bytes, me);
  ferry::MemoryRegion region = dev.register_memory(region_bytes.data(), region_bytes.size());
  const ferry::RemoteKey mine = region.remote_key();
  rt.kv_put("peer_failure.key", std::string(reinterpret_cast<const char*>(&mine), sizeof mine));
  rt.kv_fence();
  ferry::RemoteKey victim_key{};
  {
    const std::string k = rt.kv_get(victim, "peer_failure.key");
    if (k.size() != sizeof victim_key) fail("the victim's key has " + std::to_string(k.size()) + " bytes");
    std::memcpy(&victim_key, k.data(), sizeof victim_key);
  }

  const std::vector<std::vector<unsigned char>> bufs = sized_buffers(me);
  rt.barrier();

  // ---- before the failure: everyone with everyone, byte-exact -------------------------------
  exchange_with_all(dev, inbox, me, n, bufs, kBefore, kInbox);

  // ---- survivors: operations of every kind pending to and from the victim --------------------
  // The receive and the rendezvous send are posted before the barrier the victim passes
  // before dying, so they are surely pending when it dies.
  ferry::CompletionQueue ops;
  std::atomic<long> posted{0};
  unsigned char never[64];
  std::vector<unsigned char> big(256 * 1024);
  fill(big, me);
  if (me != victim) {
    const ferry::Status s =
        dev.post_recv({.rank = victim, .buffer = never, .size = sizeof never, .tag = kNeverSent, .local = &ops});
    if (!s.is_posted()) fail(std::string("post_recv from the victim: ") + ferry::to_string(s.kind));
    ++posted;
  }
  for (; me != victim;) {
    const ferry::Status s =
        dev.post_send({.rank = victim, .buffer = big.data(), .size = big.size(), .tag = kNeverReceived, .local = &ops});
    if (s.is_retry()) {
      dev.progress();
      continue;
    }
    if (!s.is_posted()) fail(std::string("rendezvous post_send to the victim: ") + ferry::to_string(s.kind));
    ++posted;
    break;
  }

  rt.barrier();

  if (me == victim) {
    // Take part in the flood, then die with everything in flight: once every survivor's flood
    // has reached it (so every survivor is past the barrier above).
    const auto start = Clock::now();
    long received = 0;
    std::vector<long> from(static_cast<std::size_t>(n), 0);
    auto everyone_flooding = [&] {
      for (int r = 0; r < n - 1; ++r)
        if (from[static_cast<std::size_t>(r)] < 300) return false;
      return true;
    };
    std::vector<unsigned char> out(70000);
    fill(out, me);
    while (!everyone_flooding()) {
      if (seconds_since(start) > kDeadline) fail("the survivors' flood did not reach the victim");
      dev.progress();
      while (auto c = inbox.pop()) {
        ++received;
        if (c->rank >= 0 && c->rank < n) ++from[static_cast<std::size_t>(c->rank)];
      }
      for (int to = 0; to < n - 1; ++to)  // rendezvous messages the survivors read from us
        (void)dev.post_am({.rank = to, .buffer = out.data(), .size = out.size(), .target = {kInbox}, .tag = kFlood});
    }
    if (const char* stamp = std::getenv("FERRY_TEST_STAMP")) {
      std::ofstream(stamp) << std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
    }
    std::fprintf(stderr, "rank %d: killing itself (SIGKILL) after %ld flood messages\n", me, received);
    std::fflush(stderr);
    ::raise(SIGKILL);
  }

  std::atomic<int> flooding{threads};
  std::atomic<long> failed_posts{0};
  std::atomic<long> posted_gets{0};
  std::mutex first_mutex;
  Clock::time_point first_failed_post{};
  std::vector<std::thread> pool;
  std::vector<std::vector<unsigned char>> gets(static_cast<std::size_t>(threads), std::vector<unsigned char>(65536));
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (long i = 0;; ++i) {
        ferry::Status s;
        if (i % 16 == 15) {
          s = dev.post_get({.rank = victim, .buffer = gets[static_cast<std::size_t>(t)].data(), .size = 65536,
                            .remote = victim_key, .offset = static_cast<std::size_t>(t) * 65536, .local = &ops});
        } else {
          const auto& b = bufs[static_cast<std::size_t>(i) % bufs.size()];
          s = dev.post_am({.rank = victim, .buffer = b.data(), .size = b.size(), .target = {kInbox}, .tag = kFlood, .local = &ops});
        }
        if (s.is_posted()) ++posted;
        if (s.is_posted() && i % 16 == 15) ++posted_gets;
        if (s.is_retry()) dev.progress();
        if (s.is_failed()) {
          if (s.rank != victim) fail("a post failed naming rank " + std::to_string(s.rank) + ", not the victim");
          {
            std::lock_guard<std::mutex> g(first_mutex);
            if (first_failed_post == Clock::time_point{}) first_failed_post = Clock::now();
          }
          ++failed_posts;
          break;
        }
        if ((i & 7) == 0) dev.progress();
      }
      --flooding;
    });
  }

  // Every posted operation completes, each exactly once, normally or with the victim's failure.
  long completed = 0, failed_ops = 0, from_victim = 0, from_victim_failed = 0;
  long completed_by_kind[8] = {};
  bool recv_failed = false, send_failed = false;
  const auto start = Clock::now();
  while (flooding.load() > 0 || completed < posted.load()) {
    dev.progress();
    while (auto c = ops.pop()) {
      ++completed;
      ++completed_by_kind[static_cast<int>(c->op) & 7];
      if (c->ok()) continue;
      if (c->error != ferry::peer_failed_error || c->rank != victim)
        fail("an operation failed with '" + c->error_string() + "', not the victim's failure");
      ++failed_ops;
      if (c->op == ferry::OpKind::recv && c->tag == kNeverSent) recv_failed = true;
      if (c->op == ferry::OpKind::send && c->tag == kNeverReceived) send_failed = true;
    }
    while (auto c = inbox.pop()) {
      if (c->rank != victim || c->tag != kFlood) fail("unexpected message from rank " + std::to_string(c->rank));
      ++from_victim;
      if (!c->ok()) {
        if (c->error != ferry::peer_failed_error) fail("a message from the victim failed with " + c->error_string());
        if (c->buffer.size() != 0 || !c->parts.empty()) fail("a failed message from the victim carried a payload");
        ++from_victim_failed;
      } else if (!intact(c->buffer.data(), c->buffer.size(), victim)) {
        fail("corrupt message from the victim");
      }
    }
    if (seconds_since(start) > kDeadline)
      fail("after " + std::to_string(kDeadline) + " s: " + std::to_string(flooding.load()) + " threads still flooding, " +
           std::to_string(completed) + " of " + std::to_string(posted.load()) + " operations completed (am " +
           std::to_string(completed_by_kind[0]) + ", get " + std::to_string(completed_by_kind[4]) + " of " +
           std::to_string(posted_gets.load()) + ")");
  }
  for (auto& t : pool) t.join();
  if (completed != posted.load()) fail("completions " + std::to_string(completed) + " != posted " + std::to_string(posted.load()));
  if (!recv_failed) fail("the receive naming the victim did not complete with its failure");
  if (!send_failed) fail("the rendezvous send to the victim did not complete with its failure");
  if (ops.pop()) fail("a completion was signalled twice");

  double detect_ms = -1;
  if (const char* stamp = std::getenv("FERRY_TEST_STAMP")) {
    long long died = 0;
    std::ifstream(stamp) >> died;
    const long long seen = std::chrono::duration_cast<std::chrono::nanoseconds>(first_failed_post.time_since_epoch()).count();
    if (died > 0) detect_ms = static_cast<double>(seen - died) / 1e6;
  }

  // The failure is named everywhere.
  const std::vector<int> failed = rt.failed_ranks();
  if (failed != std::vector<int>{victim}) fail("failed_ranks() does not name exactly the victim");
  {
    const ferry::Status s = dev.post_recv({.rank = victim, .buffer = never, .size = sizeof never, .tag = kNeverSent, .local = &ops});
    if (!s.is_failed() || s.rank != victim) fail(std::string("post_recv after the failure: ") + ferry::to_string(s.kind));
    const ferry::Status p = dev.post_put({.rank = victim, .buffer = big.data(), .size = 4096, .remote = victim_key, .local = &ops});
    if (!p.is_failed() || p.rank != victim) fail(std::string("post_put after the failure: ") + ferry::to_string(p.kind));
  }
  try {
    rt.barrier();
    fail("barrier() returned although the victim is dead");
  } catch (const ferry::PeerFailed& e) {
    if (e.rank() != victim) fail(std::string("barrier named the wrong rank: ") + e.what());
  }

  // ---- the survivors among themselves ---------------------------------------------------------
  std::vector<int> others;
  for (int to = 0; to < n - 1; ++to)
    if (to != me) others.push_back(to);
  exchange_after_failure(dev, inbox, survivors, kSurvivors, others, bufs, kAfter, kDone, [&](int r) { return r == victim; });

  try {
    rt.finalize();
    fail("finalize() returned normally although the victim is dead");
  } catch (const ferry::PeerFailed& e) {
    if (e.rank() != victim) fail(std::string("finalize named the wrong rank: ") + e.what());
  }
  std::printf("rank %d: peer failure OK: victim %d reported %.1f ms after its death; %ld posted, %ld failed with it, "
              "%ld posts refused; %ld messages from it (%ld failed); %zu survivors exchanged intact messages\n",
              me, victim, detect_ms, posted.load(), failed_ops, failed_posts.load(), from_victim, from_victim_failed, others.size());
  return 0;
}
