// ferry-bspmm: a two-stage block-sparse matrix multiply on ferry's AMT runtime, the NWChem
// proxy of the Daps paper ([Daps] §VI-B1). Each task gets its blocks of A and B from their
// owners with a one-sided get (Runtime::get: the core's RMA over the ferry parcelport, a
// request the owner answers over the MPI ones), multiplies them with DGEMM, and sends the
// product to C's owner, which adds it in (an active message carrying the block). Stage 1 is
// compute-heavy (large blocks), stage 2 communication-heavy (small blocks, many more tasks).
// FERRY_PROGRESS picks who progresses (explicit calls by idle workers, a progress thread,
// stealing): the comparison the paper makes.
//
// A task does not block a worker while its data travels: the two gets' futures continue
// (Future::then) into the multiply, and each rank keeps `--in-flight` tasks going. Each stage
// ends when every C owner has added every product it expects; rank 0 times the stages.
// --verify recomputes every C block serially on its owner (the values are multiples of 1/64,
// so every order of summation gives the same bits: the difference must be zero).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ferry/amt.hpp"
#include "ferry/error.hpp"
#include "ferry/parcel.hpp"
#include "app_main.hpp"
#include "cli.hpp"
#include "matrix.hpp"

#ifdef FERRY_BSPMM_OPENBLAS
extern "C" void openblas_set_num_threads(int);
#endif

using Clock = std::chrono::steady_clock;
using ferry::amt::Blob;

namespace {

std::uint64_t ns_since(Clock::time_point t) {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count());
}

// One stage as this rank holds it.
struct StageData {
  std::unique_ptr<bspmm::Layout> layout;
  std::vector<double> a, b, c;         // this rank's blocks of A and B (exposed), and of C
  ferry::amt::Window wa, wb;
  std::vector<std::mutex> c_locks;     // one per C block of this rank, by slot
  std::atomic<std::size_t> next_task{0};
  std::atomic<std::size_t> added{0};   // products added into this rank's C
  // Counters (this rank): time tasks waited for their blocks, time in DGEMM, gets, bytes.
  std::atomic<std::uint64_t> wait_ns{0}, dgemm_ns{0}, gets{0}, get_bytes{0}, products_sent{0};
};

struct App {
  ferry::amt::Runtime* rt = nullptr;
  int me = 0, ranks = 1;
  std::size_t in_flight = 32;
  StageData stages[2];
  ferry::amt::Action<void, int, int, int, Blob> add{};
  ferry::amt::Action<void, int, std::vector<std::uint64_t>> done{};

  // Rank 0: per stage, the ranks that finished, summed counters and the clock.
  std::atomic<int> reports[2] = {0, 0};
  std::mutex totals_lock;
  std::vector<std::uint64_t> totals[2] = {std::vector<std::uint64_t>(7, 0), std::vector<std::uint64_t>(7, 0)};
  Clock::time_point t0[2], t1[2];
  std::atomic<int> ready_ranks{0};       // rank 0: ranks whose windows are all exposed
  std::atomic<int> finished_stage{-1};  // rank 0: the last stage every rank finished; others: told to stop = 1
  // Stage s's data and windows are ready on this rank. A rank's stages start on rank 0's word
  // ("go"), which rank 0 sends only after this rank said it is ready, after prepare(), and
  // products arrive only after their senders' stage started: the order holds through other
  // processes, where TSan cannot see it. Every handler of a stage from the wire (start, bad,
  // check) acquires this release, so the order is also one within the process.
  std::atomic<bool> prepared[2] = {false, false};

  void prepare(int s, const bspmm::Stage& st) {
    StageData& d = stages[s];
    d.layout = std::make_unique<bspmm::Layout>(st, ranks);
    const bspmm::Layout& l = *d.layout;
    const int n = st.blocks;
    d.a.assign(l.a_doubles(me), 0.0);
    d.b.assign(l.b_doubles(me), 0.0);
    d.c.assign(l.c_doubles(me), 0.0);
    d.c_locks = std::vector<std::mutex>(l.c_doubles(me) / l.block_doubles());
    for (int r = 0; r < n; ++r) {
      for (int c = 0; c < n; ++c) {
        if (l.a(r, c).owner == me) bspmm::fill_block('A', r, c, st.block_size, d.a.data() + l.a(r, c).offset);
        if (l.b(r, c).owner == me) bspmm::fill_block('B', r, c, st.block_size, d.b.data() + l.b(r, c).offset);
      }
    }
    d.wa = rt->expose(d.a.data(), d.a.size() * sizeof(double));
    d.wb = rt->expose(d.b.data(), d.b.size() * sizeof(double));
    prepared[s].store(true, std::memory_order_release);
  }

