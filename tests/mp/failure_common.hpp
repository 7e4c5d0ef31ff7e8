// failure_common.hpp — what the failure tests (peer_failure.cpp, link_cut.cpp) share: a
// byte pattern that names its sender and size, a failing exit that names the rank, and a
// checked batch of active messages of every protocol's size.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"

namespace failure_test {

using Clock = std::chrono::steady_clock;

inline int g_rank = -1;

[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "rank %d: FAIL: %s\n", g_rank, what.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

// A victim test's argument (threads, 1..max) and its start once the runtime is up: the rank
// for fail(), at least 2 ranks, and the pid line peer_failure.sh checks the processes by.
inline int threads_argument(int argc, char** argv, int max) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  if (threads < 1 || threads > max) fail(std::string("threads=") + (argc > 1 ? argv[1] : "") + " must be 1.." + std::to_string(max));
  return threads;
}
inline void started(const ferry::Runtime& rt) {
  g_rank = rt.rank();
  if (rt.size() < 2) fail("needs at least 2 ranks");
  std::fprintf(stderr, "rank %d pid %d\n", rt.rank(), static_cast<int>(getpid()));
}

inline unsigned char pattern(int src, std::size_t size, std::size_t i) {
  return static_cast<unsigned char>((static_cast<std::size_t>(src) * 31u + size * 7u + i * 13u + (i >> 12)) & 0xFF);
}
inline void fill(std::vector<unsigned char>& v, int src) {
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = pattern(src, v.size(), i);
}
inline bool intact(const void* data, std::size_t n, int src) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] != pattern(src, n, i)) return false;
  return true;
}

inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

inline const std::size_t kSizes[] = {8, 3000, 100000};  // eager, fragmented (or rendezvous), rendezvous
constexpr int kPerSize = 40;                             // messages per size, per peer, per phase
constexpr double kDeadline = 30.0;                       // seconds any wait may take before it is a failure

// One buffer per size in kSizes, filled with `rank`'s pattern.
inline std::vector<std::vector<unsigned char>> sized_buffers(int rank) {
  std::vector<std::vector<unsigned char>> bufs;
  for (std::size_t size : kSizes) {
    bufs.emplace_back(size);
    fill(bufs.back(), rank);
  }
  return bufs;
}

// Sends kPerSize messages of every size in kSizes to `to` with `tag`; waits for their local
// completions (a rendezvous send's buffer is in use until then).
inline void send_checked_batch(ferry::Device& dev, const std::vector<std::vector<unsigned char>>& bufs, int to,
                               ferry::Tag tag, std::uint16_t target) {
  ferry::CompletionQueue local;
  int posted = 0;
  for (int i = 0; i < kPerSize; ++i) {
    for (const auto& b : bufs) {
      for (;;) {
        const ferry::Status s =
            dev.post_am({.rank = to, .buffer = b.data(), .size = b.size(), .target = {target}, .tag = tag, .local = &local});
        if (s.is_retry()) {
          dev.progress();
          continue;
        }
        if (s.is_failed()) fail("post_am to rank " + std::to_string(to) + " returned failed");
        if (s.is_posted()) ++posted;
        break;
      }
    }
  }
  const auto start = Clock::now();
  while (posted > 0) {
    dev.progress();
    if (auto c = local.pop()) {
      if (!c->ok()) fail("an active message to rank " + std::to_string(to) + " failed: " + c->error_string());
      --posted;
    }
    if (seconds_since(start) > kDeadline) fail("local completions to rank " + std::to_string(to) + " never came");
  }
}

// Every rank sends every other a checked batch with `tag` to `target` and receives theirs
// from `inbox`, byte for byte.
inline void exchange_with_all(ferry::Device& dev, ferry::CompletionQueue& inbox, int me, int n,
                              const std::vector<std::vector<unsigned char>>& bufs, ferry::Tag tag, std::uint16_t target) {
  const int expected = (n - 1) * kPerSize * static_cast<int>(std::size(kSizes));
  int got = 0;
  for (int to = 0; to < n; ++to)
    if (to != me) send_checked_batch(dev, bufs, to, tag, target);
  const auto start = Clock::now();
  while (got < expected) {
    dev.progress();
    if (auto c = inbox.pop()) {
      if (c->tag != tag || !c->ok()) fail("unexpected message in the first exchange: " + c->error_string());
      if (!intact(c->buffer.data(), c->buffer.size(), c->rank)) fail("corrupt message from rank " + std::to_string(c->rank));
      ++got;
    }
    if (seconds_since(start) > kDeadline) fail("first exchange: " + std::to_string(got) + " of " + std::to_string(expected));
  }
}

// After a failure: this rank and `peers` (the ranks still reachable) exchange checked batches
// with `tag` on `box` (exposed under `target`), each followed by an empty `done` message, and
// wait for every peer's, byte for byte. Late messages on `inbox` (the flood) are drained and
// must come from a rank `was_failed` names.
template <class WasFailed>
void exchange_after_failure(ferry::Device& dev, ferry::CompletionQueue& inbox, ferry::CompletionQueue& box,
                            std::uint16_t target, const std::vector<int>& peers,
                            const std::vector<std::vector<unsigned char>>& bufs, ferry::Tag tag, ferry::Tag done_tag,
                            WasFailed was_failed) {
  for (int to : peers) {
    send_checked_batch(dev, bufs, to, tag, target);
    for (;;) {
      const ferry::Status s = dev.post_am({.rank = to, .buffer = nullptr, .size = 0, .target = {target}, .tag = done_tag});
      if (s.is_retry()) {
        dev.progress();
        continue;
      }
      if (!s.is_done()) fail(std::string("the done message: ") + ferry::to_string(s.kind));
      break;
    }
  }
  const int others = static_cast<int>(peers.size());
  const int expected = others * kPerSize * static_cast<int>(std::size(kSizes));
  int got = 0, done = 0;
  const auto t0 = Clock::now();
  while (got < expected || done < others) {
    dev.progress();
    while (auto late = inbox.pop()) {
      if (!was_failed(late->rank)) fail("a flood message from rank " + std::to_string(late->rank));
    }
    if (auto c = box.pop()) {
      if (!c->ok()) fail("a message after the failure failed: " + c->error_string());
      if (c->tag == done_tag) {
        ++done;
        continue;
      }
      if (c->tag != tag || !intact(c->buffer.data(), c->buffer.size(), c->rank))
        fail("corrupt or unexpected message from rank " + std::to_string(c->rank));
      ++got;
    }
    if (seconds_since(t0) > kDeadline) fail("traffic after the failure: " + std::to_string(got) + " of " + std::to_string(expected));
  }
}

}  // namespace failure_test
