// mp_common.hpp — helpers for tests that every rank of a job runs together.
//
// Each test is collective: every rank runs the same tests in the same order (gtest's order is
// deterministic), and each test ends with rt().barrier(). A rank that fails an assertion
// returns early; its peers then time out in wait_until (a failure, never a hang) and the
// launcher's --timeout is the last resort.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/cpu_relax.hpp"
#include "ferry/ferry.hpp"

namespace mp {

ferry::Runtime& rt();

inline double wait_seconds() { return 120.0; }

// A wait's progress call yields the core after 32 in a row that found nothing
// (detail::IdleBackoff), so that a job with more ranks than cores (4 ranks on 2 cores here)
// hands the core to the peer it waits for instead of spinning out its time slice.
using Idle = ferry::detail::IdleBackoff;

// Progresses `dev` until pred() holds; false on timeout.
template <class Pred>
bool wait_until(ferry::Device& dev, Pred&& pred, double seconds = wait_seconds()) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  Idle idle;
  while (!pred()) {
    idle(dev.progress());
    if (std::chrono::steady_clock::now() > deadline) return false;
  }
  return true;
}

// Posts until the post is not `retry`, progressing in between.
template <class Post>
ferry::Status post_retry(ferry::Device& dev, Post&& post) {
  Idle idle;
  for (;;) {
    ferry::Status s = post();
    if (!s.is_retry()) return s;
    idle(dev.progress());
  }
}

// The byte at index i of a message of `size` bytes from `src`: differs by sender, size and index.
inline unsigned char pattern(int src, std::size_t size, std::size_t i) {
  return static_cast<unsigned char>((static_cast<std::size_t>(src) * 31u + size * 7u + i * 13u + (i >> 12)) & 0xFF);
}

// The pattern a row at a time: within 4096-byte block k the byte at i is row_k[i % 256] (i * 13
// mod 256 repeats every 256 bytes, and i >> 12 is k throughout the block), so fill and check
// copy and compare whole rows; 64 MiB messages and 2 GiB in the large runs go at memory speed.
template <class Run>
void for_each_pattern_run(int src, std::size_t size, std::size_t n, Run&& run) {
  unsigned char row[256];
  for (std::size_t block = 0; block * 4096 < n; ++block) {
    for (std::size_t j = 0; j < 256; ++j) row[j] = pattern(src, size, block * 4096 + j);
    const std::size_t end = std::min(n, block * 4096 + 4096);
    for (std::size_t pos = block * 4096; pos < end; pos += 256) {
      if (!run(pos, row, std::min<std::size_t>(256, end - pos))) return;
    }
  }
}

inline void fill(unsigned char* p, std::size_t n, int src) {
  for_each_pattern_run(src, n, n, [&](std::size_t pos, const unsigned char* row, std::size_t len) {
    std::memcpy(p + pos, row, len);
    return true;
  });
}
inline void fill(std::vector<unsigned char>& v, int src) { fill(v.data(), v.size(), src); }

// Index of the first wrong byte, or -1.
inline long long first_mismatch(const void* data, std::size_t n, int src, std::size_t size_for_pattern) {
  const auto* p = static_cast<const unsigned char*>(data);
  long long at = -1;
  for_each_pattern_run(src, size_for_pattern, n, [&](std::size_t pos, const unsigned char* row, std::size_t len) {
    if (std::memcmp(p + pos, row, len) == 0) return true;
    for (std::size_t i = 0; i < len; ++i) {
      if (p[pos + i] != row[i]) {
        at = static_cast<long long>(pos + i);
        break;
      }
    }
    return false;
  });
  return at;
}

// The largest message the data-path tests move: 5 MiB + 3 bytes, larger than the 2 MiB windows
// of bytes in flight (the pushed write's, UCX's get over active messages), which then let it
// through alone, with a tail no multiple of a word. No limit in ferry lies between this and
// 64 MiB (transfers split only at a transport's max_rma_size, 1 GiB or more), which the large
// runs (FERRY_TEST_LARGE, `mp_*_beyond_2GiB`, one per provider) move instead: fresh buffers of
// 64 MiB in every run of the suite cost their page faults many times over.
inline std::size_t largest_size() {
  return std::getenv("FERRY_TEST_LARGE") != nullptr ? std::size_t{64} << 20 : (std::size_t{5} << 20) + 3;
}

// The sizes every data-path test covers.
inline std::vector<std::size_t> sizes() {
  // 4080..8176 straddle shm's 4096-byte inject size with the 16-byte header: one inject,
  // two fragments (the second of one byte), two full fragments, the largest packet-sized
  // message; 8192..16384 are fragments reassembled on the heap (FERRY_FRAGMENT_MAX), 16385
  // the smallest rendezvous; 1 MiB the smallest receive block on 2 MiB pages (FERRY_RECV_HUGE).
  return {0, 1, 7, 8, 64, 4080, 4081, 4095, 4096, 8144, 8176, 8192, 12000, 16384, 16385, 65536, 1u << 20, largest_size()};
}

// Whether a thread of ferry's own progresses the devices (the offload model's, FERRY_PROGRESS=thread:N).
inline bool another_thread_progresses() {
  const ferry::RuntimeSettings& set = rt().options().settings;
  return set.lock_model == ferry::LockModel::offload || set.progress.value != ferry::ProgressMode::explicit_calls;
}

// FERRY_LOCK_MODEL=serialized lets one thread at a time into a device: a test whose threads
// share one skips under it (its ranks all alike, as the setting is the job's).
inline bool serialized_model() { return rt().options().settings.lock_model == ferry::LockModel::serialized; }
#define MP_SKIP_IF_THREADS_SHARE_A_DEVICE()                                                           \
  if (serialized_model()) GTEST_SKIP() << "its threads share a device, which FERRY_LOCK_MODEL=serialized " \
                                          "does not allow"

inline int right() { return (rt().rank() + 1) % rt().size(); }
inline int left() { return (rt().rank() + rt().size() - 1) % rt().size(); }

// Exchanges a trivially copyable value with every rank through the bootstrap store.
template <class T>
std::vector<T> allgather(const std::string& key, const T& mine) {
  rt().kv_put(key, std::string(reinterpret_cast<const char*>(&mine), sizeof(T)));
  rt().kv_fence();
  std::vector<T> out(static_cast<std::size_t>(rt().size()));
  for (int r = 0; r < rt().size(); ++r) {
    const std::string v = rt().kv_get(r, key);
    std::memcpy(&out[static_cast<std::size_t>(r)], v.data(), sizeof(T));
  }
  return out;
}

}  // namespace mp
