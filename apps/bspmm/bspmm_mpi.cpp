// ferry-bspmm-mpi: the two-stage block-sparse multiply with MPI-3 RMA, the baseline of
// [Daps] §VI-B1: one process per core, one thread each. Every stage exposes each rank's blocks
// of A, B and C in windows (MPI_Win_allocate) and opens a passive-target epoch on each
// (MPI_Win_lock_all). Each task gets its two blocks (MPI_Get, then MPI_Win_flush_local),
// multiplies them (DGEMM) and adds the product into C's owner (MPI_Accumulate with MPI_SUM,
// atomic per element against the other ranks' accumulates). The same layout, tasks and check
// as ferry-bspmm (matrix.hpp), so the two report comparable stage times.
//
// Progress: MPI's. A get from a rank that is computing waits until that rank enters MPI,
// unless the library's progress thread runs (MPICH: MPIR_CVAR_ASYNC_PROGRESS=1, which needs
// MPI_THREAD_MULTIPLE: this program asks for it when the variable is set) or the transport
// reads the memory itself.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "matrix.hpp"

extern "C" void openblas_set_num_threads(int);

using Clock = std::chrono::steady_clock;

namespace {

constexpr int exit_usage = 2;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Totals {
  double wait_s = 0, dgemm_s = 0, gets = 0, get_bytes = 0, accumulates = 0;
};

// One stage; returns its time (the slowest rank's, from the barrier before to the one after).
double run_stage(const bspmm::Layout& l, int me, Totals& t, bool verify, bspmm::Check& check) {
  const std::size_t bd = l.block_doubles();
  const int n = l.stage().blocks, s = l.stage().block_size;
  double *a = nullptr, *b = nullptr, *c = nullptr;
  MPI_Win wa, wb, wc;
  // Windows of at least one element: MPI_Win_allocate gives a null base for size 0.
  MPI_Win_allocate(static_cast<MPI_Aint>(std::max<std::size_t>(1, l.a_doubles(me)) * sizeof(double)), sizeof(double),
                   MPI_INFO_NULL, MPI_COMM_WORLD, &a, &wa);
  MPI_Win_allocate(static_cast<MPI_Aint>(std::max<std::size_t>(1, l.b_doubles(me)) * sizeof(double)), sizeof(double),
                   MPI_INFO_NULL, MPI_COMM_WORLD, &b, &wb);
  MPI_Win_allocate(static_cast<MPI_Aint>(std::max<std::size_t>(1, l.c_doubles(me)) * sizeof(double)), sizeof(double),
                   MPI_INFO_NULL, MPI_COMM_WORLD, &c, &wc);
  for (int r = 0; r < n; ++r) {
    for (int col = 0; col < n; ++col) {
      if (l.a(r, col).owner == me) bspmm::fill_block('A', r, col, s, a + l.a(r, col).offset);
      if (l.b(r, col).owner == me) bspmm::fill_block('B', r, col, s, b + l.b(r, col).offset);
    }
  }
  std::fill(c, c + l.c_doubles(me), 0.0);
  MPI_Win_lock_all(0, wa);
  MPI_Win_lock_all(0, wb);
  MPI_Win_lock_all(0, wc);
  std::vector<double> ba(bd), bb(bd), prod(bd);
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = Clock::now();
  for (const bspmm::Task& task : l.tasks(me)) {
    const auto w0 = Clock::now();
    const bspmm::Place pa = l.a(task.i, task.k), pb = l.b(task.k, task.j);
    for (const auto& [p, win, into, local] : {std::tuple{pa, wa, ba.data(), a}, std::tuple{pb, wb, bb.data(), b}}) {
      if (p.owner == me) {
        std::memcpy(into, local + p.offset, bd * sizeof(double));
        continue;
      }
      MPI_Get(into, static_cast<int>(bd), MPI_DOUBLE, p.owner, static_cast<MPI_Aint>(p.offset), static_cast<int>(bd), MPI_DOUBLE, win);
      t.gets += 1;
      t.get_bytes += static_cast<double>(bd * sizeof(double));
    }
    if (pa.owner != me) MPI_Win_flush_local(pa.owner, wa);
    if (pb.owner != me) MPI_Win_flush_local(pb.owner, wb);
    t.wait_s += seconds_since(w0);
    const auto d0 = Clock::now();
    std::fill(prod.begin(), prod.end(), 0.0);
    bspmm::multiply_add(s, ba.data(), bb.data(), prod.data());
    t.dgemm_s += seconds_since(d0);
    const int owner = l.c_owner(task.i, task.j);
    MPI_Accumulate(prod.data(), static_cast<int>(bd), MPI_DOUBLE, owner, static_cast<MPI_Aint>(l.c_offset(task.i, task.j)),
                   static_cast<int>(bd), MPI_DOUBLE, MPI_SUM, wc);
    MPI_Win_flush_local(owner, wc);  // prod is reused by the next task
    if (owner != me) t.accumulates += 1;
  }
  MPI_Win_flush_all(wc);
  MPI_Barrier(MPI_COMM_WORLD);
  const double local_s = seconds_since(t0);
  double time_s = 0;
  MPI_Reduce(&local_s, &time_s, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  MPI_Win_unlock_all(wc);
  MPI_Win_unlock_all(wb);
  MPI_Win_unlock_all(wa);
  MPI_Barrier(MPI_COMM_WORLD);  // every accumulate into this rank's C is complete
  if (verify) check = bspmm::check_rank(l, me, c);
  MPI_Win_free(&wc);
  MPI_Win_free(&wb);
  MPI_Win_free(&wa);
  return time_s;
}

}  // namespace

int main(int argc, char** argv) {
  bspmm::Stage st[2];
  bspmm::default_stages(st);
  bool json = false, verify = false;
  CLI::App app{"ferry-bspmm-mpi: the two-stage block-sparse multiply with MPI-3 RMA (the baseline of ferry-bspmm)",
               "ferry-bspmm-mpi"};
  bspmm::add_stage_options(app, st);
  app.add_flag("--verify", verify, "every C owner recomputes its blocks serially; exit 1 unless the difference is zero");
  app.add_flag("--json", json, "one JSON object (rank 0)");
  try {
    app.parse(argc, argv);
    bspmm::check_stages(st);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "ferry-bspmm-mpi: error: %s\nRun with --help for usage.\n", e.what());
    return exit_usage;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "ferry-bspmm-mpi: error: %s\n", e.what());
    return exit_usage;
  }
  const char* async = std::getenv("MPIR_CVAR_ASYNC_PROGRESS");
  const bool async_progress = async != nullptr && std::strcmp(async, "1") == 0;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, async_progress ? MPI_THREAD_MULTIPLE : MPI_THREAD_SINGLE, &provided);
  openblas_set_num_threads(1);
  int me = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);

  nlohmann::json stages = nlohmann::json::array();
  double total_s = 0;
  bool verified = true;
  for (int s = 0; s < 2; ++s) {
    const bspmm::Layout l(st[s], ranks);
    Totals t;
    bspmm::Check check;
    const double time_s = run_stage(l, me, t, verify, check);
    double mine[7] = {t.wait_s, t.dgemm_s, t.gets, t.get_bytes, t.accumulates, check.diff2, check.ref2};
    double sum[7] = {};
    MPI_Reduce(mine, sum, 7, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    total_s += time_s;
    if (sum[5] != 0.0) verified = false;
    stages.push_back({{"stage", s + 1},
                      {"blocks", st[s].blocks},
                      {"block_size", st[s].block_size},
                      {"density", st[s].density},
                      {"tasks", l.total_tasks()},
                      {"time_s", time_s},
                      {"gflops", l.flops() / time_s * 1e-9},
                      {"wait_s", sum[0]},
                      {"dgemm_s", sum[1]},
                      {"gets", static_cast<std::uint64_t>(sum[2])},
                      {"get_bytes", static_cast<std::uint64_t>(sum[3])},
                      {"accumulates", static_cast<std::uint64_t>(sum[4])},
                      {"progress_calls", nullptr},  // MPI's progress runs inside its calls: not counted
                      {"rel_error", verify ? std::sqrt(sum[5] / std::max(sum[6], 1e-300)) : -1.0}});
  }
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(version, &len);
  std::string lib(version, static_cast<std::size_t>(len));
  lib = lib.substr(0, lib.find('\n'));
  int rc = verify && !verified ? 1 : 0;
  if (me == 0) {
    if (json) {
      nlohmann::json j = {{"app", "bspmm"},
                          {"parcelport", "mpi_rma"},
                          {"transport", lib},
                          {"one_sided_get", true},
                          {"progress", async_progress ? "mpi_async_thread" : "mpi"},
                          {"ranks", ranks},
                          {"threads", 1},
                          {"in_flight", 1},
                          {"blas", bspmm::blas_name()},
                          {"time_s", total_s},
                          {"stages", stages},
                          {"verified", verify ? nlohmann::json(verified) : nlohmann::json(nullptr)},
                          {"errors", 0}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("bspmm mpi_rma%s: %d ranks: stage 1 %.4f s (%.2f GFLOP/s), stage 2 %.4f s (%.2f GFLOP/s)%s\n",
                  async_progress ? " (async progress thread)" : "", ranks, stages[0]["time_s"].get<double>(),
                  stages[0]["gflops"].get<double>(), stages[1]["time_s"].get<double>(), stages[1]["gflops"].get<double>(),
                  verify ? (verified ? ", verified" : ", WRONG") : "");
    }
    if (verify && !verified) std::fprintf(stderr, "ferry-bspmm-mpi: C differs from the serial product\n");
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return rc;
}
