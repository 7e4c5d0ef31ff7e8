// ferry-bench: latency and message rate of ferry's active messages, and the raw speed of a
// CompletionQueue. See bench/README.md for what each number means.
//
//   build/bin/ferryrun -n 2 build/bin/ferry-bench pingpong --size 8 --iters 10000
//   build/bin/ferryrun -n 2 build/bin/ferry-bench msgrate --size 8 --count 100000 --window 64
//   build/bin/ferry-bench cq --threads 2 --ops 1000000
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "ferry/ferry.hpp"

namespace {

using bench::Clock;
using nlohmann::json;

// Set by the first thread that fails, so that its siblings stop waiting for messages that will
// never come and the process can report the error instead of hanging until the launcher's timeout.
std::atomic<bool> g_failed{false};
std::mutex g_error_mutex;
std::string g_error;

void fail(const std::string& what) {
  {
    std::lock_guard<std::mutex> guard(g_error_mutex);
    if (g_error.empty()) g_error = what;
  }
  g_failed.store(true, std::memory_order_release);
}

struct Aborted : std::exception {};

// Counts local completions of posted operations (rendezvous sends). A Synchronizer counts to a
// fixed n; a window of sends needs a running total instead.
class Counter final : public ferry::CompletionObject {
 public:
  void signal(ferry::Completion&& c) noexcept override {
    if (!c.ok()) {
      int expected = 0;
      first_error_.compare_exchange_strong(expected, c.error == 0 ? -1 : c.error);
    }
    count_.fetch_add(1, std::memory_order_release);
  }
  std::uint64_t count() const noexcept { return count_.load(std::memory_order_acquire); }
  int first_error() const noexcept { return first_error_.load(std::memory_order_acquire); }

 private:
  std::atomic<std::uint64_t> count_{0};
  std::atomic<int> first_error_{0};
};

// One benchmark thread's view of the network: its device, its inbox and how it waits.
struct Lane {
  ferry::Runtime& rt;
  ferry::Device& dev;
  ferry::CompletionQueue& inbox;
  int thread;
  int peer;
  // With more busy threads than cores, a spinning thread can starve the one that would make
  // progress; yielding on an empty poll then costs far less than it saves. With enough cores
  // it only adds a system call to the latency, so it is off.
  bool yield;
  Counter sent;
  std::uint64_t posted = 0;

  void poll() {
    if (g_failed.load(std::memory_order_relaxed)) throw Aborted{};
    if (!dev.progress() && yield) std::this_thread::yield();
  }

  // Posts an active message to the peer's inbox for this thread, retrying on back-pressure.
  void send(const void* data, std::size_t size) {
    const ferry::AmArgs args{.rank = peer,
                             .buffer = data,
                             .size = size,
                             .target = ferry::RemoteTarget{static_cast<std::uint16_t>(target_id(thread))},
                             .tag = static_cast<ferry::Tag>(thread),
                             .local = &sent,
                             .context = nullptr};
    ferry::Status s;
    while ((s = dev.post_am(args)).is_retry()) poll();
    if (s.is_posted()) ++posted;
  }

  // A posted (rendezvous) send reads the caller's buffer until its local completion.
  void wait_sends() {
    while (sent.count() < posted) poll();
    if (sent.first_error() != 0) {
      throw std::runtime_error("a send to rank " + std::to_string(peer) + " failed with error " +
                               std::to_string(sent.first_error()));
    }
  }

  // Waits for the next message in this thread's inbox and checks it is what the peer sent.
  ferry::Completion receive(std::size_t expect_size, bool full_check) {
    for (;;) {
      if (auto c = inbox.pop()) {
        validate(*c, expect_size, full_check);
        return std::move(*c);
      }
      poll();
    }
  }

