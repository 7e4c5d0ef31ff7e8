// atomic_bench.hpp — ferry-bench atomic: rank 0 performs remote atomics on rank 1's memory.
// Latency: one at a time, the time from post to completion (the full round trip: the number
// ucx_perftest's ucp_fadd, ucp_cswap and ucp_swap report). Rate: --window in flight, atomics
// completed per second (a post that is done at once counts as completed). Each over --iters operations, --reps times; the medians are reported.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench_util.hpp"

namespace bench {

inline const std::vector<std::string> atomic_ops = {"fetch_add", "cswap", "swap", "add"};

struct AtomicBenchArgs {
  std::string op = "fetch_add";
  long iters = 20000;
  int reps = 5;
  int window = 64;
  std::string memory = "allocated";
  bool json = false;
};

inline void add_atomic_options(CLI::App* sub, AtomicBenchArgs& a) {
  sub->add_option("--op", a.op, "the atomic (64-bit unsigned)")->check(CLI::IsMember(atomic_ops));
  sub->add_option("--iters", a.iters, "atomics per repetition")->check(integer_in(1, max_count));
  sub->add_option("--reps", a.reps, "repetitions; the median is reported")->check(integer_in(1, 1000));
  sub->add_option("--window", a.window, "atomics in flight in the rate test")->check(integer_in(1, 4096));
  sub->add_option("--memory", a.memory,
                  "rank 1's word: allocated (Device::allocate_memory, mapped by a peer on its host) or registered "
                  "(the application's memory: atomics by message)")
      ->check(CLI::IsMember({"allocated", "registered"}));
  sub->add_flag("--json", a.json, "one JSON object");
}

// ferry-bench atomic (atomic_bench.cpp).
int run_atomic(const AtomicBenchArgs& a);

}  // namespace bench
