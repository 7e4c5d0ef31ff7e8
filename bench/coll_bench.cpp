// coll_bench.cpp — ferry-bench coll: one collective on the world team, timed as
// coll_bench.hpp says; prints the median time per operation, the algorithm and the transport.
#include <algorithm>
#include <cstdio>
#include <thread>
#include <string>
#include <vector>

#include "coll_bench.hpp"
#include "ferry/ferry.hpp"

namespace bench {

namespace {

// The algorithm ferry's choice takes for `op` of `size` bytes on n ranks (src/coll/team.cpp's
// rule, from the options in force).
const char* algorithm_of(const std::string& op, std::size_t size, int n, const ferry::RuntimeSettings& o) {
  const bool power_of_two = (n & (n - 1)) == 0;
  const std::size_t bytes = op == "bcast" || op == "allgather" ? size : coll_count(size) * sizeof(double);
  if (op == "barrier") return "dissemination";
  if (op == "reduce") return "binomial";
  if (op == "reduce_scatter") return "ring";
  if (op == "bcast") {
    const bool scatter = o.coll_bcast == ferry::BcastAlgorithm::scatter_allgather ||
                         (o.coll_bcast == ferry::BcastAlgorithm::automatic && bytes >= o.coll_large && n >= 3);
    return scatter ? "scatter_allgather" : "binomial";
  }
  if (op == "allreduce") {
    const bool ring = (o.coll_allreduce == ferry::AllreduceAlgorithm::ring ||
                       (o.coll_allreduce == ferry::AllreduceAlgorithm::automatic && bytes >= o.coll_large)) &&
                      n >= 3;
    return ring ? "ring" : "recursive_doubling";
  }
  if (op == "allgather") {
    const bool ring = o.coll_allgather == ferry::AllgatherAlgorithm::ring ||
                      (o.coll_allgather == ferry::AllgatherAlgorithm::automatic && bytes >= o.coll_large);
    return power_of_two && !ring ? "recursive_doubling" : "ring";
  }
  return "direct";
}

}  // namespace

int run_coll(const CollArgs& a) {
  ferry::Runtime rt;
  ferry::Team world = ferry::Team::world(rt);
  ferry::Device& dev = rt.device();
  const int n = rt.size();
  const std::size_t count = coll_count(a.size);
  const auto nz = static_cast<std::size_t>(n);
  std::vector<unsigned char> send, recv;
  if (a.op == "bcast") {
    send.resize(a.size);
  } else if (a.op == "reduce" || a.op == "allreduce") {
    send.resize(count * sizeof(double));
    recv.resize(count * sizeof(double));
  } else if (a.op == "reduce_scatter") {
    send.resize(count * sizeof(double) * nz);
    recv.resize(count * sizeof(double));
  } else if (a.op == "allgather") {
    send.resize(a.size);
    recv.resize(a.size * nz);
  } else if (a.op == "alltoall") {
    send.resize(a.size * nz);
    recv.resize(a.size * nz);
  }
  const bool yield = static_cast<unsigned>(n) > std::max(1u, std::thread::hardware_concurrency());
  ferry::Synchronizer sync;
  const auto finish = [&](ferry::Status st) {
    if (st.is_failed()) throw ferry::PeerFailed(st.rank, "coll: rank " + std::to_string(st.rank) + " failed");
    if (st.is_done()) return;
    // With more ranks than cores a rank that waits gives its core to the one it waits for
    // after 32 empty polls in a row (ferry's own waits, Runtime::barrier and Team's, do so).
    int idle = 0;
    while (!sync.test()) {
      if (dev.progress()) {
        idle = 0;
      } else if (yield && ++idle >= 32) {
        std::this_thread::yield();
        idle = 0;
      }
    }
    if (sync.results()[0].error != 0) throw ferry::Error("coll: " + sync.results()[0].error_string());
  };
  const auto op = [&] {
    sync.reset();
    using ferry::DataType;
    using ferry::ReduceOp;
    ferry::Status st;
    if (a.op == "barrier") {
      st = world.post_barrier({.local = &sync});
    } else if (a.op == "bcast") {
      st = world.post_broadcast({.buffer = send.data(), .size = a.size, .root = 0, .local = &sync});
    } else if (a.op == "reduce") {
      st = world.post_reduce({.send = send.data(), .recv = recv.data(), .count = count, .type = DataType::f64,
                              .op = ReduceOp::sum, .root = 0, .local = &sync});
    } else if (a.op == "allreduce") {
      st = world.post_allreduce({.send = send.data(), .recv = recv.data(), .count = count, .type = DataType::f64,
                                 .op = ReduceOp::sum, .local = &sync});
    } else if (a.op == "reduce_scatter") {
      st = world.post_reduce_scatter({.send = send.data(), .recv = recv.data(), .count = count, .type = DataType::f64,
                                      .op = ReduceOp::sum, .local = &sync});
    } else if (a.op == "allgather") {
      st = world.post_allgather({.send = send.data(), .size = a.size, .recv = recv.data(), .local = &sync});
    } else {
      st = world.post_alltoall({.send = send.data(), .recv = recv.data(), .size = a.size, .local = &sync});
    }
    finish(st);
  };
  nlohmann::json j = time_coll(
      a, n, op, [&] { world.barrier(); },
      [&](double x) {
        double m = 0;
        world.allreduce(&x, &m, 1, ferry::DataType::f64, ferry::ReduceOp::max);
        return m;
      });
  j["algorithm"] = algorithm_of(a.op, a.size, n, rt.options().settings);
  j["transport"] = rt.transport();
  j["impl"] = "ferry";
  j["yield"] = yield;
  if (rt.rank() == 0) {
    if (a.json) {
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%s %zu B, %d ranks (%s, %s): %.3f us\n", a.op.c_str(), a.size, n, j["algorithm"].get<std::string>().c_str(),
                  rt.transport().c_str(), j["latency_us"].get<double>());
    }
  }
  rt.finalize();
  return 0;
}

}  // namespace bench