  void validate(const ferry::Completion& c, std::size_t expect_size, bool full_check) const {
    auto where = [&] {
      return "rank " + std::to_string(rt.rank()) + " thread " + std::to_string(thread) + ": message from rank " +
             std::to_string(c.rank);
    };
    if (!c.ok()) throw std::runtime_error(where() + " failed: " + c.error_string());
    if (c.op != ferry::OpKind::remote_am) {
      throw std::runtime_error(where() + ": expected a remote_am completion, got " + ferry::to_string(c.op));
    }
    if (c.rank != peer || c.tag != static_cast<ferry::Tag>(thread)) {
      throw std::runtime_error(where() + " has tag " + std::to_string(c.tag) + "; expected rank " +
                               std::to_string(peer) + " tag " + std::to_string(thread));
    }
    if (c.size != expect_size || c.buffer.size() != expect_size) {
      throw std::runtime_error(where() + " has size " + std::to_string(c.size) + " (buffer " +
                               std::to_string(c.buffer.size()) + "), expected " + std::to_string(expect_size));
    }
    const auto* p = static_cast<const unsigned char*>(c.buffer.data());
    if (!bench::check_ends(p, expect_size, peer, thread)) {
      throw std::runtime_error(where() + ": first or last payload byte is wrong (size " + std::to_string(expect_size) +
                               ")");
    }
    if (full_check) {
      const long long bad = bench::check_pattern(p, expect_size, peer, thread);
      if (bad >= 0) {
        throw std::runtime_error(where() + ": payload byte " + std::to_string(bad) + " of " +
                                 std::to_string(expect_size) + " is wrong");
      }
    }
  }

  static int target_id(int thread) { return 1 + thread; }
};

// (A designated initializer would do, but GCC's -Wextra flags the fields it leaves out.)
ferry::RuntimeOptions options_with_devices(int devices) {
  ferry::RuntimeOptions o;
  o.devices = devices;
  return o;
}

// Everything a subcommand shares: the runtime, one inbox per thread, exposed under ids 1..T.
struct Job {
  ferry::Runtime rt;
  int threads;
  int devices;
  bool yield;
  std::vector<std::unique_ptr<ferry::CompletionQueue>> inboxes;
  std::vector<ferry::Exposure> exposures;

  Job(int threads_, int devices_) : rt(options_with_devices(devices_)), threads(threads_) {
    devices = rt.device_count();
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    // All ranks of a ferryrun job share the host, so they compete for the same cores.
    yield = static_cast<unsigned>(threads) * static_cast<unsigned>(rt.size()) > cores;
    for (int t = 0; t < threads; ++t) {
      inboxes.push_back(std::make_unique<ferry::CompletionQueue>());
      exposures.push_back(rt.expose(*inboxes.back(), static_cast<std::uint16_t>(Lane::target_id(t))));
    }
    // Every inbox exists before any rank sends (ferry would hold early messages anyway, but
    // the first timed round trip should not include that).
    rt.barrier();
  }

  std::unique_ptr<Lane> lane(int t) {
    const int peer = rt.rank() == 0 ? 1 : 0;
    return std::unique_ptr<Lane>(new Lane{rt, rt.device(t % devices), *inboxes[static_cast<std::size_t>(t)], t, peer,
                                          yield, {}, 0});
  }

  json base(const char* bench_name, std::int64_t size) {
    return json{{"bench", bench_name},
                {"size", size},
                {"threads", threads},
                {"devices", devices},
                {"provider", rt.provider()},
                {"ranks", rt.size()},
                {"eager_limit", rt.device(0).eager_limit()},
                {"yield", yield},
                {"ferry_version", ferry::version()}};
  }
};

// Runs fn(t) on `threads` threads and rethrows nothing: failures end up in g_error.
template <class Fn>
void run_threads(int threads, Fn fn) {
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&fn, t] {
      try {
        fn(t);
      } catch (const Aborted&) {
      } catch (const std::exception& e) {
        fail(e.what());
      }
    });
  }
  for (auto& th : pool) th.join();
}

