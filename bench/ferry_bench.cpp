// ferry-bench: latency and message rate of ferry's active messages, the same under thread
// contention on one device for each lock model, and the raw speed of a CompletionQueue. See
// bench/README.md for what each number means.
//
//   build/bin/ferryrun -n 2 build/bin/ferry-bench pingpong --size 8 --iters 10000
//   build/bin/ferryrun -n 2 build/bin/ferry-bench msgrate --size 8 --count 100000 --window 64
//   build/bin/ferryrun -n 2 build/bin/ferry-bench contention --pattern recv --threads 4 --lock-model lockq
//   build/bin/ferry-bench cq --threads 2 --ops 1000000
#include <sys/mman.h>

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

#include <sys/resource.h>

// Under valgrind's callgrind, `contention` and `cq` zero the cost counters when their measured
// interval starts and dump them when it ends (a dump file "<out-file>.1"), so that start-up,
// bootstrap and finalize stay out of it (bench/lock_evidence.py). Outside valgrind these client
// requests are a few instructions that do nothing.
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define FERRY_BENCH_CALLGRIND_ZERO() CALLGRIND_ZERO_STATS
#define FERRY_BENCH_CALLGRIND_DUMP(what) CALLGRIND_DUMP_STATS_AT(what)
#else
#define FERRY_BENCH_CALLGRIND_ZERO() ((void)0)
#define FERRY_BENCH_CALLGRIND_DUMP(what) ((void)0)
#endif

#include "bench_util.hpp"
#include "atomic_bench.hpp"
#include "coll_bench.hpp"
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

// What the operating system saw of this process's threads over an interval (getrusage,
// RUSAGE_SELF: every thread of the process, ferry's own included, e.g. offload's communication
// thread). A voluntary context switch is a thread going to sleep (a futex wait in a blocking
// lock or condition variable, poll, sleep); an involuntary one is a thread taken off its core
// while still runnable: preempted at the end of its time slice, or a sched_yield that let
// another thread run (Linux counts those as involuntary).
struct Usage {
  long voluntary = 0;
  long involuntary = 0;
  double cpu_seconds = 0.0;  // user + system

  static Usage now() noexcept {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    auto seconds = [](const timeval& tv) {
      return static_cast<double>(tv.tv_sec) + 1e-6 * static_cast<double>(tv.tv_usec);
    };
    return Usage{ru.ru_nvcsw, ru.ru_nivcsw, seconds(ru.ru_utime) + seconds(ru.ru_stime)};
  }
  Usage since(const Usage& start) const noexcept {
    return Usage{voluntary - start.voluntary, involuntary - start.involuntary, cpu_seconds - start.cpu_seconds};
  }
  // The start and end of a measured interval (see FERRY_BENCH_CALLGRIND_ZERO above).
  static Usage begin() noexcept {
    FERRY_BENCH_CALLGRIND_ZERO();
    return now();
  }
  static Usage end(const char* what) noexcept {
    const Usage u = now();
    FERRY_BENCH_CALLGRIND_DUMP(what);
    return u;
  }
};

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

// pingpong --inbox handler: the message is handed to a Handler inside progress, which parks it
// here for the lane's thread (whichever thread ran progress). A ping-pong has at most one
// message in flight per lane, so one slot is enough; a second is a protocol error, reported.
// `full` hands the slot over both ways: put's release store of true publishes the completion
// to the lane's acquire load; the lane's release store of false (after moving it out) pairs
// with put's acquire load, so the next put cannot overwrite a slot still being read.
// `overrun` only reports: relaxed.
struct Mailbox {
  std::atomic<bool> full{false};
  std::atomic<bool> overrun{false};
  ferry::Completion slot;

  void put(ferry::Completion&& c) noexcept {
    if (full.load(std::memory_order_acquire)) {
      overrun.store(true, std::memory_order_relaxed);
      return;
    }
    slot = std::move(c);
    full.store(true, std::memory_order_release);  // publishes slot to the lane's thread
  }
};

// pingpong --inbox reply: the message's Handler, inside progress, answers it at once (rank 1)
// or sends the next ping of the current run (rank 0), as active-message code answers from its
// handler. The handler runs on whichever thread progresses the lane's device (another lane's
// thread when lanes share a device, ferry's own under offload), so what it shares with the
// lane's thread is atomic: `received` (release by the handler, acquire by the lane) publishes
// the handler's work; `owed` hands a message the handler could not post (retry) to the lane;
// `failure` publishes `error` (0 none, 1 being written, 2 written: release/acquire).
struct Responder {
  ferry::Device* dev = nullptr;
  int rank = 0;
  int peer = 0;
  int channel = 0;
  std::size_t size = 0;
  std::vector<unsigned char> payload;
  unsigned char first = 0;  // the peer's first and last payload byte (check_ends, precomputed)
  unsigned char last = 0;
  Counter sent;
  std::atomic<std::uint64_t> posted{0};
  std::atomic<std::int64_t> received{0};
  std::atomic<std::int64_t> stop{0};   // rank 0: the ping that ends the current run
  std::atomic<std::int64_t> total{0};  // the last message number (payload fully checked)
  std::atomic<bool> owed{false};       // a message the handler could not post (retry): the lane posts it
  std::string error;                   // the first bad message, said by the lane
  std::atomic<int> failure{0};

  // Posts the next message; false when the device says retry (the lane's progress clears it).
  bool post() {
    const ferry::AmArgs args{.rank = peer,
                             .buffer = payload.data(),
                             .size = size,
                             .target = ferry::RemoteTarget{static_cast<std::uint16_t>(1 + channel)},
                             .tag = static_cast<ferry::Tag>(channel),
                             .local = &sent,
                             .context = nullptr};
    const ferry::Status st = dev->post_am(args);
    if (st.is_retry()) return false;
    if (st.is_posted()) posted.fetch_add(1, std::memory_order_relaxed);  // read after the sends completed
    return true;
  }

