// atomic_bench.cpp — ferry-bench atomic, as atomic_bench.hpp says.
#include "atomic_bench.hpp"

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "ferry/ferry.hpp"

namespace bench {

int run_atomic(const AtomicBenchArgs& a) {
  ferry::Runtime rt;
  if (rt.size() < 2) throw ferry::Error("atomic: needs 2 ranks (rank 0 works on rank 1's memory)");
  ferry::Device& dev = rt.device();
  alignas(64) std::uint64_t word = 0;
  ferry::MemoryRegion region = a.memory == "allocated" ? dev.allocate_memory(sizeof word) : dev.register_memory(&word, sizeof word);
  const ferry::RemoteKey mine = region.remote_key();
  rt.kv_put("atomic", std::string(reinterpret_cast<const char*>(&mine), sizeof mine));
  rt.kv_fence();
  ferry::RemoteKey target;
  const std::string bytes = rt.kv_get(1, "atomic");
  std::memcpy(&target, bytes.data(), sizeof target);

  ferry::AtomicOp op = ferry::AtomicOp::fetch_add;
  if (a.op == "cswap") op = ferry::AtomicOp::compare_swap;
  if (a.op == "swap") op = ferry::AtomicOp::swap;
  if (a.op == "add") op = ferry::AtomicOp::add;
  std::vector<std::uint64_t> results(static_cast<std::size_t>(a.window));
  ferry::CompletionQueue cq;
  // Posts atomic i (retrying as progress frees packets); true when it is done already.
  const auto post = [&](long i, std::uint64_t* result) {
    for (;;) {
      const ferry::Status st = dev.post_atomic({.rank = 1, .remote = target, .op = op, .type = ferry::DataType::u64, .operand = 1,
                                                .compare = static_cast<std::uint64_t>(i), .result = result, .local = &cq});
      if (st.is_failed()) throw ferry::PeerFailed(st.rank, "atomic: rank 1 failed");
      if (!st.is_retry()) return st.is_done();
      dev.progress();
    }
  };
  const auto drain = [&](long& ended) {
    while (auto c = cq.pop()) {
      if (c->error != 0) throw ferry::Error("atomic: " + c->error_string());
      ++ended;
    }
  };
  std::vector<double> latency, rate;
  bool direct = false;
  if (rt.rank() == 0) {
    const auto run = [&](int window) {
      long posted = 0, ended = 0;
      while (ended < a.iters) {
        while (posted < a.iters && posted - ended < window) {
          if (post(posted, &results[static_cast<std::size_t>(posted % window)])) ++ended;
          ++posted;
        }
        dev.progress();
        drain(ended);
      }
    };
    direct = post(0, &results[0]);
    run(1);  // warm-up
    for (int r = 0; r < a.reps; ++r) {
      auto start = Clock::now();
      run(1);
      latency.push_back(seconds_since(start) / static_cast<double>(a.iters) * 1e6);
      start = Clock::now();
      run(a.window);
      rate.push_back(static_cast<double>(a.iters) / seconds_since(start));
    }
  }
  // Rank 1 (and any other) serves the requests until rank 0 is done: the barrier progresses.
  rt.barrier();
  if (rt.rank() == 0) {
    nlohmann::json j;
    j["op"] = a.op;
    j["ranks"] = rt.size();
    j["iters"] = a.iters;
    j["window"] = a.window;
    j["memory"] = a.memory;
    // The path: a CPU atomic on this process's mapping when the first post was done at once.
    j["path"] = direct ? "mapped" : "message";
    j["latency_us"] = median(latency);
    j["ops_per_s"] = median(rate);
    j["reps_latency_us"] = latency;
    j["transport"] = rt.transport_of(1);
    j["impl"] = "ferry";
    if (a.json) {
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%s (%s, %s): %.3f us, %.3f M/s with %d in flight\n", a.op.c_str(), rt.transport_of(1).c_str(), direct ? "mapped" : "message", median(latency),
                  median(rate) / 1e6, a.window);
    }
  }
  rt.finalize();
  return 0;
}

}  // namespace bench
