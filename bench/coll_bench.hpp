// coll_bench.hpp — what ferry-bench coll and its MPI baseline (ferry-mpi-coll) share: the
// operations, what --size means for each, the options, and the timing: OSU-style, each
// repetition a barrier, then --iters operations back to back, the time per operation taken as
// the slowest rank's (a max-reduction), and the median over repetitions reported.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench_util.hpp"

namespace bench {

inline const std::vector<std::string> coll_ops = {"barrier",   "bcast",    "reduce",        "allreduce",
                                                  "allgather", "alltoall", "reduce_scatter"};

struct CollArgs {
  std::string op = "allreduce";
  std::size_t size = 8;  // bytes: bcast's message; the reductions' vector (doubles, at least one);
                         // allgather's, alltoall's and reduce_scatter's block per rank
  long iters = 1000;
  long warmup = 100;
  int reps = 5;
  bool json = false;
};

inline void add_coll_options(CLI::App* sub, CollArgs& a) {
  sub->add_option("--op", a.op, "the collective")->check(CLI::IsMember(coll_ops));
  sub->add_option("--size", a.size, "bytes (per rank for allgather, alltoall, reduce_scatter)")
      ->check(integer_in(0, std::int64_t{1} << 32));
  sub->add_option("--iters", a.iters, "operations per repetition (fewer past 64 KiB: at most 64 MiB moved per repetition)")
      ->check(integer_in(1, max_count));
  sub->add_option("--warmup", a.warmup, "operations before the first repetition")->check(integer_in(0, max_count));
  sub->add_option("--reps", a.reps, "repetitions; the median is reported")->check(integer_in(1, 1000));
  sub->add_flag("--json", a.json, "one JSON object");
}

// The reductions' element count (doubles) for --size bytes.
inline std::size_t coll_count(std::size_t size) { return std::max<std::size_t>(1, size / sizeof(double)); }

// Operations per repetition: --iters, fewer for large sizes so a repetition moves at most 64 MiB.
inline long coll_iters(const CollArgs& a) {
  if (a.size <= (64u << 10)) return a.iters;
  return std::max<long>(5, std::min<long>(a.iters, static_cast<long>((std::size_t{64} << 20) / a.size)));
}

// Runs the benchmark with the implementation's calls: `op()` one collective to its end,
// `barrier()`, `max_of(x)` the largest x over the ranks. Returns the result (rank 0's counts).
template <class Op, class Barrier, class MaxOf>
nlohmann::json time_coll(const CollArgs& a, int ranks, Op&& op, Barrier&& barrier, MaxOf&& max_of) {
  for (long i = 0; i < a.warmup; ++i) op();
  const long iters = coll_iters(a);
  std::vector<double> per_rep;
  for (int r = 0; r < a.reps; ++r) {
    barrier();
    const auto start = Clock::now();
    for (long i = 0; i < iters; ++i) op();
    per_rep.push_back(max_of(seconds_since(start) / static_cast<double>(iters)) * 1e6);
  }
  nlohmann::json j;
  j["op"] = a.op;
  j["size"] = a.size;
  j["ranks"] = ranks;
  j["iters"] = iters;
  j["reps_us"] = per_rep;
  j["latency_us"] = median(per_rep);
  return j;
}

}  // namespace bench

namespace bench {
// ferry-bench coll (coll_bench.cpp).
int run_coll(const CollArgs& a);
}  // namespace bench
