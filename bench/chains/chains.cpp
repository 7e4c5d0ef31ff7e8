// ferry-chains: the task-chain micro-benchmark of ferry's AMT runtime (message rate and latency
// of parcels between two ranks), after the HPX micro-benchmarks of [AMT-LCI] §4.2.1.
//
// A chain is a sequence of nsteps hops alternating between rank 0 and rank 1; each hop
// is one async() carrying an nbytes Blob, which the receiving task forwards to the other
// rank (the Blob received zero-copy is passed on as it is: no copy, no new allocation).
//   flood   (message rate): nsteps = 1, very many chains — every chain is one parcel;
//   latency (ping-pong-like): many steps, few chains — time per hop with `nchains` in flight.
// With --task-us U every hop's task first computes for U microseconds: workers are busy when
// parcels arrive, which is what the device-polling and progress-stealing policies ([MPI-AMT]
// §5.2, [Daps]) are about. --task-mode spin (the default) busy-spins, as real computation
// does; --task-mode sleep sleeps instead, which stands for computation on a core of the task's
// own: on a machine with fewer cores than workers a spinning task takes the core an idle
// worker would need to notice a parcel, so the attentiveness effect is hidden by the scheduler.
//
// Termination needs no global protocol: each rank knows how many chains end on it (the
// parity of nsteps decides), counts them, and when all have ended tells rank 0 with one
// async. Rank 0 stops the clock when both ranks have reported.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ferry/amt.hpp"
#include "ferry/error.hpp"
#include "ferry/parcel.hpp"
#ifdef FERRY_HAVE_PARCEL_MPI
#include "ferry/parcel_mpi.hpp"
#endif

using ferry::amt::Blob;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int exit_usage = 2;  // a command line that can never work; scripts tell it from a failed run (1)

struct Args {
  std::int64_t nchains = 1000;
  std::int64_t nsteps = 100;
  std::int64_t nbytes = 8;
  std::int64_t threads = 0;  // 0: the runtime's default (FERRY_AMT_THREADS, else 1)
  std::int64_t batch_size = 64;
  std::int64_t devices = 0;
  std::int64_t warmup = 16;
  std::int64_t task_us = 0;
  std::string task_mode = "spin";
  std::string task_dist = "fixed";
  bool single_source = false;
  bool pin = false;
  bool inline_tasks = false;
  bool json = false;
  std::string parcelport;
};

// CLI11's Range says "not in range" for "abc" too; this names which of the two went wrong.
CLI::Validator integer_in(std::int64_t lo, std::int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        std::size_t used = 0;
        long long v = 0;
        try {
          v = std::stoll(text, &used, 10);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size()) return "'" + text + "' is not an integer";
        if (v < lo || v > hi) {
          return text + " is out of range (allowed: " + std::to_string(lo) + " to " + std::to_string(hi) + ")";
        }
        return {};
      },
      "INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", "integer_in");
}