  void on_message(ferry::Completion&& c) {
    const std::int64_t n = received.load(std::memory_order_relaxed) + 1;
    // The answer leaves first, as a server's would: checking the message is the benchmark's
    // own work and stays off the measured path.
    if ((rank == 1 || n < stop.load(std::memory_order_relaxed)) && !post()) owed.store(true, std::memory_order_release);
    const auto* p = static_cast<const unsigned char*>(c.buffer.data());
    const bool full = n == 1 || n == total.load(std::memory_order_relaxed);
    if (!c.ok() || c.op != ferry::OpKind::remote_am || c.rank != peer || c.tag != static_cast<ferry::Tag>(channel) ||
        c.size != size || c.buffer.size() != size || (size != 0 && (p[0] != first || p[size - 1] != last)) ||
        (full && bench::check_pattern(p, size, peer, channel) >= 0)) {
      int none = 0;
      if (failure.compare_exchange_strong(none, 1, std::memory_order_relaxed)) {
        error = "rank " + std::to_string(rank) + ": message " + std::to_string(n) + " from rank " +
                std::to_string(c.rank) + " (tag " + std::to_string(c.tag) + ", " + std::to_string(c.size) +
                " bytes) is not the expected one" + (c.ok() ? "" : ": " + c.error_string());
        failure.store(2, std::memory_order_release);  // publishes error
      }
    }
    received.store(n, std::memory_order_release);
  }
};

// One benchmark thread's view of the network: its device, its inbox and how it waits.
//
// Messages travel on a channel c: they go to the peer's inbox exposed as target 1+c, carry tag
// c and the payload pattern of (sending rank, c). Normally thread t uses channel t on both
// ranks; the contention benchmark points several threads at one channel (many receivers
// sharing one inbox, all acknowledging to one sender).
struct Lane {
  ferry::Runtime& rt;
  ferry::Device& dev;
  ferry::CompletionQueue& inbox;
  int thread;
  int channel;
  int peer;
  // With more busy threads than cores, a spinning thread can starve the one that would make
  // progress; yielding on an empty poll then costs far less than it saves. With enough cores
  // it only adds a system call to the latency, so by default it is off (see decide_yield).
  bool yield;
  Counter sent;
  std::uint64_t posted = 0;
  Mailbox* mailbox = nullptr;  // set: messages arrive through a Handler, not the inbox

  void poll() {
    if (g_failed.load(std::memory_order_relaxed)) throw Aborted{};
    if (!dev.progress() && yield) std::this_thread::yield();
  }

  // Posts an active message to the peer's inbox for this thread, retrying on back-pressure.
  void send(const void* data, std::size_t size) { send_on(channel, channel, data, size); }

  // The same to the inbox of channel `to`, tagged with `tag` (several senders, one inbox).
  void send_on(int to, int tag, const void* data, std::size_t size) {
    const ferry::AmArgs args{.rank = peer,
                             .buffer = data,
                             .size = size,
                             .target = ferry::RemoteTarget{static_cast<std::uint16_t>(target_id(to))},
                             .tag = static_cast<ferry::Tag>(tag),
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
    if (mailbox != nullptr) {
      for (;;) {
        if (mailbox->full.load(std::memory_order_acquire)) {
          ferry::Completion c = std::move(mailbox->slot);
          mailbox->full.store(false, std::memory_order_release);
          validate(c, expect_size, full_check);
          return c;
        }
        if (mailbox->overrun.load(std::memory_order_relaxed)) {
          throw std::runtime_error("rank " + std::to_string(rt.rank()) + " thread " + std::to_string(thread) +
                                   ": a second message arrived before the first was taken");
        }
        poll();
      }
    }
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
    if (c.rank != peer || c.tag != static_cast<ferry::Tag>(channel)) {
      throw std::runtime_error(where() + " has tag " + std::to_string(c.tag) + "; expected rank " +
                               std::to_string(peer) + " tag " + std::to_string(channel));
    }
    if (c.size != expect_size || c.buffer.size() != expect_size) {
      throw std::runtime_error(where() + " has size " + std::to_string(c.size) + " (buffer " +
                               std::to_string(c.buffer.size()) + "), expected " + std::to_string(expect_size));
    }
    const auto* p = static_cast<const unsigned char*>(c.buffer.data());
    if (!bench::check_ends(p, expect_size, peer, channel)) {
      throw std::runtime_error(where() + ": first or last payload byte is wrong (size " + std::to_string(expect_size) +
                               ")");
    }
    if (full_check) {
      const long long bad = bench::check_pattern(p, expect_size, peer, channel);
      if (bad >= 0) {
        throw std::runtime_error(where() + ": payload byte " + std::to_string(bad) + " of " +
                                 std::to_string(expect_size) + " is wrong");
      }
    }
  }

  static int target_id(int channel) { return 1 + channel; }
};

// Whether waiting threads yield after an empty poll. `auto`: when the benchmark's own busy
// threads (all ranks share the host) outnumber the cores. `on` also covers a machine that
// other work keeps busy: a spinning waiter there can hold a core for a whole time slice while
// the thread it waits for is not running. `off` never yields.
bool decide_yield(const std::string& mode, unsigned busy_threads) {
  if (mode == "on") return true;
  if (mode == "off") return false;
  return busy_threads > std::max(1u, std::thread::hardware_concurrency());
}

// (A designated initializer would do, but GCC's -Wextra flags the fields it leaves out.)
// An empty lock model leaves FERRY_LOCK_MODEL (or the default) in force.
ferry::RuntimeOptions runtime_options(int devices, const std::string& lock_model) {
  ferry::RuntimeOptions o;
  o.devices = devices;
  o.lock_model = lock_model;
  return o;
}

// The backends the run actually used ("shm", "ofi/shm", "shm+ofi/tcp;ofi_rxm").
void add_transport(json& j, const ferry::Runtime& rt) { j["transport"] = rt.transport(); }

// Everything a subcommand shares: the runtime, one inbox per thread, exposed under ids 1..T.
struct Job {
  ferry::Runtime rt;
  int threads;
  int devices;
  bool yield;
  std::vector<std::unique_ptr<ferry::CompletionQueue>> inboxes;
  std::vector<std::unique_ptr<Mailbox>> mailboxes;  // --inbox handler only
  std::vector<std::unique_ptr<Responder>> responders;  // --inbox reply only
  std::vector<std::unique_ptr<ferry::Handler>> handlers;
  std::vector<ferry::Exposure> exposures;

