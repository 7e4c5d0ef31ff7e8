// A cut link, end to end: a job on two hosts (ranks r / FERRY_TEST_RANKS_PER_HOST, two hosts),
// every rank flooding the ranks of the other host, until the test script takes the link
// between the hosts down (netns_hosts.sh with FERRY_NETNS_CUT_DIR). No process dies and no
// connection is reset: only the keepalive (FERRY_PEER_TIMEOUT_MS) can tell. Every rank must:
//  - see every operation it posted complete, normally or with peer_failed_error naming a rank
//    of the other host (a receive and a rendezvous send to each of them were surely pending);
//  - have failed_ranks() == the other host's ranks, the first after the script announced the
//    cut and within the timeout, two check intervals and 600 ms of it (5 s with the defaults),
//    however long the data already in this rank's socket when the link went takes to drain
//    (heartbeats travel on a channel of their own);
//  - get ferry::PeerFailed from barrier() and finalize();
//  - go on exchanging byte-exact messages with the ranks of its own host.
// Messages from before the cut are checked byte for byte.
//
// Usage (under netns_hosts.sh): ferry-mp-link-cut [threads]
// FERRY_TEST_CUT_DIR: each rank creates flooding.<rank> there once the flood from every rank of
// the other host reaches it; the script then cuts the link and creates `cut`.
// FERRY_TEST_DETECT_BOUND_MS: the detection bound, instead of one from FERRY_PEER_TIMEOUT_MS.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.hpp"

#include "failure_common.hpp"