// A failed rank cannot take part in the collective finalize; it leaves at once and the
// launcher stops the other ranks.
[[noreturn]] void die(const ferry::Runtime* rt, const std::string& what) {
  if (rt != nullptr) {
    std::fprintf(stderr, "ferry-bench: rank %d: %s\n", rt->rank(), what.c_str());
  } else {
    std::fprintf(stderr, "ferry-bench: %s\n", what.c_str());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}

bool require_two_ranks(const ferry::Runtime& rt, const char* sub) {
  if (rt.size() >= 2) return true;
  if (rt.rank() == 0) {
    std::fprintf(stderr,
                 "ferry-bench %s: needs at least 2 ranks, but the job has %d; launch it with "
                 "ferryrun -n 2 ferry-bench %s ...\n",
                 sub, rt.size(), sub);
  }
  return false;
}

// ---- pingpong ---------------------------------------------------------------------------

int run_pingpong(const bench::PingpongArgs& a, int threads, int devices) {
  Job job(threads, devices);
  ferry::Runtime& rt = job.rt;
  if (!require_two_ranks(rt, "pingpong")) {
    rt.finalize();
    return bench::exit_usage;
  }
  const int rank = rt.rank();
  const auto size = static_cast<std::size_t>(a.size);
  const std::int64_t reps = std::min(a.reps, a.iters);
  std::vector<std::vector<double>> chunk_us(static_cast<std::size_t>(threads));
  std::vector<double> mean_us(static_cast<std::size_t>(threads), 0.0);
  std::barrier start_line(threads);

  if (rank <= 1) {
    run_threads(threads, [&](int t) {
      auto lane = job.lane(t);
      std::vector<unsigned char> buf(std::max<std::size_t>(size, 1));
      bench::fill_pattern(buf.data(), size, rank, t);
      const std::int64_t total = a.warmup + a.iters;
      if (rank == 0) {
        start_line.arrive_and_wait();
        std::int64_t i = 0;
        auto round_trip = [&] {
          // The first and the last exchange get a full payload check; the rest, both ends.
          const bool full = i == 0 || i == total - 1;
          lane->wait_sends();
          lane->send(buf.data(), size);
          lane->receive(size, full);
          ++i;
        };
        while (i < a.warmup) round_trip();
        double sum_s = 0.0;
        for (std::int64_t r = 0; r < reps; ++r) {
          const std::int64_t n = a.iters / reps + (r < a.iters % reps ? 1 : 0);
          const auto t0 = Clock::now();
          for (std::int64_t k = 0; k < n; ++k) round_trip();
          const double s = bench::seconds_since(t0);
          sum_s += s;
          chunk_us[static_cast<std::size_t>(t)].push_back(s / static_cast<double>(n) / 2.0 * 1e6);
        }
        mean_us[static_cast<std::size_t>(t)] = sum_s / static_cast<double>(a.iters) / 2.0 * 1e6;
      } else {
        for (std::int64_t i = 0; i < total; ++i) {
          lane->receive(size, i == 0 || i == total - 1);
          lane->wait_sends();
          lane->send(buf.data(), size);
        }
      }
      lane->wait_sends();
    });
  }
  if (g_failed.load()) die(&rt, g_error);

  if (rank == 0) {
    std::vector<double> all;
    std::vector<double> per_thread;
    for (int t = 0; t < threads; ++t) {
      const auto& v = chunk_us[static_cast<std::size_t>(t)];
      all.insert(all.end(), v.begin(), v.end());
      per_thread.push_back(bench::median(v));
    }
    const double med = bench::median(all);
    const double avg = bench::mean(mean_us);
    const double lo = *std::min_element(all.begin(), all.end());
    const double hi = *std::max_element(all.begin(), all.end());
    if (a.json) {
      json j = job.base("pingpong", a.size);
      j["iters"] = a.iters;
      j["warmup"] = a.warmup;
      j["reps"] = reps;
      j["half_rtt_us"] = med;
      j["half_rtt_us_mean"] = avg;
      j["half_rtt_us_min"] = lo;
      j["half_rtt_us_max"] = hi;
      if (threads > 1) j["half_rtt_us_per_thread"] = per_thread;
      bench::print_json(j);
    } else {
      std::printf(
          "pingpong  size %lld B  threads %d  devices %d  provider %s  ranks %d: half round trip %.3f us "
          "(median of %lld x %lld iters; mean %.3f, min %.3f, max %.3f)\n",
          static_cast<long long>(a.size), threads, job.devices, rt.provider().c_str(), rt.size(), med,
          static_cast<long long>(reps), static_cast<long long>(a.iters / reps), avg, lo, hi);
      std::fflush(stdout);
    }
  }
  rt.finalize();
  return 0;
}

// ---- msgrate ----------------------------------------------------------------------------

int run_msgrate(const bench::MsgrateArgs& a, int threads, int devices) {
  Job job(threads, devices);
  ferry::Runtime& rt = job.rt;
  if (!require_two_ranks(rt, "msgrate")) {
    rt.finalize();
    return bench::exit_usage;
  }
  const int rank = rt.rank();
  const auto size = static_cast<std::size_t>(a.size);
  const std::int64_t window = a.window;
  const std::int64_t warmup = a.warmup < 0 ? std::min(window, a.count) : a.warmup;
  constexpr std::size_t ack_size = 8;
  std::vector<Clock::time_point> starts(static_cast<std::size_t>(threads));
  std::vector<Clock::time_point> ends(static_cast<std::size_t>(threads));
  std::barrier start_line(threads);

  if (rank <= 1) {
    run_threads(threads, [&](int t) {
      auto lane = job.lane(t);
      std::vector<unsigned char> buf(std::max<std::size_t>(size, 1));
      bench::fill_pattern(buf.data(), size, rank, t);
      unsigned char ack[ack_size];
      bench::fill_pattern(ack, ack_size, rank, t);
      // Both ranks walk the same schedule of windows: warmup first, then the timed count.
      auto windows = [&](std::int64_t n, auto&& per_window) {
        for (std::int64_t done = 0; done < n;) {
          const std::int64_t k = std::min(window, n - done);
          per_window(k, done == 0, done + k == n);
          done += k;
        }
      };
      if (rank == 0) {
        auto send_window = [&](std::int64_t k, bool, bool) {
          for (std::int64_t i = 0; i < k; ++i) lane->send(buf.data(), size);
          lane->receive(ack_size, false);
        };
        windows(warmup, send_window);
        start_line.arrive_and_wait();
        starts[static_cast<std::size_t>(t)] = Clock::now();
        windows(a.count, send_window);
        ends[static_cast<std::size_t>(t)] = Clock::now();
        lane->wait_sends();
      } else {
        auto recv_window = [&](std::int64_t k, bool first, bool last) {
          for (std::int64_t i = 0; i < k; ++i) lane->receive(size, (first && i == 0) || (last && i == k - 1));
          lane->send(ack, ack_size);
        };
        windows(warmup, recv_window);
        windows(a.count, recv_window);
        lane->wait_sends();
      }
    });
  }
  if (g_failed.load()) die(&rt, g_error);

  if (rank == 0) {
    const auto first = *std::min_element(starts.begin(), starts.end());
    const auto last = *std::max_element(ends.begin(), ends.end());
    const double secs = std::chrono::duration<double>(last - first).count();
    const double total = static_cast<double>(a.count) * threads;
    const double rate = total / secs;
    if (a.json) {
      json j = job.base("msgrate", a.size);
      j["count"] = a.count;
      j["window"] = window;
      j["warmup"] = warmup;
      j["total_messages"] = a.count * threads;
      j["seconds"] = secs;
      j["msgs_per_s"] = rate;
      j["mbytes_per_s"] = rate * static_cast<double>(size) / 1e6;
      bench::print_json(j);
    } else {
      std::printf(
          "msgrate   size %lld B  threads %d  devices %d  provider %s  ranks %d: %.0f msgs/s (%.2f MB/s; %lld "
          "messages in windows of %lld, %.3f s)\n",
          static_cast<long long>(a.size), threads, job.devices, rt.provider().c_str(), rt.size(), rate,
          rate * static_cast<double>(size) / 1e6, static_cast<long long>(a.count * threads),
          static_cast<long long>(window), secs);
      std::fflush(stdout);
    }
  }
  rt.finalize();
  return 0;
}

// ---- cq ---------------------------------------------------------------------------------

// Each thread alternates: push one completion, then pop one (any thread's). Every thread has
// pushed at least as many as it popped, so the queue is never empty for a thread about to pop
// for longer than a sibling's push takes; the benchmark cannot deadlock whatever the thread
// count, and it measures the queue under contention on both ends at once.
int run_cq(std::int64_t ops, int threads, bool as_json, ferry::QueueKind kind) {
  ferry::Runtime rt;
  if (kind == ferry::QueueKind::default_kind) kind = ferry::default_queue_kind();
  ferry::CompletionQueueOptions queue_options;
  queue_options.kind = kind;
  ferry::CompletionQueue queue(queue_options);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const bool yield = static_cast<unsigned>(threads) * static_cast<unsigned>(rt.size()) > cores;
  std::vector<Clock::time_point> starts(static_cast<std::size_t>(threads));
  std::vector<Clock::time_point> ends(static_cast<std::size_t>(threads));
  std::atomic<std::int64_t> popped{0};
  std::barrier start_line(threads);
  rt.barrier();
  run_threads(threads, [&](int t) {
    start_line.arrive_and_wait();
    starts[static_cast<std::size_t>(t)] = Clock::now();
    std::int64_t mine = 0;
    for (std::int64_t i = 0; i < ops; ++i) {
      ferry::Completion c;
      c.op = ferry::OpKind::am;
      c.tag = static_cast<ferry::Tag>(t);
      c.context = reinterpret_cast<void*>(static_cast<std::uintptr_t>(i));
      queue.signal(std::move(c));
      for (;;) {
        if (queue.pop()) break;
        if (g_failed.load(std::memory_order_relaxed)) throw Aborted{};
        if (yield) std::this_thread::yield();
      }
      ++mine;
    }
    ends[static_cast<std::size_t>(t)] = Clock::now();
    popped.fetch_add(mine);
  });
  if (g_failed.load()) die(&rt, g_error);
  if (queue.pop()) die(&rt, "cq: the queue holds a completion after every pushed one was popped");
  if (popped.load() != ops * threads) die(&rt, "cq: popped " + std::to_string(popped.load()) + " completions");

  if (rt.rank() == 0) {
    const auto first = *std::min_element(starts.begin(), starts.end());
    const auto last = *std::max_element(ends.begin(), ends.end());
    const double secs = std::chrono::duration<double>(last - first).count();
    const double rate = static_cast<double>(ops * threads) / secs;
    if (as_json) {
      bench::print_json(json{{"bench", "cq"},
                             {"size", 0},
                             {"threads", threads},
                             {"ops", ops},
                             {"count", ops * threads},
                             {"provider", rt.provider()},
                             {"ranks", rt.size()},
                             {"capacity", queue.capacity()},
                             {"queue", ferry::to_string(kind)},
                             {"yield", yield},
                             {"seconds", secs},
                             {"msgs_per_s", rate},
                             {"ops_per_s", 2.0 * rate},
                             {"ferry_version", ferry::version()}});
    } else {
      std::printf(
          "cq        queue %s  threads %d  capacity %zu: %.0f completions/s through one queue (each pushed and "
          "popped; %lld per thread, %.3f s)\n",
          ferry::to_string(kind), threads, queue.capacity(), rate, static_cast<long long>(ops), secs);
      std::fflush(stdout);
    }
  }
  rt.finalize();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ferry-bench: ferry's active-message latency and message rate, and completion queue speed"};
  app.name("ferry-bench");
  app.require_subcommand(1);

  int threads = 1;
  int devices = 1;
  auto add_threads = [&](CLI::App* sub) {
    sub->add_option("--threads", threads, "threads per rank, each with its own ping-pong or stream")
        ->check(bench::integer_in(1, 1024));
  };
  auto add_devices = [&](CLI::App* sub) {
    sub->add_option("--devices", devices, "ferry devices per rank; thread t uses device t % D")
        ->check(bench::integer_in(1, 256));
  };

  bench::PingpongArgs pp;
  CLI::App* pingpong = app.add_subcommand(
      "pingpong", "rank 0 and 1 bounce an active message of --size bytes; prints the half round trip time");
  bench::add_pingpong_options(pingpong, pp);
  add_threads(pingpong);
  add_devices(pingpong);

  bench::MsgrateArgs mr;
  CLI::App* msgrate = app.add_subcommand(
      "msgrate", "rank 0 streams active messages to rank 1, acknowledged every --window; prints messages/s");
  bench::add_msgrate_options(msgrate, mr);
  add_threads(msgrate);
  add_devices(msgrate);

  std::int64_t ops = 1000000;
  bool cq_json = false;
  CLI::App* cq = app.add_subcommand(
      "cq", "threads push and pop completions through one shared CompletionQueue; prints completions/s");
  cq->add_option("--ops", ops, "completions each thread pushes and pops")
      ->check(bench::integer_in(1, bench::max_count));
  add_threads(cq);
  std::string cq_queue = "default";
  cq->add_option("--queue", cq_queue, "queue algorithm: ring, faa, ms, lock; default: FERRY_COMPLETION's")
      ->check(CLI::IsMember({"default", "ring", "faa", "ms", "lock"}));
  cq->add_flag("--json", cq_json, "one JSON object per result line");

  // Under a launcher every rank parses the same command line; one report of a mistake is enough.
  const char* env_rank = std::getenv("PMI_RANK");
  const bool quiet = env_rank != nullptr && std::strcmp(env_rank, "0") != 0;
  if (const int code = bench::parse_or_exit_code(app, argc, argv, quiet); code >= 0) return code;

  try {
    if (pingpong->parsed()) return run_pingpong(pp, threads, devices);
    if (msgrate->parsed()) return run_msgrate(mr, threads, devices);
    if (cq->parsed()) {
      ferry::QueueKind kind = ferry::QueueKind::default_kind;
      for (const ferry::QueueKind k :
           {ferry::QueueKind::ring, ferry::QueueKind::faa, ferry::QueueKind::ms, ferry::QueueKind::lock}) {
        if (cq_queue == ferry::to_string(k)) kind = k;
      }
      return run_cq(ops, threads, cq_json, kind);
    }
  } catch (const std::exception& e) {
    die(nullptr, e.what());
  }
  return bench::exit_usage;
}