  // Starts this rank's next task of stage s, if any is left.
  void start_next(int s) {
    StageData& d = stages[s];
    const std::vector<bspmm::Task>& tasks = d.layout->tasks(me);
    const std::size_t t = d.next_task.fetch_add(1, std::memory_order_relaxed);
    if (t >= tasks.size()) return;
    run_task(s, tasks[t]);
  }

  struct TaskState {
    bspmm::Task task;
    std::vector<double> a, b;
    std::atomic<int> waiting{2};
    Clock::time_point started;
  };

  void run_task(int s, const bspmm::Task& task) {
    StageData& d = stages[s];
    const bspmm::Layout& l = *d.layout;
    const std::size_t bd = l.block_doubles();
    auto ts = std::make_shared<TaskState>();
    ts->task = task;
    ts->a.resize(bd);
    ts->b.resize(bd);
    ts->started = Clock::now();
    const bspmm::Place pa = l.a(task.i, task.k), pb = l.b(task.k, task.j);
    const std::size_t bytes = bd * sizeof(double);
    auto ready = [this, s, ts](ferry::amt::Future<void> f) {
      f.get();  // throws a failed rank's ferry::PeerFailed into the task: counted as an error
      if (ts->waiting.fetch_sub(1, std::memory_order_acq_rel) == 1) compute(s, ts);
    };
    for (const auto& [place, win, into] : {std::tuple{pa, d.wa, ts->a.data()}, std::tuple{pb, d.wb, ts->b.data()}}) {
      if (place.owner != me) {
        d.gets.fetch_add(1, std::memory_order_relaxed);
        d.get_bytes.fetch_add(bytes, std::memory_order_relaxed);
      }
      rt->get(place.owner, win, place.offset * sizeof(double), into, bytes).then(ready);
    }
  }

  void compute(int s, const std::shared_ptr<TaskState>& ts) {
    StageData& d = stages[s];
    const bspmm::Layout& l = *d.layout;
    d.wait_ns.fetch_add(ns_since(ts->started), std::memory_order_relaxed);
    const auto t = Clock::now();
    Blob product(l.block_doubles() * sizeof(double));
    auto* c = reinterpret_cast<double*>(product.data());
    std::fill(c, c + l.block_doubles(), 0.0);
    bspmm::multiply_add(l.stage().block_size, ts->a.data(), ts->b.data(), c);
    d.dgemm_ns.fetch_add(ns_since(t), std::memory_order_relaxed);
    const int i = ts->task.i, j = ts->task.j;
    const int owner = l.c_owner(i, j);
    d.products_sent.fetch_add(owner != me ? 1 : 0, std::memory_order_relaxed);
    start_next(s);  // keep --in-flight tasks going
    if (owner == me) {
      on_add(s, i, j, product);
    } else {
      rt->async(owner, add, s, i, j, std::move(product));
    }
  }

