// Shared by ferry-bench and its baselines (ferry-mpi-pingpong, ferry-fi-msgrate), so that every
// program parses the same options the same way, reports with the same JSON keys and computes
// its statistics identically: a ferry/baseline ratio is only meaningful if both sides agree on
// what "median" and "half round trip" mean.
#pragma once

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace bench {

// Exit status for a command line that can never work; scripts tell it apart from a failed run (1).
inline constexpr int exit_usage = 2;

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline double mean(const std::vector<double>& v) {
  if (v.empty()) return 0.0;
  double sum = 0.0;
  for (double x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

// CLI11's Range reports "abc" as "not in range"; this says which of the two went wrong.
inline CLI::Validator integer_in(std::int64_t lo, std::int64_t hi) {
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

// A misspelt subcommand otherwise only gets CLI11's "A subcommand is required". Returns an
// error message naming it, or "".
inline std::string unknown_subcommand(const CLI::App& app, int argc, char** argv) {
  const auto subs = app.get_subcommands([](const CLI::App*) { return true; });
  if (subs.empty() || argc < 2 || argv[1][0] == '-') return {};
  std::string names;
  for (const CLI::App* sub : subs) {
    if (sub->get_name() == argv[1]) return {};
    names += (names.empty() ? "" : ", ") + sub->get_name();
  }
  return "unknown subcommand '" + std::string(argv[1]) + "' (expected one of: " + names + ")";
}

// CLI11 reports its own codes (105, 109, ...); the benchmark contract is 0 for --help and 2 for
// any argument error, with CLI11's message, which names the option and the offending value.
inline int parse_or_exit_code(CLI::App& app, int argc, char** argv, bool quiet) {
  if (const std::string bad = unknown_subcommand(app, argc, argv); !bad.empty()) {
    if (!quiet) std::fprintf(stderr, "%s: error: %s\n", app.get_name().c_str(), bad.c_str());
    return exit_usage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return quiet ? 0 : app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return quiet ? 0 : app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return quiet ? 0 : app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (!quiet) {
      std::fprintf(stderr, "%s: error: %s\n", app.get_name().c_str(), e.what());
      std::fprintf(stderr, "Run with --help for usage.\n");
    }
    return exit_usage;
  }
  return -1;  // parsed; carry on
}

// Options of a ping-pong, shared by ferry and MPI so the two accept identical command lines.
struct PingpongArgs {
  std::int64_t size = 8;
  std::int64_t iters = 10000;
  std::int64_t warmup = 100;
  std::int64_t reps = 5;
  bool json = false;
};

struct MsgrateArgs {
  std::int64_t size = 8;
  std::int64_t count = 100000;
  std::int64_t window = 64;
  std::int64_t warmup = -1;  // -1: one window
  bool json = false;
};

// Sizes are capped at 1 GiB: beyond that a benchmark buffer per thread is not a sensible request.
inline constexpr std::int64_t max_size = std::int64_t{1} << 30;
inline constexpr std::int64_t max_count = std::int64_t{1} << 40;

inline void add_pingpong_options(CLI::App* sub, PingpongArgs& a) {
  sub->add_option("--size", a.size, "message size in bytes")->check(integer_in(std::int64_t{0}, max_size));
  sub->add_option("--iters", a.iters, "timed round trips")->check(integer_in(std::int64_t{1}, max_count));
  sub->add_option("--warmup", a.warmup, "untimed round trips before measuring")
      ->check(integer_in(std::int64_t{0}, max_count));
  sub->add_option("--reps", a.reps,
                  "split the timed round trips into this many chunks; half_rtt_us is their median")
      ->check(integer_in(std::int64_t{1}, std::int64_t{1000}));
  sub->add_flag("--json", a.json, "one JSON object per result line");
}

inline void add_msgrate_options(CLI::App* sub, MsgrateArgs& a) {
  sub->add_option("--size", a.size, "message size in bytes")->check(integer_in(std::int64_t{0}, max_size));
  sub->add_option("--count", a.count, "timed messages (per thread)")->check(integer_in(std::int64_t{1}, max_count));
  sub->add_option("--window", a.window, "messages between acknowledgements")
      ->check(integer_in(std::int64_t{1}, std::int64_t{1} << 20));
  sub->add_option("--warmup", a.warmup, "untimed messages first (default: one window)")
      ->check(integer_in(std::int64_t{0}, max_count));
  sub->add_flag("--json", a.json, "one JSON object per result line");
}

// Options of ferry-bench contention ([Combining]'s micro-benchmarks: T threads on one device).
struct ContentionArgs {
  std::string pattern = "send";  // send, recv, put
  std::int64_t size = 8;
  std::int64_t count = 20000;    // per thread; recv: the one sender sends count x threads
  std::int64_t window = 64;
  std::int64_t warmup = -1;      // -1: one window; rounded up to whole windows
  bool notify = false;           // put: end each phase with a notifying put, not a message
  bool json = false;
};

// The values of FERRY_LOCK_MODEL, checked on the command line so that a misspelt model is an
// argument error (exit 2) before any rank starts a runtime.
// What --lock-model accepts (serialized: one thread per device, which ferry-bench checks).
inline const std::vector<std::string> lock_models = {"lockless", "trylock", "block", "lockq", "csync", "offload", "serialized"};

// Contention sizes stay small: every thread owns a slot of the put region on rank 1.
inline constexpr std::int64_t max_contention_size = std::int64_t{1} << 20;

inline void add_contention_options(CLI::App* sub, ContentionArgs& a) {
  sub->add_option("--pattern", a.pattern,
                  "send: T threads stream active messages; recv: T threads receive one stream; put: T threads put")
      ->check(CLI::IsMember({"send", "recv", "put"}));
  sub->add_option("--size", a.size, "message (put) size in bytes")
      ->check(integer_in(std::int64_t{0}, max_contention_size));
  sub->add_option("--count", a.count, "timed messages (puts) per thread")->check(integer_in(std::int64_t{1}, max_count));
  sub->add_option("--window", a.window, "messages between acknowledgements (put: between waits for local completion)")
      ->check(integer_in(std::int64_t{1}, std::int64_t{1} << 20));
  sub->add_option("--warmup", a.warmup, "untimed messages per thread first (default: one window)")
      ->check(integer_in(std::int64_t{0}, max_count));
  sub->add_flag("--notify", a.notify, "put: end each thread's puts with a notifying put instead of a message");
  sub->add_flag("--json", a.json, "one JSON object per result line");
}

// The pattern a sender writes into message byte i; differs per sender and per thread so a
// message delivered to the wrong thread, or a stale buffer, does not pass the check.
inline unsigned char pattern_byte(int rank, int thread, std::size_t i) {
  return static_cast<unsigned char>(0x5A ^ (rank * 31 + thread * 7 + static_cast<int>(i % 251)));
}

inline void fill_pattern(unsigned char* p, std::size_t n, int rank, int thread) {
  for (std::size_t i = 0; i < n; ++i) p[i] = pattern_byte(rank, thread, i);
}

// Index of the first wrong byte, or -1.
inline long long check_pattern(const unsigned char* p, std::size_t n, int rank, int thread) {
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != pattern_byte(rank, thread, i)) return static_cast<long long>(i);
  }
  return -1;
}

// The cheap check done on every message: only the first and last byte.
inline bool check_ends(const unsigned char* p, std::size_t n, int rank, int thread) {
  if (n == 0) return true;
  return p[0] == pattern_byte(rank, thread, 0) && p[n - 1] == pattern_byte(rank, thread, n - 1);
}

inline void print_json(const nlohmann::json& j) {
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

// Whole-buffer write and read on a two-process baseline's control socket (run_forked_pair).
inline void write_all(int fd, const void* data, std::size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w <= 0) throw std::runtime_error("control socket: write failed");
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}
inline void read_all(int fd, void* data, std::size_t n) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r <= 0) throw std::runtime_error("control socket: the peer process went away");
    p += r;
    n -= static_cast<std::size_t>(r);
  }
}