namespace {

using namespace failure_test;

constexpr std::uint16_t kInbox = 1;    // the first exchange, and the flood
constexpr std::uint16_t kHomeBox = 2;  // ranks of one host among themselves, after the cut
constexpr ferry::Tag kBefore = 1, kAfter = 2, kDone = 3, kFlood = 4, kNeverSent = 7, kNeverReceived = 8;

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  if (threads < 1 || threads > 16) fail(std::string("threads=") + (argc > 1 ? argv[1] : "") + " must be 1..16");
  const char* dir = std::getenv("FERRY_TEST_CUT_DIR");
  if (dir == nullptr || *dir == '\0') fail("FERRY_TEST_CUT_DIR is not set: run this under netns_hosts.sh");
  const char* per_host_text = std::getenv("FERRY_TEST_RANKS_PER_HOST");
  const int per_host = per_host_text != nullptr ? std::atoi(per_host_text) : 2;
  ferry::Runtime rt;
  g_rank = rt.rank();
  const int me = rt.rank(), n = rt.size();
  if (per_host < 1 || n != 2 * per_host) fail("needs two hosts of FERRY_TEST_RANKS_PER_HOST ranks each");
  std::fprintf(stderr, "rank %d pid %d\n", me, static_cast<int>(getpid()));
  std::printf("rank %d: transport %s\n", me, rt.transport().c_str());
  std::fflush(stdout);
  const int host = me / per_host;
  std::vector<int> away, home;
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    (r / per_host == host ? home : away).push_back(r);
  }
  auto is_away = [&](int r) { return r / per_host != host; };
  ferry::Device& dev = rt.device();
  ferry::CompletionQueue inbox;
  ferry::Exposure exposure = rt.expose(inbox, kInbox);
  ferry::CompletionQueue homebox;
  ferry::Exposure home_exposure = rt.expose(homebox, kHomeBox);
  const std::vector<std::vector<unsigned char>> bufs = sized_buffers(me);
  rt.barrier();

  // ---- before the cut: everyone with everyone, byte-exact -----------------------------------
  exchange_with_all(dev, inbox, me, n, bufs, kBefore, kInbox);

  // ---- operations surely pending across the link when it goes -------------------------------
  ferry::CompletionQueue ops;
  std::atomic<long> posted{0};
  std::vector<unsigned char> never(64 * away.size());
  std::vector<unsigned char> big(256 * 1024);
  fill(big, me);
  std::vector<bool> recv_failed(static_cast<std::size_t>(n)), send_failed(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < away.size(); ++i) {
    const ferry::Status s =
        dev.post_recv({.rank = away[i], .buffer = never.data() + 64 * i, .size = 64, .tag = kNeverSent, .local = &ops});
    if (!s.is_posted()) fail(std::string("post_recv from the other host: ") + ferry::to_string(s.kind));
    ++posted;
    for (;;) {
      const ferry::Status t =
          dev.post_send({.rank = away[i], .buffer = big.data(), .size = big.size(), .tag = kNeverReceived, .local = &ops});
      if (t.is_retry()) {
        dev.progress();
        continue;
      }
      if (!t.is_posted()) fail(std::string("rendezvous post_send to the other host: ") + ferry::to_string(t.kind));
      ++posted;
      break;
    }
  }
  rt.barrier();

  // ---- the flood across the link, until the link is gone ------------------------------------
  std::atomic<int> flooding{threads};
  std::atomic<long> failed_posts{0};
  std::mutex first_mutex;
  Clock::time_point first_failed_post{};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::vector<bool> down(away.size(), false);
      std::size_t left = away.size();
      for (long i = t; left > 0; ++i) {
        const std::size_t k = static_cast<std::size_t>(i) % away.size();
        if (down[k]) continue;
        const auto& b = bufs[static_cast<std::size_t>(i / static_cast<long>(away.size())) % bufs.size()];
        const ferry::Status s =
            dev.post_am({.rank = away[k], .buffer = b.data(), .size = b.size(), .target = {kInbox}, .tag = kFlood, .local = &ops});
        if (s.is_posted()) ++posted;
        if (s.is_retry()) dev.progress();
        if (s.is_failed()) {
          if (!is_away(s.rank)) fail("a post failed naming rank " + std::to_string(s.rank) + ", on this rank's host");
          {
            std::lock_guard<std::mutex> g(first_mutex);
            if (first_failed_post == Clock::time_point{}) first_failed_post = Clock::now();
          }
          ++failed_posts;
          down[k] = true;
          --left;
        }
        if ((i & 7) == 0) dev.progress();
      }
      --flooding;
    });
  }

  long completed = 0, failed_ops = 0, flood_in = 0, flood_in_failed = 0;
  std::vector<long> from(static_cast<std::size_t>(n), 0);
  bool announced = false;
  Clock::time_point cut_seen{}, failure_seen{};
  // The last intact message from the other host: what was already on its way when the link
  // went down (in this rank's socket, behind a flood) still arrives after the cut, and each
  // is news from the peer, so the silence the keepalive times starts after the later of the two.
  Clock::time_point last_from_away{};
  auto last_look = Clock::now();
  const auto start = Clock::now();
  while (flooding.load() > 0 || completed < posted.load()) {
    dev.progress();
    while (auto c = ops.pop()) {
      ++completed;
      if (c->ok()) continue;
      if (c->error != ferry::peer_failed_error || !is_away(c->rank))
        fail("an operation failed with '" + c->error_string() + "' naming rank " + std::to_string(c->rank) +
             ", not the failure of a rank of the other host");
      ++failed_ops;
      if (c->op == ferry::OpKind::recv && c->tag == kNeverSent) recv_failed[static_cast<std::size_t>(c->rank)] = true;
      if (c->op == ferry::OpKind::send && c->tag == kNeverReceived) send_failed[static_cast<std::size_t>(c->rank)] = true;
    }
    while (auto c = inbox.pop()) {
      if (!is_away(c->rank) || c->tag != kFlood) fail("unexpected message from rank " + std::to_string(c->rank));
      ++flood_in;
      ++from[static_cast<std::size_t>(c->rank)];
      if (!c->ok()) {
        if (c->error != ferry::peer_failed_error) fail("a flood message failed with " + c->error_string());
        // Its receive block may still be written by a read given up on: it is never handed out.
        if (c->buffer.size() != 0 || !c->parts.empty()) fail("a failed flood message carried a payload");
        ++flood_in_failed;
      } else if (!intact(c->buffer.data(), c->buffer.size(), c->rank)) {
        fail("corrupt flood message from rank " + std::to_string(c->rank));
      } else {
        last_from_away = Clock::now();
      }
    }
    if (!announced && std::all_of(away.begin(), away.end(), [&](int r) { return from[static_cast<std::size_t>(r)] >= 300; })) {
      std::ofstream(std::string(dir) + "/flooding." + std::to_string(me)) << me;
      announced = true;
    }
    if (seconds_since(last_look) > 0.005) {
      last_look = Clock::now();
      if (cut_seen == Clock::time_point{} && exists(std::string(dir) + "/cut")) cut_seen = last_look;
      if (failure_seen == Clock::time_point{} && !rt.failed_ranks().empty()) failure_seen = last_look;
    }
    if (seconds_since(start) > 2 * kDeadline)
      fail("after " + std::to_string(2 * kDeadline) + " s: " + std::to_string(flooding.load()) + " threads still flooding, " +
           std::to_string(completed) + " of " + std::to_string(posted.load()) + " operations completed" +
           (cut_seen == Clock::time_point{} ? " (the link was never cut)" : ""));
  }
  for (auto& t : pool) t.join();
  if (completed != posted.load()) fail("completions " + std::to_string(completed) + " != posted " + std::to_string(posted.load()));
  if (ops.pop()) fail("a completion was signalled twice");
  for (int r : away) {
    if (!recv_failed[static_cast<std::size_t>(r)]) fail("the receive naming rank " + std::to_string(r) + " did not fail with it");
    if (!send_failed[static_cast<std::size_t>(r)]) fail("the rendezvous send to rank " + std::to_string(r) + " did not fail with it");
  }
  if (cut_seen == Clock::time_point{}) fail("operations failed before the script announced the cut");
  const double detect_ms = std::chrono::duration<double, std::milli>(first_failed_post - cut_seen).count();
  const double after_quiet_ms =
      std::chrono::duration<double, std::milli>(first_failed_post - std::max(cut_seen, last_from_away)).count();
  const int timeout_ms = static_cast<int>(rt.options().settings.peer_timeout_ms);
  // The bound, counted from the cut: the timeout (silence since the last heartbeat, which left
  // before the cut: up to a beat interval before, which only makes detection earlier), a check
  // on each side, and 600 ms for a loaded machine;
  // 5000 ms with the defaults (4000, 200). FERRY_TEST_DETECT_BOUND_MS replaces it (a run
  // under a debugger or a sanitizer).
  const char* bound_text = std::getenv("FERRY_TEST_DETECT_BOUND_MS");
  const double bound_ms = bound_text != nullptr ? std::atof(bound_text)
                                                : timeout_ms + 2.0 * rt.options().settings.peer_check_ms + 600.0;
  const double known_ms = std::chrono::duration<double, std::milli>(failure_seen - cut_seen).count();
  if (detect_ms < 0 || detect_ms > bound_ms)
    fail("the first refused post came " + std::to_string(detect_ms) + " ms after the cut and " + std::to_string(after_quiet_ms) +
         " ms after the last message from the other host (failed_ranks() named one " + std::to_string(known_ms) +
         " ms after the cut); the bound is " + std::to_string(bound_ms) + " ms after the cut");
  if (rt.failed_ranks() != away) fail("failed_ranks() does not name exactly the other host's ranks");
  try {
    rt.barrier();
    fail("barrier() returned although the link is cut");
  } catch (const ferry::PeerFailed& e) {
    if (!is_away(e.rank())) fail(std::string("barrier named a rank of this host: ") + e.what());
  }

  // ---- this host's ranks among themselves ----------------------------------------------------
  exchange_after_failure(dev, inbox, homebox, kHomeBox, home, bufs, kAfter, kDone, is_away);

  try {
    rt.finalize();
    fail("finalize() returned normally although the link is cut");
  } catch (const ferry::PeerFailed& e) {
    if (!is_away(e.rank())) fail(std::string("finalize named a rank of this host: ") + e.what());
  }
  std::printf("rank %d: link cut OK: the other host's ranks reported %.1f ms after the cut, %.1f ms after the last message from it (timeout %d ms); %ld posted, "
              "%ld failed with them, %ld posts refused; %ld flood messages in (%ld failed); %zu ranks of this host "
              "exchanged intact messages\n",
              me, detect_ms, after_quiet_ms, timeout_ms, posted.load(), failed_ops, failed_posts.load(), flood_in, flood_in_failed, home.size());
  return 0;
}