  Job(int threads_, int devices_, const std::string& lock_model, const std::string& yield_mode,
      bool handler_inbox = false, std::size_t reply_size = 0, bool reply = false)
      : rt(runtime_options(devices_, lock_model)), threads(threads_) {
    devices = rt.device_count();
    if (rt.options().settings.lock_model == ferry::LockModel::serialized && threads > devices) {
      throw ferry::Error("--threads " + std::to_string(threads) + " on " + std::to_string(devices) +
                         " devices: the serialized lock model lets one thread at a time into a device (run at most "
                         "as many threads as devices; msgrate and pingpong take --devices)");
    }
    // All ranks of a ferryrun job share the host, so they compete for the same cores.
    yield = decide_yield(yield_mode, static_cast<unsigned>(threads) * static_cast<unsigned>(rt.size()));
    for (int t = 0; t < threads; ++t) {
      inboxes.push_back(std::make_unique<ferry::CompletionQueue>());
      const auto id = static_cast<std::uint16_t>(Lane::target_id(t));
      if (reply) {
        auto r = std::make_unique<Responder>();
        r->dev = &rt.device(t % devices);
        r->rank = rt.rank();
        r->peer = rt.rank() == 0 ? 1 : 0;
        r->channel = t;
        r->size = reply_size;
        r->payload.resize(std::max<std::size_t>(reply_size, 1));
        bench::fill_pattern(r->payload.data(), reply_size, rt.rank(), t);
        if (reply_size != 0) {
          r->first = bench::pattern_byte(r->peer, t, 0);
          r->last = bench::pattern_byte(r->peer, t, reply_size - 1);
        }
        Responder* rp = r.get();
        responders.push_back(std::move(r));
        handlers.push_back(std::make_unique<ferry::Handler>([rp](ferry::Completion&& c) { rp->on_message(std::move(c)); }));
        exposures.push_back(rt.expose(*handlers.back(), id));
      } else if (handler_inbox) {
        mailboxes.push_back(std::make_unique<Mailbox>());
        Mailbox* m = mailboxes.back().get();
        handlers.push_back(std::make_unique<ferry::Handler>([m](ferry::Completion&& c) { m->put(std::move(c)); }));
        exposures.push_back(rt.expose(*handlers.back(), id));
      } else {
        exposures.push_back(rt.expose(*inboxes.back(), id));
      }
    }
    // Every inbox exists before any rank sends (ferry would hold early messages anyway, but
    // the first timed round trip should not include that).
    rt.barrier();
  }

  // Thread t's lane; it talks on channel t unless told otherwise (and then receives from that
  // channel's inbox, shared with whoever else uses it).
  std::unique_ptr<Lane> lane(int t, int channel = -1) {
    if (channel < 0) channel = t;
    const int peer = rt.rank() == 0 ? 1 : 0;
    Mailbox* m = mailboxes.empty() ? nullptr : mailboxes[static_cast<std::size_t>(channel)].get();
    return std::unique_ptr<Lane>(new Lane{rt, rt.device(t % devices), *inboxes[static_cast<std::size_t>(channel)], t,
                                          channel, peer, yield, {}, 0, m});
  }

