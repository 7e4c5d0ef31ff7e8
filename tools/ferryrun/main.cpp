// main.cpp — ferryrun's command line: parse, validate, hand over to the launcher.
#include <CLI/CLI.hpp>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fcntl.h>
#include <iostream>
#include <optional>
#include <string>
#include <unistd.h>

#include "launcher.hpp"

#ifndef FERRYRUN_VERSION
#define FERRYRUN_VERSION "unknown"
#endif

namespace {

constexpr const char* kUsage = "ferryrun -n N [OPTIONS] [--] PROGRAM [ARGS...]";

constexpr const char* kFooter = R"(
ferryrun starts N copies of PROGRAM on this machine and serves them the PMI-1 wire
protocol (the one MPICH's hydra speaks), so ferry programs find each other exactly as
they would under mpiexec.hydra.

Options are read only up to PROGRAM; everything after it is passed to the program
untouched ("ferryrun -n 2 ./bench -n 8" gives the program "-n 8"). Use "--" before a
program whose name starts with '-'.

Each rank gets PMI_FD, PMI_RANK, PMI_SIZE and FERRY_LAUNCHER=ferryrun in its environment;
PMIX_* and PMI_PORT from an outer launcher are removed. Each rank runs in its own process
group. Only rank 0 receives ferryrun's stdin, and only when it is not a terminal.

If any rank exits non-zero, is killed by a signal or calls PMI abort, ferryrun reports
it, sends SIGTERM to the other ranks and everything they started, and SIGKILL 2 s later
(with --keep-going it reports it and lets the others run on: ferry programs learn of the
failed rank themselves, see Runtime::failed_ranks).
Ctrl-C, SIGTERM and SIGHUP to ferryrun do the same (a second Ctrl-C kills at once).
Afterwards ferryrun removes the /dev/shm segments the ranks left behind; after a failed
job also UCX's that no process holds (see README.md; --keep-ucx-segments to leave them).

Environment:
  FERRY_TIMEOUT=S   default for --timeout

Exit status:
  0        every rank exited 0
  C        the first failing rank's exit code (or PMI abort code)
  128+SIG  the first failing rank was killed by SIG, or ferryrun received SIG
  124      --timeout expired
  126/127  PROGRAM could not be executed / was not found
  2        bad command line

Examples:
  ferryrun -n 4 ./pingpong
  ferryrun -n 2 --timeout 30 --no-prefix ./bench --size 8)";

class UsageFormatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string) const override {
    return std::string("Usage: ") + kUsage + "\n";
  }
};

int usage_error(const std::string& msg) {
  std::cerr << "ferryrun: " << msg << "\nRun 'ferryrun --help' for usage.\n";
  return ferryrun::kExitUsage;
}

std::optional<int> parse_rank_count(const std::string& text) {
  int v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || v <= 0) return std::nullopt;
  return v;
}

std::optional<double> parse_seconds(const std::string& text) {
  // Beyond ~30 years a deadline stops meaning anything and risks clock overflow.
  constexpr double kMaxSeconds = 1e9;
  double v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || !std::isfinite(v) || v < 0 ||
      v > kMaxSeconds)
    return std::nullopt;
  return v;
}

// The launcher dup2()s onto 0..2 in each child and assumes fresh fds land above them; a
// closed standard fd would otherwise be handed out as a PMI socket or pipe end.
void ensure_standard_fds() {
  for (int fd = 0; fd < 3; ++fd)
    if (::fcntl(fd, F_GETFD) < 0) {
      int nfd = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
      if (nfd >= 0 && nfd != fd) ::close(nfd);
    }
}

}  // namespace

int main(int argc, char** argv) {
  ensure_standard_fds();

  CLI::App app{"ferryrun: start N local ranks of a ferry (or any PMI-1) program."};
  app.formatter(std::make_shared<UsageFormatter>());
  app.footer(kFooter);
  // Stop at the first positional: the program's own options must not be parsed here.
  app.prefix_command();
  app.set_version_flag("--version", std::string("ferryrun (ferry) ") + FERRYRUN_VERSION);

  std::string n_text, timeout_text;
  bool prefix = true;
  app.add_option("-n,--np", n_text, "Number of ranks to start (required, > 0)")
      ->type_name("N");
  app.add_option("--timeout", timeout_text,
                 "Kill the job after S seconds, exit 124 (0 = never; "
                 "default $FERRY_TIMEOUT)")
      ->type_name("S");
  bool keep_going = false;
  app.add_flag("--keep-going", keep_going,
               "When a rank fails, report it but let the other ranks run to their own end "
               "(the exit code still names the first failure)");
  bool keep_ucx = false;
  app.add_flag("--keep-ucx-segments", keep_ucx,
               "After a failed job, leave UCX's unheld shared-memory segments in place (for hosts where "
               "processes this ferryrun cannot see, in other containers, share /dev/shm)");
  CLI::Option* with_prefix = app.add_flag("--prefix")->description(
      "Prefix each output line with \"[rank] \" (the default)");
  CLI::Option* without_prefix = app.add_flag("--no-prefix")->description(
      "Ranks write straight to ferryrun's stdout and stderr");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return usage_error(e.what());
  }

  // When both are given, the later one wins, like any repeated option.
  for (const CLI::Option* opt : app.parse_order()) {
    if (opt == with_prefix) prefix = true;
    if (opt == without_prefix) prefix = false;
  }

  ferryrun::Options opts;
  opts.prefix_output = prefix;
  opts.keep_going = keep_going;
  opts.sweep_ucx = !keep_ucx;
  opts.argv = app.remaining();
  if (!opts.argv.empty() && opts.argv.front() == "--") {
    opts.argv.erase(opts.argv.begin());
  } else if (!opts.argv.empty() && opts.argv.front().size() > 1 &&
             opts.argv.front()[0] == '-') {
    // Unknown options before the program land here rather than in a parse error.
    return usage_error("unknown option '" + opts.argv.front() + "'");
  }

  if (n_text.empty()) return usage_error("missing -n N: the number of ranks to start");
  auto n = parse_rank_count(n_text);
  if (!n) return usage_error("invalid value for -n: '" + n_text + "' (expected a positive integer)");
  opts.size = *n;

  const char* env_timeout = std::getenv("FERRY_TIMEOUT");
  std::string timeout_source = "--timeout";
  if (timeout_text.empty() && env_timeout && *env_timeout) {
    timeout_text = env_timeout;
    timeout_source = "FERRY_TIMEOUT";
  }
  if (!timeout_text.empty()) {
    auto t = parse_seconds(timeout_text);
    if (!t)
      return usage_error("invalid value for " + timeout_source + ": '" + timeout_text +
                         "' (expected seconds >= 0, e.g. 30 or 2.5)");
    opts.timeout_s = *t;
    opts.timeout_text = timeout_text;
  }

  if (opts.argv.empty()) return usage_error("missing PROGRAM to run");

  return ferryrun::run_job(opts);
}