// A two-process baseline without a launcher (ferry-fi-msgrate, ferry-ucp-pingpong): forks,
// before the caller has touched its network library (not all survive a fork), and runs
// body(1, socket) in the child and body(0, socket) here, the two ends of one socketpair, over
// which the bodies swap addresses and keep in step. A body throws on failure; its message goes
// to stderr, prefixed with `name` and the rank, and rank 0's failure stops the child. Returns
// the exit status: 0 when both bodies returned.
template <class Body>
int run_forked_pair(const char* name, Body body) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
    std::fprintf(stderr, "%s: socketpair: %s\n", name, std::strerror(errno));
    return 1;
  }
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child < 0) {
    std::fprintf(stderr, "%s: fork: %s\n", name, std::strerror(errno));
    ::close(sv[0]);
    ::close(sv[1]);
    return 1;
  }
  if (child == 0) {
    ::close(sv[0]);
    int code = 0;
    try {
      body(1, sv[1]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: rank 1: %s\n", name, e.what());
      code = 1;
    }
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(code);
  }
  ::close(sv[1]);
  int rc = 0;
  try {
    body(0, sv[0]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank 0: %s\n", name, e.what());
    ::kill(child, SIGTERM);
    rc = 1;
  }
  ::close(sv[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (rc == 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) rc = 1;
  return rc;
}

}  // namespace bench