  json base(const char* bench_name, std::int64_t size) {
    json j{{"bench", bench_name},
                {"size", size},
                {"threads", threads},
                {"devices", devices},
                {"provider", rt.provider()},
                {"ranks", rt.size()},
                {"lock_model", rt.options().value("lock_model")},
                {"eager_limit", rt.device(0).eager_limit()},
                {"yield", yield},
                {"ferry_version", ferry::version()}};
    add_transport(j, rt);
    return j;
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

int run_pingpong(const bench::PingpongArgs& a, int threads, int devices, const std::string& lock_model,
                 const std::string& yield_mode, const std::string& inbox) {
  Job job(threads, devices, lock_model, yield_mode, inbox == "handler", static_cast<std::size_t>(a.size),
          inbox == "reply");
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

  if (rank <= 1 && inbox == "reply") {
    run_threads(threads, [&](int t) {
      auto lane = job.lane(t);
      Responder& r = *job.responders[static_cast<std::size_t>(t)];
      const std::int64_t total = a.warmup + a.iters;
      r.total.store(total, std::memory_order_relaxed);
      auto check = [&] {
        if (r.failure.load(std::memory_order_acquire) == 2) throw std::runtime_error(r.error);
      };
      // Progress until `count` messages have arrived and nothing is owed, posting what a
      // handler could not (one at a time: a ping-pong has one message in flight).
      auto wait_for = [&](std::int64_t count) {
        while (r.received.load(std::memory_order_acquire) < count || r.owed.load(std::memory_order_acquire)) {
          check();
          lane->poll();
          // Cleared before the post: once it is out, the answer's handler may owe the next one.
          if (r.owed.exchange(false, std::memory_order_acq_rel) && !r.post()) r.owed.store(true, std::memory_order_release);
        }
        check();
      };
      if (rank == 0) {
        start_line.arrive_and_wait();
        // One run: `n` round trips, the first ping from here, the rest from the handler.
        auto run = [&](std::int64_t n) {
          const std::int64_t end = r.received.load(std::memory_order_relaxed) + n;
          r.stop.store(end, std::memory_order_relaxed);
          while (!r.post()) lane->poll();
          wait_for(end);
        };
        if (a.warmup > 0) run(a.warmup);
        double sum_s = 0.0;
        for (std::int64_t k = 0; k < reps; ++k) {
          const std::int64_t n = a.iters / reps + (k < a.iters % reps ? 1 : 0);
          const auto t0 = Clock::now();
          run(n);
          const double s = bench::seconds_since(t0);
          sum_s += s;
          chunk_us[static_cast<std::size_t>(t)].push_back(s / static_cast<double>(n) / 2.0 * 1e6);
        }
        mean_us[static_cast<std::size_t>(t)] = sum_s / static_cast<double>(a.iters) / 2.0 * 1e6;
      } else {
        wait_for(total);
      }
      while (r.sent.count() < r.posted.load(std::memory_order_relaxed)) lane->poll();
      if (r.sent.first_error() != 0) {
        throw std::runtime_error("a send to rank " + std::to_string(r.peer) + " failed with error " +
                                 std::to_string(r.sent.first_error()));
      }
    });
  } else if (rank <= 1) {
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
      j["inbox"] = inbox;
      j["half_rtt_us"] = med;
      j["half_rtt_us_mean"] = avg;
      j["half_rtt_us_min"] = lo;
      j["half_rtt_us_max"] = hi;
      if (threads > 1) j["half_rtt_us_per_thread"] = per_thread;
      bench::print_json(j);
    } else {
      std::printf(
          "pingpong  size %lld B  threads %d  devices %d  lock %s  transport %s  ranks %d: half round trip %.3f us "
          "(median of %lld x %lld iters; mean %.3f, min %.3f, max %.3f)\n",
          static_cast<long long>(a.size), threads, job.devices, rt.options().value("lock_model").c_str(),
          rt.transport().c_str(), rt.size(), med,
          static_cast<long long>(reps), static_cast<long long>(a.iters / reps), avg, lo, hi);
      std::fflush(stdout);
    }
  }
  rt.finalize();
  return 0;
}

// ---- msgrate ----------------------------------------------------------------------------

// A thread's message buffer for msgrate. With --huge-pages it is 2 MiB-aligned and advised for
// transparent huge pages (madvise MADV_HUGEPAGE): a large message then spans a few huge pages
// rather than hundreds of 4 KiB ones, which a cross-memory-attach read of it pins one by one.
class MessageBuffer {
 public:
  MessageBuffer(std::size_t size, bool huge) {
    if (!huge) {
      plain_.resize(std::max<std::size_t>(size, 1));
      return;
    }
    constexpr std::size_t kHuge = std::size_t{2} << 20;
    const std::size_t bytes = (std::max<std::size_t>(size, 1) + kHuge - 1) / kHuge * kHuge;
    huge_ = static_cast<unsigned char*>(std::aligned_alloc(kHuge, bytes));
    if (huge_ == nullptr) throw std::runtime_error("--huge-pages: cannot allocate " + std::to_string(bytes) + " bytes");
    advised_ = madvise(huge_, bytes, MADV_HUGEPAGE) == 0;
  }
  ~MessageBuffer() { std::free(huge_); }
  MessageBuffer(const MessageBuffer&) = delete;
  MessageBuffer& operator=(const MessageBuffer&) = delete;
  unsigned char* data() noexcept { return huge_ != nullptr ? huge_ : plain_.data(); }
  // False when the kernel refused the advice (transparent huge pages off): the run then
  // measures ordinary pages, and says so.
  bool advised() const noexcept { return advised_; }

