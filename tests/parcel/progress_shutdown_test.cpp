// FERRY_PROGRESS=thread:N: the progress threads alone move messages (this program never calls
// progress itself before finalize), and finalize stops them cleanly while work is in flight.
//   FERRY_PROGRESS=thread:2 FERRY_DEVICES=2 ferryrun -n 2 ferry-progress-shutdown-test
// Exit 0 on success; 1 with a message on failure. A hang is caught by ferryrun's timeout.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.hpp"

int main() {
  using clock = std::chrono::steady_clock;
  ferry::Runtime rt;
  const std::string& progress = rt.options().value("progress");
  if (rt.options().settings.progress.value != ferry::ProgressMode::thread) {
    std::fprintf(stderr, "progress_shutdown_test: needs FERRY_PROGRESS=thread:N, not '%s'\n", progress.c_str());
    return 2;
  }
  const int me = rt.rank(), n = rt.size(), peer = (me + 1) % n, devices = rt.device_count();
  ferry::CompletionQueue inbox;
  ferry::Exposure exposure = rt.expose(inbox, 5);
  rt.barrier();

  // Posts one active message, waiting out retries: the progress threads free the resources.
  auto post = [&](int dev, const void* data, std::size_t size) {
    for (;;) {
      const ferry::Status s = rt.device(dev).post_am({.rank = peer, .buffer = data, .size = size, .target = {5}});
      if (!s.is_retry()) return;
      std::this_thread::yield();
    }
  };

  // 1. Nobody here calls progress: messages arrive only because the progress threads poll.
  constexpr int kFirst = 200;
  const std::uint64_t word = 42;
  for (int i = 0; i < kFirst; ++i) post(i % devices, &word, sizeof word);
  int arrived = 0;
  const auto deadline = clock::now() + std::chrono::seconds(60);
  while (arrived < kFirst && clock::now() < deadline) {
    if (auto c = inbox.pop()) {
      ++arrived;
    } else {
      std::this_thread::yield();
    }
  }
  if (arrived != kFirst) {
    std::fprintf(stderr, "rank %d: FAILED: %d of %d messages arrived with only the progress threads (%s) polling\n", me,
                 arrived, kFirst, progress.c_str());
    return 1;
  }
  rt.barrier();  // everyone passed phase 1: nobody counts phase 2's messages as phase 1's

  // 2. Work in flight at finalize: eager and rendezvous messages on every device, not waited for.
  std::vector<std::byte> big(256 * 1024, std::byte{7});
  for (int i = 0; i < 400; ++i) {
    if (i % 50 == 0) {
      post(i % devices, big.data(), big.size());  // rendezvous: needs both sides' progress
    } else {
      post(i % devices, &word, sizeof word);
    }
  }
  const auto t0 = clock::now();
  rt.finalize();  // stops the progress threads first, then drains and meets the peers
  const double seconds = std::chrono::duration<double>(clock::now() - t0).count();
  if (seconds > 9.0) {  // the drain gives up after 10 s: anything near it means stuck operations
    std::fprintf(stderr, "rank %d: FAILED: finalize took %.1f s with %s\n", me, seconds, progress.c_str());
    return 1;
  }
  std::printf("rank %d: %s, %d devices: progress threads delivered %d messages alone; finalize with work in flight took %.3f s\n",
              me, progress.c_str(), devices, kFirst, seconds);
  return 0;
}
