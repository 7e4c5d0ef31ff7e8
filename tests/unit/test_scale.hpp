// test_scale.hpp — how much work the stress tests do, and how they start together.
//
// The stress tests are sized to finish in a few seconds on a 2-core machine. ThreadSanitizer
// slows atomics and thread switches by 10-50x, so under TSan they do a tenth of the work;
// FERRY_TEST_SCALE (a positive number, default 1) multiplies the counts further, e.g. 10 for
// a long soak or 0.1 on a very slow machine.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <thread>

#if defined(__SANITIZE_THREAD__)
#define FERRY_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FERRY_TEST_TSAN 1
#endif
#endif
#ifndef FERRY_TEST_TSAN
#define FERRY_TEST_TSAN 0
#endif

namespace ferry::test {

inline double scale_factor() {
  double s = FERRY_TEST_TSAN ? 0.1 : 1.0;
  if (const char* e = std::getenv("FERRY_TEST_SCALE"); e != nullptr && *e != '\0') {
    const double v = std::strtod(e, nullptr);
    if (v > 0) s *= v;
  }
  return s;
}

// n scaled, but never below `floor` so a scaled-down run still exercises contention.
inline std::size_t scaled(std::size_t n, std::size_t floor = 1000) {
  const double v = static_cast<double>(n) * scale_factor();
  return std::max(floor, static_cast<std::size_t>(v));
}

// Holds stress threads at the start until all exist: otherwise the first threads can finish
// their share before the last ones are even created, and nothing actually contends.
class Gate {
 public:
  void wait() const noexcept {
    while (!open_.load(std::memory_order_acquire)) std::this_thread::yield();
  }
  void open() noexcept { open_.store(true, std::memory_order_release); }

 private:
  std::atomic<bool> open_{false};
};

}  // namespace ferry::test