 private:
  std::vector<unsigned char> plain_;
  unsigned char* huge_ = nullptr;
  bool advised_ = false;
};

int run_msgrate(const bench::MsgrateArgs& a, int threads, int devices, const std::string& lock_model,
                 const std::string& yield_mode, bool huge_pages) {
  Job job(threads, devices, lock_model, yield_mode);
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
  std::atomic<bool> huge_refused{false};

  if (rank <= 1) {
    run_threads(threads, [&](int t) {
      auto lane = job.lane(t);
      MessageBuffer buf(size, huge_pages);
      if (huge_pages && !buf.advised()) huge_refused.store(true, std::memory_order_relaxed);
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
      // Rank 0's buffers only: rank 1's advice is its own (it prints nothing).
      j["huge_pages"] = huge_pages ? (huge_refused.load() ? "refused" : "advised") : "off";
      bench::print_json(j);
    } else {
      std::printf(
          "msgrate   size %lld B  threads %d  devices %d  lock %s  transport %s  ranks %d: %.0f msgs/s (%.2f MB/s; "
          "%lld messages in windows of %lld, %.3f s)\n",
          static_cast<long long>(a.size), threads, job.devices, rt.options().value("lock_model").c_str(),
          rt.transport().c_str(), rt.size(), rate,
          rate * static_cast<double>(size) / 1e6, static_cast<long long>(a.count * threads),
          static_cast<long long>(window), secs);
      std::fflush(stdout);
    }
  }
  rt.finalize();
  return 0;
}

// ---- contention -------------------------------------------------------------------------
//
// [Combining]'s micro-benchmarks: the threads of a rank share ONE device and all do the same
// thing at once, so the rate shows how the device's lock model (--lock-model, else
// FERRY_LOCK_MODEL) copes with contention.
//   send  T threads on rank 0 each stream active messages to their own receiving thread
//         (and inbox) on rank 1, which acknowledges every window;
//   recv  one thread on rank 0 streams count x T messages into one inbox on rank 1, where T
//         threads progress the device and pop that inbox at once;
//   put   T threads on rank 0 each put into their own slot of a region on rank 1, waiting for
//         the local completions of each window; one thread on rank 1 progresses.

enum class Pattern { send, recv, put };

Pattern parse_pattern(const std::string& name) {
  if (name == "recv") return Pattern::recv;
  if (name == "put") return Pattern::put;
  return Pattern::send;  // the command line admits only send, recv and put
}

// The sender keeps at most this many windows unacknowledged: never more than the receiver's
// packets can hold, and the pipe does not drain while an acknowledgement travels back.
constexpr std::int64_t kWindowsInFlight = 2;
constexpr std::size_t kAckSize = 8;

std::int64_t windows_of(std::int64_t n, std::int64_t window) { return (n + window - 1) / window; }

// Sends n messages in windows of `window` (the last may be shorter); every window is
// acknowledged by one 8-byte message on the same channel.
void stream(Lane& lane, const unsigned char* buf, std::size_t size, std::int64_t n, std::int64_t window) {
  const std::int64_t windows = windows_of(n, window);
  std::int64_t acked = 0;
  for (std::int64_t w = 0, sent = 0; w < windows; ++w) {
    for (; acked + kWindowsInFlight <= w; ++acked) lane.receive(kAckSize, false);
    const std::int64_t k = std::min(window, n - sent);
    for (std::int64_t i = 0; i < k; ++i) lane.send(buf, size);
    sent += k;
  }
  for (; acked < windows; ++acked) lane.receive(kAckSize, false);
}

// The receiving side of stream() on a channel of its own.
void drain(Lane& lane, std::size_t size, std::int64_t n, std::int64_t window, const unsigned char* ack) {
  for (std::int64_t done = 0; done < n;) {
    const std::int64_t k = std::min(window, n - done);
    for (std::int64_t i = 0; i < k; ++i) lane.receive(size, done == 0 && i == 0);
    lane.send(ack, kAckSize);
    done += k;
  }
}

// The receiving side of stream() shared by several threads: all pop one inbox, and whoever pops
// the message that completes a window acknowledges it. The sender only counts acknowledgements,
// so two of them overtaking each other is harmless. `total` covers every phase; phases are
// whole windows except the last, so windows end at multiples of `window` and at `total`.
void drain_shared(Lane& lane, std::size_t size, std::int64_t total, std::int64_t window,
                  std::atomic<std::int64_t>& popped, const unsigned char* ack) {
  // relaxed: the count only decides who acknowledges and when to stop; the messages
  // themselves were handed over by the queue.
  while (popped.load(std::memory_order_relaxed) < total) {
    if (auto c = lane.inbox.pop()) {
      lane.validate(*c, size, false);
      const std::int64_t n = popped.fetch_add(1, std::memory_order_relaxed) + 1;
      if (n % window == 0 || n == total) lane.send(ack, kAckSize);
    } else {
      lane.poll();
    }
  }
}

// Puts n times into this lane's slot, waiting for the local completions of the posted ones
// after every window (puts up to the provider's inject size are done at once and wait for
// nothing). Then an 8-byte active message to rank 1's one inbox, tagged with this lane's
// channel, which rank 1 acknowledges: the phase ends when rank 1 has heard from this thread.
// With `notify` the end is a notifying put of the slot instead (one operation; but see
// bench/README.md: on shm, with several threads putting, it can crash the target).
void put_phase(Lane& lane, ferry::PutArgs args, std::int64_t n, std::int64_t window, const unsigned char* flush,
               bool notify) {
  auto post = [&lane](const ferry::PutArgs& a) {
    ferry::Status s;
    while ((s = lane.dev.post_put(a)).is_retry()) lane.poll();
    if (s.is_posted()) ++lane.posted;
  };
  for (std::int64_t done = 0; done < n;) {
    const std::int64_t k = std::min(window, n - done);
    for (std::int64_t i = 0; i < k; ++i) post(args);
    lane.wait_sends();
    done += k;
  }
  if (notify) {
    args.notify = true;
    args.notify_target = ferry::RemoteTarget{static_cast<std::uint16_t>(Lane::target_id(0))};
    args.notify_tag = static_cast<ferry::Tag>(lane.channel);
    post(args);
    lane.wait_sends();
  } else {
    lane.send_on(0, lane.channel, flush, kAckSize);
  }
  lane.receive(kAckSize, false);
}

// Rank 1 of `put`: answers `expected` end-of-phase messages (or notifying puts of `size`
// bytes), each with an acknowledgement to the writer's inbox.
void serve_puts(Lane& lane, int writers, std::int64_t expected, bool notify, std::size_t size) {
  for (std::int64_t seen = 0; seen < expected;) {
    auto c = lane.inbox.pop();
    if (!c) {
      lane.poll();
      continue;
    }
    const int writer = static_cast<int>(c->tag);
    if (!c->ok()) throw std::runtime_error("rank 1: an end-of-puts message failed: " + c->error_string());
    const bool good = notify ? c->op == ferry::OpKind::remote_put && c->size == size
                             : c->op == ferry::OpKind::remote_am && c->size == kAckSize &&
                                   bench::check_ends(static_cast<const unsigned char*>(c->buffer.data()), kAckSize,
                                                     lane.peer, writer);
    if (!good || c->rank != lane.peer || writer >= writers) {
      throw std::runtime_error("rank 1: expected an end-of-puts message from rank " + std::to_string(lane.peer) +
                               " with tag < " + std::to_string(writers) + ", got op " + ferry::to_string(c->op) +
                               " rank " + std::to_string(c->rank) + " tag " + std::to_string(c->tag) + " size " +
                               std::to_string(c->size));
    }
    unsigned char ack[kAckSize];
    bench::fill_pattern(ack, kAckSize, lane.rt.rank(), writer);
    lane.send_on(writer, writer, ack, kAckSize);
    ++seen;
  }
}

// Rank 1 of `put`, at the end: every writer's slot holds its pattern. libfabric does not order
// a put before a later message in general, so late puts get a moment (with progress) to land.
void check_put_slots(Lane& lane, const unsigned char* region, std::size_t slot, std::size_t size, int writers) {
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  for (int w = 0; w < writers; ++w) {
    const unsigned char* p = region + static_cast<std::size_t>(w) * slot;
    long long bad;
    while ((bad = bench::check_pattern(p, size, lane.peer, w)) >= 0) {
      if (Clock::now() > deadline) {
        throw std::runtime_error("rank 1: byte " + std::to_string(bad) + " of thread " + std::to_string(w) +
                                 "'s put slot is wrong");
      }
      lane.poll();
    }
  }
}

int run_contention(const bench::ContentionArgs& a, int threads, const std::string& lock_model,
                   const std::string& yield_mode) {
  Job job(threads, 1, lock_model, yield_mode);
  ferry::Runtime& rt = job.rt;
  if (!require_two_ranks(rt, "contention")) {
    rt.finalize();
    return bench::exit_usage;
  }
  const Pattern pattern = parse_pattern(a.pattern);
  const int rank = rt.rank();
  const auto size = static_cast<std::size_t>(a.size);
  const std::int64_t window = a.window;
  // Whole windows, so that the shared receivers of `recv` find a window's end at every multiple.
  const std::int64_t warmup = windows_of(a.warmup < 0 ? window : a.warmup, window) * window;
  const int senders = pattern == Pattern::recv ? 1 : threads;
  const int receivers = pattern == Pattern::put ? 1 : threads;
  const std::int64_t total = a.count * threads;
  // Both ranks' threads share the host's cores (see Job), and here the two sides differ.
  job.yield = decide_yield(yield_mode, static_cast<unsigned>(senders + receivers));

  // put: rank 1's region, one slot per writer, its key published through the bootstrap.
  const std::size_t slot = std::max<std::size_t>(size, 1);
  std::vector<unsigned char> region;
  ferry::MemoryRegion mr;
  ferry::RemoteKey key;
  if (pattern == Pattern::put) {
    if (rank == 1) {
      region.assign(slot * static_cast<std::size_t>(threads), 0);
      mr = rt.device(0).register_memory(region.data(), region.size());
      key = mr.remote_key();
      rt.kv_put("ferry-bench-put-key", std::string(reinterpret_cast<const char*>(&key), sizeof key));
    }
    rt.kv_fence();
    if (rank == 0) {
      const std::string bytes = rt.kv_get(1, "ferry-bench-put-key");
      std::memcpy(&key, bytes.data(), sizeof key);
    }
  }

  std::vector<Clock::time_point> starts(static_cast<std::size_t>(senders));
  std::vector<Clock::time_point> ends(static_cast<std::size_t>(senders));
  // Rank 0's context switches and CPU time over the timed phase: from the moment every sender
  // has finished its warmup to the moment the last one has its final acknowledgement.
  Usage usage_start;
  Usage usage_end;
  std::atomic<int> senders_running{senders};
  std::barrier start_line(senders, [&usage_start]() noexcept { usage_start = Usage::begin(); });
  std::atomic<std::int64_t> popped{0};

  // Rank 1 has no timed phase of its own: its usage covers its threads' whole run (warmup,
  // one window per thread by default, included).
  const Usage rank1_start = rank == 1 ? Usage::begin() : Usage{};
  if (rank <= 1) {
    run_threads(rank == 0 ? senders : receivers, [&](int t) {
      // Every buffer is made here, before the timed loops, which allocate nothing.
      std::vector<unsigned char> buf(slot);
      bench::fill_pattern(buf.data(), size, rank, t);
      unsigned char ack[kAckSize];
      bench::fill_pattern(ack, kAckSize, rank, pattern == Pattern::recv ? 0 : t);
      const auto ti = static_cast<std::size_t>(t);
      if (rank == 0) {
        auto lane = job.lane(t);
        ferry::PutArgs put;
        put.rank = lane->peer;
        put.buffer = buf.data();
        put.size = size;
        put.remote = key;
        put.offset = ti * slot;
        put.local = &lane->sent;
        const std::int64_t n = pattern == Pattern::recv ? total : a.count;
        auto phase = [&](std::int64_t k) {
          if (pattern == Pattern::put) {
            if (k > 0) put_phase(*lane, put, k, window, ack, a.notify);
          } else {
            stream(*lane, buf.data(), size, k, window);
          }
        };
        phase(warmup);
        start_line.arrive_and_wait();
        starts[ti] = Clock::now();
        phase(n);
        ends[ti] = Clock::now();
        if (senders_running.fetch_sub(1) == 1) usage_end = Usage::end("contention timed phase");
        lane->wait_sends();
      } else if (pattern == Pattern::send) {
        auto lane = job.lane(t);
        drain(*lane, size, warmup, window, ack);
        drain(*lane, size, a.count, window, ack);
        lane->wait_sends();
      } else if (pattern == Pattern::recv) {
        auto lane = job.lane(t, 0);
        drain_shared(*lane, size, warmup + total, window, popped, ack);
        lane->wait_sends();
      } else {
        auto lane = job.lane(t, 0);
        serve_puts(*lane, threads, threads * (warmup > 0 ? 2 : 1), a.notify, size);
        check_put_slots(*lane, region.data(), slot, size, threads);
        lane->wait_sends();
      }
    });
  }
  const Usage usage = rank == 0   ? usage_end.since(usage_start)
                      : rank == 1 ? Usage::end("contention receivers").since(rank1_start)
                                  : Usage{};
  if (g_failed.load()) die(&rt, g_error);

  // What the lock model did on each side (deferred and combined calls) and what the operating
  // system saw (context switches, CPU time), through the bootstrap.
  rt.barrier();
  const ferry::DeviceStats mine = rt.device(0).stats();
  rt.kv_put("ferry-bench-stats", std::to_string(mine.deferred) + " " + std::to_string(mine.combined) + " " +
                                     std::to_string(mine.max_combined_batch) + " " +
                                     std::to_string(usage.voluntary) + " " + std::to_string(usage.involuntary) +
                                     " " + std::to_string(usage.cpu_seconds));
  rt.kv_fence();

  if (rank == 0) {
    unsigned long long d1 = 0, c1 = 0, b1 = 0;
    long vol1 = 0, invol1 = 0;
    double cpu1 = 0.0;
    const std::string theirs = rt.kv_get(1, "ferry-bench-stats");
    if (std::sscanf(theirs.c_str(), "%llu %llu %llu %ld %ld %lf", &d1, &c1, &b1, &vol1, &invol1, &cpu1) != 6) {
      die(&rt, "bad statistics from rank 1");
    }
    const auto first = *std::min_element(starts.begin(), starts.end());
    const auto last = *std::max_element(ends.begin(), ends.end());
    const double secs = std::chrono::duration<double>(last - first).count();
    const double rate = static_cast<double>(total) / secs;
    const std::string model = rt.options().value("lock_model");
    if (a.json) {
      json j = job.base("contention", a.size);
      j["pattern"] = a.pattern;
      if (pattern == Pattern::put) j["notify"] = a.notify;
      j["senders"] = senders;
      j["receivers"] = receivers;
      j["count"] = a.count;
      j["window"] = window;
      j["warmup"] = warmup;
      j["total_messages"] = total;
      j["seconds"] = secs;
      j["msgs_per_s"] = rate;
      j["mbytes_per_s"] = rate * static_cast<double>(size) / 1e6;
      j["deferred"] = {mine.deferred, d1};
      j["combined"] = {mine.combined, c1};
      j["max_combined_batch"] = {mine.max_combined_batch, b1};
      // [rank 0, rank 1]: rank 0 over the timed phase, rank 1 over its threads' whole run.
      const double n = static_cast<double>(total);
      j["vol_ctx_switches"] = {usage.voluntary, vol1};
      j["invol_ctx_switches"] = {usage.involuntary, invol1};
      j["vol_ctx_per_msg"] = {static_cast<double>(usage.voluntary) / n, static_cast<double>(vol1) / n};
      j["invol_ctx_per_msg"] = {static_cast<double>(usage.involuntary) / n, static_cast<double>(invol1) / n};
      j["cpu_seconds"] = {usage.cpu_seconds, cpu1};
      j["cpu_us_per_msg"] = {usage.cpu_seconds / n * 1e6, cpu1 / n * 1e6};
      bench::print_json(j);
    } else {
      std::printf(
          "contention %-4s  lock %-8s  threads %d (%d sending, %d receiving)  size %lld B  transport %s: %.0f msgs/s "
          "(%lld messages in windows of %lld, %.3f s; deferred %llu/%llu, combined %llu/%llu on rank 0/1)\n",
          a.pattern.c_str(), model.c_str(), threads, senders, receivers, static_cast<long long>(a.size),
          rt.transport().c_str(), rate, static_cast<long long>(total), static_cast<long long>(window), secs,
          static_cast<unsigned long long>(mine.deferred), d1, static_cast<unsigned long long>(mine.combined), c1);
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
int run_cq(std::int64_t ops, int threads, bool as_json, ferry::QueueKind kind, const std::string& yield_mode) {
  ferry::Runtime rt;
  if (kind == ferry::QueueKind::default_kind) kind = ferry::default_queue_kind();
  ferry::CompletionQueueOptions queue_options;
  queue_options.kind = kind;
  ferry::CompletionQueue queue(queue_options);
  const bool yield = decide_yield(yield_mode, static_cast<unsigned>(threads) * static_cast<unsigned>(rt.size()));
  std::vector<Clock::time_point> starts(static_cast<std::size_t>(threads));
  std::vector<Clock::time_point> ends(static_cast<std::size_t>(threads));
  std::atomic<std::int64_t> popped{0};
  // This process's context switches and CPU time from the moment every thread is at the start
  // line to the moment the last one is done.
  Usage usage_start;
  Usage usage_end;
  std::atomic<int> running{threads};
  std::barrier start_line(threads, [&usage_start]() noexcept { usage_start = Usage::begin(); });
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
    if (running.fetch_sub(1) == 1) usage_end = Usage::end("cq timed phase");
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
    const Usage usage = usage_end.since(usage_start);
    const double n = static_cast<double>(ops * threads);
    if (as_json) {
      json j{{"bench", "cq"},
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
             {"vol_ctx_switches", usage.voluntary},
             {"invol_ctx_switches", usage.involuntary},
             {"vol_ctx_per_msg", static_cast<double>(usage.voluntary) / n},
             {"invol_ctx_per_msg", static_cast<double>(usage.involuntary) / n},
             {"cpu_seconds", usage.cpu_seconds},
             {"cpu_us_per_msg", usage.cpu_seconds / n * 1e6},
             {"ferry_version", ferry::version()}};
      add_transport(j, rt);
      bench::print_json(j);
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
  CLI::App app{"ferry-bench: ferry's active-message latency and message rate, alone and under contention, "
               "completion queue speed, and collectives"};
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

  std::string lock_model;  // empty: FERRY_LOCK_MODEL, else ferry's default
  std::string yield_mode = "auto";
  std::string inbox = "queue";
  auto add_yield = [&](CLI::App* sub) {
    sub->add_option("--yield", yield_mode,
                    "waiting threads yield after an empty poll: auto (when busy threads outnumber the cores), on, off")
        ->check(CLI::IsMember({"auto", "on", "off"}));
  };
  auto add_lock_model = [&](CLI::App* sub) {
    sub->add_option("--lock-model", lock_model, "the lock model (default: FERRY_LOCK_MODEL, else lockless)")
        ->check(CLI::IsMember(bench::lock_models));
  };

  bench::PingpongArgs pp;
  CLI::App* pingpong = app.add_subcommand(
      "pingpong", "rank 0 and 1 bounce an active message of --size bytes; prints the half round trip time");
  bench::add_pingpong_options(pingpong, pp);
  add_threads(pingpong);
  add_devices(pingpong);
  add_lock_model(pingpong);
  add_yield(pingpong);
  pingpong
      ->add_option("--inbox", inbox,
                   "how a message reaches the waiting thread: queue (a CompletionQueue it pops), handler (a "
                   "Handler run inside progress parks it in a slot the thread reads) or reply (the Handler answers "
                   "it itself: rank 1 replies, rank 0 sends the next ping)")
      ->check(CLI::IsMember({"queue", "handler", "reply"}));

  bench::MsgrateArgs mr;
  CLI::App* msgrate = app.add_subcommand(
      "msgrate", "rank 0 streams active messages to rank 1, acknowledged every --window; prints messages/s");
  bench::add_msgrate_options(msgrate, mr);
  add_threads(msgrate);
  add_devices(msgrate);
  add_lock_model(msgrate);
  add_yield(msgrate);
  bool huge_pages = false;
  msgrate->add_flag("--huge-pages", huge_pages,
                    "message buffers 2 MiB-aligned and advised for transparent huge pages (madvise MADV_HUGEPAGE)");

  bench::ContentionArgs ct;
  CLI::App* contention = app.add_subcommand(
      "contention", "the threads of each rank share one device and all send, all receive or all put; prints msgs/s");
  bench::add_contention_options(contention, ct);
  add_threads(contention);
  add_lock_model(contention);
  add_yield(contention);

  std::int64_t ops = 1000000;
  bool cq_json = false;
  CLI::App* cq = app.add_subcommand(
      "cq", "threads push and pop completions through one shared CompletionQueue; prints completions/s");
  cq->add_option("--ops", ops, "completions each thread pushes and pops")
      ->check(bench::integer_in(1, bench::max_count));
  add_threads(cq);
  add_yield(cq);
  std::string cq_queue = "default";
  cq->add_option("--queue", cq_queue, "queue algorithm: ring, faa, ms, lock; default: FERRY_COMPLETION's")
      ->check(CLI::IsMember({"default", "ring", "faa", "ms", "lock"}));
  cq->add_flag("--json", cq_json, "one JSON object per result line");

  bench::CollArgs coll_args;
  CLI::App* coll = app.add_subcommand(
      "coll", "one collective on the whole job's team, back to back; prints the median time per operation");
  bench::add_coll_options(coll, coll_args);

  bench::AtomicBenchArgs atomic_args;
  CLI::App* atomic = app.add_subcommand(
      "atomic", "remote atomics from rank 0 on rank 1's memory: the median latency and rate");
  bench::add_atomic_options(atomic, atomic_args);

  // Under a launcher every rank parses the same command line; one report of a mistake is enough.
  const char* env_rank = std::getenv("PMI_RANK");
  const bool quiet = env_rank != nullptr && std::strcmp(env_rank, "0") != 0;
  if (const int code = bench::parse_or_exit_code(app, argc, argv, quiet); code >= 0) return code;

  try {
    if (pingpong->parsed()) return run_pingpong(pp, threads, devices, lock_model, yield_mode, inbox);
    if (msgrate->parsed()) return run_msgrate(mr, threads, devices, lock_model, yield_mode, huge_pages);
    if (contention->parsed()) return run_contention(ct, threads, lock_model, yield_mode);
    if (coll->parsed()) return bench::run_coll(coll_args);
    if (atomic->parsed()) return bench::run_atomic(atomic_args);
    if (cq->parsed()) {
      ferry::QueueKind kind = ferry::QueueKind::default_kind;
      for (const ferry::QueueKind k :
           {ferry::QueueKind::ring, ferry::QueueKind::faa, ferry::QueueKind::ms, ferry::QueueKind::lock}) {
        if (cq_queue == ferry::to_string(k)) kind = k;
      }
      return run_cq(ops, threads, cq_json, kind, yield_mode);
    }
  } catch (const std::exception& e) {
    die(nullptr, e.what());
  }
  return bench::exit_usage;
}