  // C's owner: adds one product into block (i, j). Bytes from the wire: checked first.
  bool bad(int s, int i, int j, const Blob& p) const {
    if (s < 0 || s > 1 || !prepared[s].load(std::memory_order_acquire)) return true;
    const bspmm::Layout& l = *stages[s].layout;
    const int n = l.stage().blocks;
    return i < 0 || j < 0 || i >= n || j >= n || l.c_owner(i, j) != me || p.size() != l.block_doubles() * sizeof(double);
  }
  std::atomic<std::uint64_t> bad_messages{0};
  void on_add(int s, int i, int j, const Blob& p) {
    if (bad(s, i, j, p)) {
      bad_messages.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    StageData& d = stages[s];
    const bspmm::Layout& l = *d.layout;
    const std::size_t off = l.c_offset(i, j);
    const auto* src = reinterpret_cast<const double*>(p.data());
    {
      std::lock_guard<std::mutex> g(d.c_locks[off / l.block_doubles()]);
      double* c = d.c.data() + off;
      for (std::size_t e = 0; e < l.block_doubles(); ++e) c[e] += src[e];
    }
    if (d.added.fetch_add(1, std::memory_order_acq_rel) + 1 == l.contributions_to(me)) report(s);
  }

  void start(int s) {  // s: from the wire on every rank but 0
    if (s < 0 || s > 1 || !prepared[s].load(std::memory_order_acquire)) {
      // A stage that cannot start here would leave rank 0 waiting for its report: end the job.
      std::fprintf(stderr, "ferry-bspmm: rank %d: told to start stage %d, which %s\n", me, s,
                   s < 0 || s > 1 ? "does not exist (stages are 0 and 1)" : "this rank has not prepared");
      std::fflush(stderr);
      std::_Exit(1);
    }
    StageData& d = stages[s];
    if (d.layout->contributions_to(me) == 0) report(s);
    const std::size_t first = std::min(in_flight, d.layout->tasks(me).size());
    for (std::size_t t = 0; t < first; ++t) rt->spawn([this, s] { start_next(s); });
  }

  std::vector<std::uint64_t> counters(int s) const {
    const StageData& d = stages[s];
    return {d.wait_ns.load(), d.dgemm_ns.load(), d.gets.load(), d.get_bytes.load(), d.products_sent.load(),
            bad_messages.load() + rt->errors(), rt->progress_calls()};
  }
  void report(int s) {
    if (me == 0) on_done(s, counters(s));
    else rt->async(0, done, s, counters(s));
  }
  void on_done(int s, const std::vector<std::uint64_t>& c) {  // s and c: from the wire
    if (s < 0 || s > 1) {
      bad_messages.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    {
      std::lock_guard<std::mutex> g(totals_lock);
      for (std::size_t i = 0; i < totals[s].size() && i < c.size(); ++i) totals[s][i] += c[i];
    }
    if (reports[s].fetch_add(1, std::memory_order_acq_rel) + 1 == ranks) {
      t1[s] = Clock::now();
      finished_stage.store(s, std::memory_order_release);
      finished_stage.notify_all();
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  bspmm::Stage st[2];
  bspmm::default_stages(st);
  std::int64_t threads = 0, in_flight = 32;
  std::string parcelport = ferry::amt::option_table().resolve().settings.parcelport;
  bool json = false, verify = false, inline_tasks = false;
  CLI::App app{"ferry-bspmm: a two-stage block-sparse matrix multiply on ferry's AMT runtime ([Daps] §VI-B1)", "ferry-bspmm"};
  bspmm::add_stage_options(app, st);
  app.add_option("--threads", threads, "worker threads per rank (0: FERRY_AMT_THREADS, else 1)");
  app.add_option("--in-flight", in_flight, "tasks each rank keeps going at once (1 to 65536)");
  app.add_option("--parcelport", parcelport, "ferry, mpi, mpi_a, mpix (default: FERRY_PARCELPORT, else ferry)");
  app.add_flag("--inline-tasks", inline_tasks, "run arriving calls on the worker that polled them (amt::Options::inline_calls)");
  app.add_flag("--verify", verify, "every C owner recomputes its blocks serially; exit 1 unless the difference is zero");
  app.add_flag("--json", json, "one JSON object (rank 0)");
  if (const int rc = apps::parse(app, argc, argv, "ferry-bspmm",
                                 [&] {
                                   bspmm::check_stages(st);
                                   apps::check_range("--threads", threads, 0, 4096);
                                   apps::check_range("--in-flight", in_flight, 1, 65536);
                                 });
      rc >= 0) {
    return rc;
  }
  if (const int rc = apps::check_parcelport("ferry-bspmm", parcelport); rc >= 0) return rc;
#ifdef FERRY_BSPMM_OPENBLAS
  openblas_set_num_threads(1);  // the runtime's workers are the parallelism
#endif

  ferry::amt::Options opt;
  opt.parcelport = parcelport;
  opt.threads = static_cast<int>(threads);
  opt.inline_calls = inline_tasks;
  static App a;  // static: outlives every task, and the windows' memory outlives the runtime
  try {
    ferry::amt::Runtime rt(opt);
    a.rt = &rt;
    a.me = rt.rank();
    a.ranks = rt.size();
    a.in_flight = static_cast<std::size_t>(in_flight);
    a.add = rt.action("bspmm.add", [](int s, int i, int j, Blob p) { a.on_add(s, i, j, p); });
    a.done = rt.action("bspmm.done", [](int s, std::vector<std::uint64_t> c) { a.on_done(s, c); });
    auto go = rt.action("bspmm.go", [](int s) { a.start(s); });
    auto stop = rt.action("bspmm.stop", []() {
      a.finished_stage.store(1, std::memory_order_release);
      a.finished_stage.notify_all();
    });
    auto ready = rt.action("bspmm.ready", []() { a.ready_ranks.fetch_add(1, std::memory_order_acq_rel); });
    auto check = rt.action("bspmm.check", [](int s) {
      if (s < 0 || s > 1 || !a.prepared[s].load(std::memory_order_acquire)) {  // s: from the wire
        a.bad_messages.fetch_add(1, std::memory_order_relaxed);
        return std::vector<double>{};  // rank 0 takes a reply without two values as a failed check
      }
      const StageData& d = a.stages[s];
      const bspmm::Check c = bspmm::check_rank(*d.layout, a.me, d.c.data());
      return std::vector<double>{c.diff2, c.ref2};
    });
    for (int s = 0; s < 2; ++s) a.prepare(s, st[s]);  // collective (expose), before the clock
    // expose helps (runs tasks) while it waits, so a rank can still be inside it when another
    // has returned: no stage starts before every rank has said it is out.
    if (a.me != 0) rt.async(0, ready);

    std::vector<double> diff2(2, 0.0), ref2(2, 0.0);
    if (a.me == 0) {
      while (a.ready_ranks.load(std::memory_order_acquire) < a.ranks - 1) rt.help();
      for (int s = 0; s < 2; ++s) {
        a.t0[s] = Clock::now();
        for (int r = 1; r < a.ranks; ++r) rt.async(r, go, s);
        a.start(s);
        for (int seen = a.finished_stage.load(std::memory_order_acquire); seen < s;
             seen = a.finished_stage.load(std::memory_order_acquire)) {
          a.finished_stage.wait(seen, std::memory_order_acquire);
        }
      }
      if (verify) {
        for (int s = 0; s < 2; ++s) {
          for (int r = 0; r < a.ranks; ++r) {
            std::vector<double> c;
            if (r == 0) {
              const bspmm::Check k = bspmm::check_rank(*a.stages[s].layout, 0, a.stages[s].c.data());
              c = {k.diff2, k.ref2};
            } else {
              c = rt.async_future(r, check, s).get();
            }
            if (c.size() == 2) {
              diff2[static_cast<std::size_t>(s)] += c[0], ref2[static_cast<std::size_t>(s)] += c[1];
            } else {
              diff2[static_cast<std::size_t>(s)] = std::numeric_limits<double>::infinity();  // not checked
            }
          }
        }
      }
      for (int r = 1; r < a.ranks; ++r) rt.async(r, stop);
    } else {
      for (int seen = a.finished_stage.load(std::memory_order_acquire); seen < 1;
           seen = a.finished_stage.load(std::memory_order_acquire)) {
        a.finished_stage.wait(seen, std::memory_order_acquire);
      }
    }
    rt.finalize();
    if (a.me != 0) return 0;

    const std::uint64_t errors = a.totals[0][5] + a.totals[1][5];
    const bool verified = diff2[0] == 0.0 && diff2[1] == 0.0;
    const char* progress = std::getenv("FERRY_PROGRESS");
    nlohmann::json stages = nlohmann::json::array();
    double total_s = 0;
    for (int s = 0; s < 2; ++s) {
      const bspmm::Layout& l = *a.stages[s].layout;
      const double t = std::chrono::duration<double>(a.t1[s] - a.t0[s]).count();
      total_s += t;
      const auto& c = a.totals[s];
      stages.push_back({{"stage", s + 1},
                        {"blocks", l.stage().blocks},
                        {"block_size", l.stage().block_size},
                        {"density", l.stage().density},
                        {"tasks", l.total_tasks()},
                        {"time_s", t},
                        {"gflops", l.flops() / t * 1e-9},
                        {"wait_s", static_cast<double>(c[0]) * 1e-9},  // summed over tasks and ranks
                        {"dgemm_s", static_cast<double>(c[1]) * 1e-9},
                        {"gets", c[2]},
                        {"get_bytes", c[3]},
                        {"accumulates", c[4]},
                        {"progress_calls", s == 0 ? c[6] : c[6] - a.totals[0][6]},  // in this stage, all ranks
                        {"rel_error", verify ? std::sqrt(diff2[static_cast<std::size_t>(s)] / std::max(ref2[static_cast<std::size_t>(s)], 1e-300))
                                             : -1.0}});
    }
    if (json) {
      nlohmann::json j = {{"app", "bspmm"},
                          {"parcelport", rt.parcelport()},
                          {"transport", rt.transport()},
                          {"one_sided_get", rt.has_one_sided_get()},
                          {"progress", rt.parcelport() == "ferry" ? (progress != nullptr ? progress : "explicit") : "mpi"},
                          {"ranks", a.ranks},
                          {"threads", rt.threads()},
                          {"in_flight", in_flight},
                          {"blas", bspmm::blas_name()},
                          {"time_s", total_s},
                          {"stages", stages},
                          {"verified", verify ? nlohmann::json(verified) : nlohmann::json(nullptr)},
                          {"errors", errors}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("bspmm %s%s: %d ranks x %d threads: stage 1 %.4f s (%.2f GFLOP/s), stage 2 %.4f s (%.2f GFLOP/s)%s, %llu errors\n",
                  rt.parcelport().c_str(), rt.has_one_sided_get() ? " (one-sided get)" : "", a.ranks, rt.threads(),
                  stages[0]["time_s"].get<double>(), stages[0]["gflops"].get<double>(), stages[1]["time_s"].get<double>(),
                  stages[1]["gflops"].get<double>(), verify ? (verified ? ", verified" : ", WRONG") : "",
                  static_cast<unsigned long long>(errors));
    }
    if (verify && !verified) {
      std::fprintf(stderr, "ferry-bspmm: C differs from the serial product: |diff|^2 = %g (stage 1), %g (stage 2)\n", diff2[0], diff2[1]);
    }
    std::fflush(stdout);
    return errors == 0 && (!verify || verified) ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-bspmm: error: %s\n", e.what());
    return 1;
  }
}