// Before the runtime exists the rank is unknown; every launcher ferry supports sets one of these,
// so argument errors can be printed once (by rank 0) instead of once per process.
bool is_rank_zero_by_env() {
  for (const char* name : {"PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return std::strcmp(v, "0") == 0;
  }
  return true;
}

// Keeps the worker's core busy for `us` microseconds, as a compute task would. Not a sleep: a
// sleeping worker would let the OS run another worker (or the progress thread) in its place,
// and the busy worker would not look busy to the core or to the steal policy's owner counts.
void compute_for(std::int64_t us, bool sleep) {
  if (us <= 0) return;
  if (sleep) {
    std::this_thread::sleep_for(std::chrono::microseconds(us));
    return;
  }
  const auto until = Clock::now() + std::chrono::microseconds(us);
  while (Clock::now() < until) {
  }
}

// How long the task of hop `left` of `chain` computes. fixed: `mean`. exp: exponentially
// distributed with that mean (capped at 20x), as irregular AMT tasks are; drawn from a hash of
// (chain, left), so every run and every parcelport gets the same durations. With fixed tasks the
// chains fall into lock step and never meet on a busy worker; irregular ones keep meeting there.
std::int64_t task_length(std::int64_t mean, bool exponential, std::uint64_t chain, std::uint32_t left) {
  if (!exponential || mean <= 0) return mean;
  std::uint64_t x = (chain * 0x9E3779B97F4A7C15ull) ^ (std::uint64_t{left} * 0xC2B2AE3D27D4EB4Full);
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  const double u = (static_cast<double>(x >> 11) + 1.0) / 9007199254740993.0;  // (0, 1]
  const double length = std::min(-std::log(u), 20.0) * static_cast<double>(mean);
  return static_cast<std::int64_t>(length + 0.5);
}

// Cheap integrity check: the first and last byte of a chain's payload are a function of the
// chain id, stamped when the chain starts and checked where it ends (after nsteps transfers).
std::uint8_t tag(std::uint64_t chain, int which) {
  const std::uint64_t x = (chain + 1) * 0x9E3779B97F4A7C15ull;
  return static_cast<std::uint8_t>(x >> (which == 0 ? 56 : 40));
}

void stamp(Blob& b, std::uint64_t chain) {
  if (b.size() == 0) return;
  b.data()[0] = static_cast<std::byte>(tag(chain, 0));
  if (b.size() > 1) b.data()[b.size() - 1] = static_cast<std::byte>(tag(chain, 1));
}

bool intact(const Blob& b, std::uint64_t chain, std::size_t nbytes) {
  if (b.size() != nbytes) return false;
  if (nbytes == 0) return true;
  if (b.data()[0] != static_cast<std::byte>(tag(chain, 0))) return false;
  return nbytes == 1 || b.data()[nbytes - 1] == static_cast<std::byte>(tag(chain, 1));
}

// Everything the actions touch; one per process, alive until main returns (after finalize).
struct Bench {
  ferry::amt::Runtime* rt = nullptr;
  int me = 0, peer = 1;
  std::uint64_t nchains = 0, nsteps = 0, nbytes = 0, batch = 1;
  std::int64_t task_us = 0;  // compute per hop task
  bool task_sleeps = false;  // --task-mode sleep
  bool task_exp = false;     // --task-dist exp
  std::uint64_t first_on_1 = 0;  // chains [0, first_on_1) start on rank 0, the rest on 1
  std::uint64_t ends_here = 0;

  ferry::amt::Action<void, std::uint64_t, std::uint32_t, Blob> hop{};
  ferry::amt::Action<void, std::uint64_t> done{};

  std::atomic<std::uint64_t> ended{0};
  std::atomic<std::uint64_t> payload_errors{0};
  std::atomic<int> reports{0};             // rank 0: ranks whose chains have all ended
  std::atomic<std::uint64_t> remote_errors{0};
  Clock::time_point t0, t1;
  std::atomic<bool> finished{false};       // rank 0: both reported; rank 1: told to stop

  int start_of(std::uint64_t chain) const { return chain < first_on_1 ? 0 : 1; }
  int end_of(std::uint64_t chain) const { return nsteps % 2 == 1 ? 1 - start_of(chain) : start_of(chain); }

  void finish() {
    finished.store(true, std::memory_order_release);
    finished.notify_all();
  }

  // Rank 0 only: one rank's chains have all ended.
  void report(std::uint64_t errors) {
    remote_errors.fetch_add(errors, std::memory_order_relaxed);
    if (reports.fetch_add(1, std::memory_order_acq_rel) + 1 == 2) {
      // Stopped here, in the task that saw the last report, not when main wakes up.
      t1 = Clock::now();
      finish();
    }
  }

  // This rank's chains have all ended (called exactly once).
  void local_done() {
    if (me == 0) {
      report(0);  // rank 0's payload errors are read directly at the end
    } else {
      // Rank 1 keeps forwarding chains that end on 0 until rank 0 says stop.
      rt->async(0, done, payload_errors.load(std::memory_order_relaxed) + rt->errors());
    }
  }

  void chain_ended(std::uint64_t chain, const Blob& b) {
    if (chain >= nchains || end_of(chain) != me || !intact(b, chain, nbytes)) {
      payload_errors.fetch_add(1, std::memory_order_relaxed);
    }
    if (ended.fetch_add(1, std::memory_order_acq_rel) + 1 == ends_here) local_done();
  }

  void start_chains(std::uint64_t lo, std::uint64_t hi) {
    const auto left = static_cast<std::uint32_t>(nsteps - 1);
    for (std::uint64_t c = lo; c < hi; ++c) {
      Blob b(nbytes);
      stamp(b, c);
      rt->async(peer, hop, c, left, std::move(b));
    }
  }

  // Spawns this rank's chain starts as tasks of `batch` chains each, so every worker sends.
  void start() {
    const std::uint64_t lo = me == 0 ? 0 : first_on_1;
    const std::uint64_t hi = me == 0 ? first_on_1 : nchains;
    if (ends_here == 0) local_done();
    for (std::uint64_t s = lo; s < hi; s += batch) {
      const std::uint64_t e = std::min(hi, s + batch);
      rt->spawn([this, s, e] { start_chains(s, e); });
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  Args a;
  a.parcelport = ferry::amt::option_table().resolve().settings.parcelport;

  CLI::App app{"ferry-chains: task-chain message rate / latency between two ranks ([AMT-LCI] §4.2.1)",
               "ferry-chains"};
  app.add_option("--nchains", a.nchains, "chains in flight (flood: very many)")->check(integer_in(1, 1ll << 32));
  app.add_option("--nsteps", a.nsteps, "hops per chain (flood: 1; latency: many)")->check(integer_in(1, 0xffffffffll));
  app.add_option("--nbytes", a.nbytes, "payload bytes per hop (>= 8 KiB travels zero-copy)")
      ->check(integer_in(0, 1ll << 30));
  app.add_option("--threads", a.threads, "worker threads per rank (0: FERRY_AMT_THREADS, else 1)")
      ->check(integer_in(0, 4096));
  app.add_option("--batch-size", a.batch_size, "chains started by one spawn task")->check(integer_in(1, 1ll << 32));
  app.add_option("--parcelport", a.parcelport, "ferry, mpi, mpi_a, mpix (default: FERRY_PARCELPORT, else ferry)");
  app.add_option("--devices", a.devices, "ferry devices / mpix communicators (0: default)")->check(integer_in(0, 1024));
  app.add_option("--warmup", a.warmup, "untimed nbytes round trips before the start")->check(integer_in(0, 1ll << 30));
  // Up to 10 s per task: more is surely a typo (a chain of 100 hops would take over 15 minutes).
  app.add_option("--task-us", a.task_us, "microseconds each hop's task computes (see --task-mode) before forwarding")
      ->check(integer_in(0, 10'000'000));
  app.add_option("--task-mode", a.task_mode,
                 "how a task computes: spin (busy, the default) or sleep (a core of its own; for machines with fewer cores than workers)")
      ->check(CLI::IsMember({"spin", "sleep"}));
  app.add_option("--task-dist", a.task_dist,
                 "task lengths: fixed (every task --task-us) or exp (exponential, mean --task-us: irregular tasks)")
      ->check(CLI::IsMember({"fixed", "exp"}));
  app.add_flag("--single-source", a.single_source, "all chains start on rank 0 (default: half on each)");
  app.add_flag("--pin", a.pin, "pin worker i to core i % cores");
  app.add_flag("--inline-tasks", a.inline_tasks,
               "a hop's task runs on the worker that polled its parcel (amt::Options::inline_calls), not via the shared queue");
  app.add_flag("--json", a.json, "one JSON object per run (rank 0)");

  const bool loud = is_rank_zero_by_env();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return loud ? app.exit(e) : 0;
  } catch (const CLI::ParseError& e) {
    if (loud) std::fprintf(stderr, "ferry-chains: error: %s\nRun with --help for usage.\n", e.what());
    return exit_usage;
  }
#ifdef FERRY_HAVE_PARCEL_MPI
  ferry::parcel::register_mpi_parcelports();  // the baselines fig3 and the factor study compare against
#endif
  const auto kinds = ferry::parcel::parcelport_kinds();
  if (std::find(kinds.begin(), kinds.end(), a.parcelport) == kinds.end()) {
    if (loud) {
      std::string list;
      for (const auto& k : kinds) list += (list.empty() ? "" : ", ") + k;
      std::fprintf(stderr, "ferry-chains: error: --parcelport '%s' is not one this build supports (%s)\n",
                   a.parcelport.c_str(), list.c_str());
    }
    return exit_usage;
  }

  ferry::amt::Options opt;
  opt.parcelport = a.parcelport;
  opt.threads = static_cast<int>(a.threads);
  opt.devices = static_cast<int>(a.devices);
  opt.pin = a.pin;
  opt.inline_calls = a.inline_tasks;

  static Bench b;  // static: outlives any task that might still touch it during teardown
  try {
    ferry::amt::Runtime rt(opt);
    b.rt = &rt;
    b.me = rt.rank();
    if (rt.size() != 2) {
      if (b.me == 0) {
        std::fprintf(stderr, "ferry-chains: error: needs exactly 2 ranks, got %d (launch with -n 2)\n", rt.size());
      }
      return exit_usage;  // the destructor's collective finalize still runs on every rank
    }
    b.peer = 1 - b.me;
    b.nchains = static_cast<std::uint64_t>(a.nchains);
    b.nsteps = static_cast<std::uint64_t>(a.nsteps);
    b.nbytes = static_cast<std::uint64_t>(a.nbytes);
    b.batch = static_cast<std::uint64_t>(a.batch_size);
    b.task_us = a.task_us;
    b.task_sleeps = a.task_mode == "sleep";
    b.task_exp = a.task_dist == "exp";
    b.first_on_1 = a.single_source ? b.nchains : (b.nchains + 1) / 2;
    const std::uint64_t starts_here = b.me == 0 ? b.first_on_1 : b.nchains - b.first_on_1;
    b.ends_here = b.nsteps % 2 == 1 ? b.nchains - starts_here : starts_here;

    b.hop = rt.action("chains.hop", [](std::uint64_t chain, std::uint32_t left, Blob payload) {
      compute_for(task_length(b.task_us, b.task_exp, chain, left), b.task_sleeps);  // every hop's task, the last one too: each hop costs the same
      if (left == 0) {
        b.chain_ended(chain, payload);
      } else {
        b.rt->async(b.peer, b.hop, chain, left - 1, std::move(payload));
      }
    });
    b.done = rt.action("chains.done", [](std::uint64_t errors) { b.report(errors); });
    auto go = rt.action("chains.go", []() { b.start(); });
    auto echo = rt.action("chains.echo", [](Blob p) { return p; });
    auto stop = rt.action("chains.stop", []() { b.finish(); });

    if (b.me == 0) {
      // Handshake: the round trips prove rank 1 is up with its actions registered (calls
      // that arrive earlier are held, not lost) and warm up both paths (header, zero-copy).
      const int trips = std::max<int>(1, static_cast<int>(a.warmup));
      for (int i = 0; i < trips; ++i) {
        Blob p(b.nbytes);
        stamp(p, 0);
        Blob back = rt.async_future(1, echo, std::move(p)).get();
        if (!intact(back, 0, b.nbytes)) b.payload_errors.fetch_add(1, std::memory_order_relaxed);
      }
      b.t0 = Clock::now();
      rt.async(1, go);
      b.start();
    }
    // Main threads sleep (futex) rather than help: the run uses exactly --threads workers.
    b.finished.wait(false, std::memory_order_acquire);
    if (b.me == 0) rt.async(1, stop);
    rt.finalize();

    const std::uint64_t errors = b.payload_errors.load() + b.remote_errors.load() + rt.errors();
    if (b.me != 0) {
      if (errors != 0) {
        std::fprintf(stderr, "ferry-chains: rank 1: %llu errors\n", static_cast<unsigned long long>(errors));
      }
      return errors == 0 ? 0 : 1;
    }
    const double time_s = std::chrono::duration<double>(b.t1 - b.t0).count();
    const double messages = static_cast<double>(b.nchains) * static_cast<double>(b.nsteps);
    const double latency_us = time_s * 1e6 / static_cast<double>(b.nsteps);
    const double msg_rate = messages / time_s / 2.0;
    if (a.json) {
      nlohmann::json j = {{"bench", "chains"},
                          {"parcelport", rt.parcelport()},
                          {"transport", rt.transport()},
                          {"ranks", rt.size()},
                          {"nchains", b.nchains},
                          {"nsteps", b.nsteps},
                          {"nbytes", b.nbytes},
                          {"threads", rt.threads()},
                          {"batch_size", b.batch},
                          {"single_source", a.single_source},
                          {"devices", a.devices},
                          {"pin", a.pin},
                          {"warmup", a.warmup},
                          {"task_us", a.task_us},
                          {"task_mode", a.task_mode},
                          {"task_dist", a.task_dist},
                          {"inline_tasks", a.inline_tasks},
                          {"messages", b.nchains * b.nsteps},
                          {"time_s", time_s},
                          {"latency_us", latency_us},
                          {"msg_rate", msg_rate},
                          {"total_rate", messages / time_s},
                          {"errors", errors}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("chains %s: %llu chains x %llu steps, %llu B, %d threads%s%s: %.4f s, %.3f us/hop, %.0f msg/s per rank, "
                  "%llu errors\n",
                  rt.parcelport().c_str(), static_cast<unsigned long long>(b.nchains),
                  static_cast<unsigned long long>(b.nsteps), static_cast<unsigned long long>(b.nbytes), rt.threads(),
                  a.single_source ? ", single source" : "",
                  a.task_us > 0 ? (", " + std::to_string(a.task_us) + " us per task (" + a.task_mode + ")").c_str() : "", time_s, latency_us, msg_rate,
                  static_cast<unsigned long long>(errors));
    }
    std::fflush(stdout);
    return errors == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-chains: error: %s\n", e.what());
    return 1;
  }
}
