// ferry-c2c: the round-trip time of one cache line between two cores.
//
// On a virtual machine the host decides where the guest's cores run, and may move them while
// a benchmark runs: two guest cores on one physical core's hyperthreads pass a cache line in
// tens of nanoseconds, on two physical cores in hundreds. Shared-memory communication moves
// cache lines between the communicating processes, so its rates follow that placement (ferry's
// 8-byte flood here: 2.9 M/s at a ~60 ns round trip, 1.0 M/s at ~340 ns). The benchmark
// scripts run this probe next to every measurement, so a result can be read with the
// placement it was measured under.
//
// Two threads, pinned to --cpus A,B, bounce a counter: A writes an odd value and waits for the
// next even one, B answers. Prints the median of --batches batches as JSON.
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace {

bool pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(static_cast<unsigned>(cpu), &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

// One cache line of its own: nothing else shares it with the counter.
struct alignas(64) Line {
  std::atomic<long> value{0};
};

}  // namespace

int main(int argc, char** argv) {
  int a = 0, b = 1;
  long trips = 20000;
  int batches = 5;
  CLI::App app{"ferry-c2c: cache-line round trip between two cores (ns)", "ferry-c2c"};
  app.add_option("--cpu-a", a, "first core")->check(CLI::Range(0, 4095));
  app.add_option("--cpu-b", b, "second core")->check(CLI::Range(0, 4095));
  app.add_option("--trips", trips, "round trips per batch")->check(CLI::Range(1L, 100'000'000L));
  app.add_option("--batches", batches, "batches (the median is reported)")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  if (a == b || a >= cores || b >= cores) {
    std::fprintf(stderr, "ferry-c2c: error: --cpu-a %d and --cpu-b %d must be two different cores below %d\n", a, b, cores);
    return 2;
  }

  // Relaxed would do for the value itself; acquire/release keeps the probe honest about what
  // a real handoff costs (the same orders a queue hand-off uses).
  Line line;
  bool pinned_b = true;
  std::thread responder([&] {
    pinned_b = pin(b);
    for (long i = 0; i < trips * batches; ++i) {
      while (line.value.load(std::memory_order_acquire) != 2 * i + 1) {
      }
      line.value.store(2 * i + 2, std::memory_order_release);
    }
  });
  const bool pinned_a = pin(a);
  std::vector<double> ns;
  long i = 0;
  for (int k = 0; k < batches; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    for (long j = 0; j < trips; ++j, ++i) {
      line.value.store(2 * i + 1, std::memory_order_release);
      while (line.value.load(std::memory_order_acquire) != 2 * i + 2) {
      }
    }
    ns.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
                 static_cast<double>(trips));
  }
  responder.join();
  std::vector<double> sorted = ns;
  std::sort(sorted.begin(), sorted.end());
  nlohmann::json j = {{"bench", "c2c"},          {"cpu_a", a},
                      {"cpu_b", b},              {"pinned", pinned_a && pinned_b},
                      {"trips", trips},          {"round_trip_ns", sorted[sorted.size() / 2]},
                      {"batches_ns", ns}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}
