// launcher.cpp — ferryrun's single-threaded event loop.
//
// Everything happens in one poll() loop: PMI sockets, captured output pipes, a self-pipe fed
// by the signal handlers, and the deadlines (job timeout, SIGTERM->SIGKILL grace). A single
// thread means no locking between the PMI server, the reaper and the output forwarders.
#include "launcher.hpp"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <optional>

#include "io.hpp"
#include "pmi_server.hpp"
#include "segments.hpp"
#include "spawn.hpp"

namespace ferryrun {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kTermGrace = std::chrono::seconds(2);
// After SIGKILL, how long to keep waiting for stragglers (uninterruptible sleep) before
// giving up rather than hanging the launcher.
constexpr auto kKillGrace = std::chrono::seconds(2);

int g_signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  ssize_t ignored = ::write(g_signal_pipe[1], &b, 1);
  (void)ignored;
  errno = saved;
}

void note(const std::string& msg) { write_all(STDERR_FILENO, "ferryrun: " + msg + "\n"); }

std::string plural(int n, const char* word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

const char* signal_name(int sig) {
  const char* s = ::strsignal(sig);
  return s ? s : "unknown signal";
}

class Launcher {
 public:
  explicit Launcher(const Options& opts)
      : opts_(opts),
        ranks_(static_cast<std::size_t>(opts.size)),
        pmi_(opts.size, "ferryrun_" + std::to_string(::getpid()),
             {[this](int r, std::string_view line) { send(r, line); },
              [this](int r, int code, std::string_view msg) { aborted(r, code, msg); }}) {}

  int run();

 private:
  struct Rank {
    pid_t pid = -1;
    bool alive = false;
    std::time_t ended = 0;  // when it was reaped
    int pmi_fd = -1;
    LineForwarder out, err;
  };

  bool install_signals();
  void start_ranks();
  void loop();
  void handle_signals();
  void reap();
  void rank_exited(int r, int status);
  void read_pmi(int r, bool drain);
  void send(int r, std::string_view line);
  void aborted(int r, int code, std::string_view msg);
  void fail(int code, const std::string& msg, int culprit = -1);
  void terminate();
  void signal_groups(int sig);
  [[nodiscard]] bool any_group_left() const;
  void finish();
  void remove_shm_segments();

  const Options& opts_;
  std::vector<Rank> ranks_;
  PmiServer pmi_;
  int alive_ = 0;
  int exit_code_ = 0;
  bool failed_ = false;       // exit_code_ holds the first failure
  bool terminating_ = false;  // SIGTERM sent; later deaths are consequences, not failures
  bool killed_ = false;       // SIGKILL sent
  Clock::time_point kill_at_, give_up_at_;
  std::optional<Clock::time_point> timeout_at_;
  int null_fd_ = -1;
  std::time_t started_ = 0;  // when the ranks were started (segments from before are not theirs)
  bool unclean_ = false;     // a rank ended by a signal or a non-zero exit code
};

bool Launcher::install_signals() {
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    note(std::string("cannot create the signal pipe: ") + std::strerror(errno));
    return false;
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  // A rank that dies mid-reply, or a closed reader of our stdout, must surface as EPIPE.
  ::signal(SIGPIPE, SIG_IGN);
  return true;
}

int Launcher::run() {
  if (!install_signals()) return kExitLaunchFailed;
  // Descendants orphaned by a dying rank are re-parented to ferryrun instead of init, so
  // they can be reaped here and none outlives the job as a zombie.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  null_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (opts_.timeout_s > 0)
    timeout_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(opts_.timeout_s));
  started_ = std::time(nullptr);
  start_ranks();
  loop();
  finish();
  return exit_code_;
}

void Launcher::start_ranks() {
  const std::vector<std::string> env = inherited_environment();
  // Ranks live in their own process groups, i.e. in the background as far as a terminal is
  // concerned; reading a tty there would stop them with SIGTTIN. So only a redirected stdin
  // is passed on, and only to rank 0, as mpiexec does.
  const bool pass_stdin = !::isatty(STDIN_FILENO);
  for (int r = 0; r < opts_.size && !terminating_; ++r) {
    SpawnRequest req{opts_.argv, &env, r, opts_.size, opts_.prefix_output,
                     (r == 0 && pass_stdin) ? -1 : null_fd_};
    SpawnedRank s = spawn_rank(req);
    if (!s.error.empty() || s.exec_errno != 0) {
      if (s.exec_errno != 0) {
        fail(s.exec_errno == ENOENT ? kExitNotFound : kExitCannotExecute,
             "cannot execute '" + opts_.argv[0] + "': " + std::strerror(s.exec_errno));
      } else {
        fail(kExitLaunchFailed, s.error);
      }
      break;
    }
    Rank& rk = ranks_[static_cast<std::size_t>(r)];
    rk.pid = s.pid;
    rk.alive = true;
    rk.pmi_fd = s.pmi_fd;
    set_nonblocking(rk.pmi_fd);
    if (s.out_fd >= 0) rk.out = LineForwarder(s.out_fd, STDOUT_FILENO, r);
    if (s.err_fd >= 0) rk.err = LineForwarder(s.err_fd, STDERR_FILENO, r);
    ++alive_;
  }
}

void Launcher::loop() {
  std::vector<pollfd> fds;
  std::vector<std::pair<int, int>> owner;  // (rank, 0=pmi 1=stdout 2=stderr) per fds entry
  for (;;) {
    if (alive_ == 0) {
      reap();  // collect re-parented descendants that already died
      if (!any_group_left()) return;
      // Every rank is gone but something it started lingers: end it like a failed job.
      if (!terminating_) {
        note("all ranks have exited; terminating the processes they left behind");
        terminate();
      }
    }
    const auto now = Clock::now();
    if (!terminating_ && timeout_at_ && now >= *timeout_at_) {
      if (!failed_) {
        failed_ = true;
        exit_code_ = kExitTimeout;
      }
      note("timeout after " + opts_.timeout_text + " s; terminating " + plural(alive_, "rank"));
      terminate();
    }
    if (terminating_ && !killed_ && now >= kill_at_) {
      signal_groups(SIGKILL);
      killed_ = true;
      give_up_at_ = now + kKillGrace;
    }
    if (killed_ && now >= give_up_at_) {
      if (alive_ > 0) note("giving up on " + plural(alive_, "rank") + " that survived SIGKILL");
      return;
    }

    int wait_ms = -1;
    auto until = [&](Clock::time_point t) {
      auto ms = std::chrono::ceil<std::chrono::milliseconds>(t - now).count();
      int v = static_cast<int>(std::clamp<long long>(ms, 0, 1 << 30));
      wait_ms = wait_ms < 0 ? v : std::min(wait_ms, v);
    };
    if (!terminating_ && timeout_at_) until(*timeout_at_);
    if (terminating_) until(killed_ ? give_up_at_ : kill_at_);
    // Orphans re-parented elsewhere send no SIGCHLD here; poll their groups periodically.
    if (terminating_ && alive_ == 0) until(now + std::chrono::milliseconds(50));

    fds.clear();
    owner.clear();
    fds.push_back({g_signal_pipe[0], POLLIN, 0});
    owner.emplace_back(-1, -1);
    for (int r = 0; r < opts_.size; ++r) {
      Rank& rk = ranks_[static_cast<std::size_t>(r)];
      const int fdv[3] = {rk.pmi_fd, rk.out.fd(), rk.err.fd()};
      for (int k = 0; k < 3; ++k)
        if (fdv[k] >= 0) {
          fds.push_back({fdv[k], POLLIN, 0});
          owner.emplace_back(r, k);
        }
    }
    int n = ::poll(fds.data(), fds.size(), wait_ms);
    if (n < 0 && errno != EINTR) {
      note(std::string("poll failed: ") + std::strerror(errno));
      terminate();
      continue;
    }
    // Data before deaths: output and PMI messages (an abort, say) sent just before a rank
    // exited should be handled before its exit status is judged.
    for (std::size_t i = 1; n > 0 && i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto [r, kind] = owner[i];
      Rank& rk = ranks_[static_cast<std::size_t>(r)];
      if (kind == 0) read_pmi(r, false);
      else if (kind == 1) rk.out.read_available();
      else rk.err.read_available();
    }
    if (n > 0 && fds[0].revents != 0) handle_signals();
  }
}

void Launcher::handle_signals() {
  unsigned char buf[64];
  ssize_t n;
  while ((n = ::read(g_signal_pipe[0], buf, sizeof buf)) > 0) {
    for (ssize_t i = 0; i < n; ++i) {
      const int sig = buf[i];
      if (sig == SIGCHLD) continue;  // reaped below, once for the whole batch
      const char* name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP";
      if (!terminating_) {
        if (!failed_) {
          failed_ = true;
          exit_code_ = 128 + sig;
        }
        note(std::string("caught ") + name + "; terminating " + plural(alive_, "rank"));
        terminate();
      } else if (!killed_) {
        // Asking twice means the user will not wait out the grace period.
        note(std::string("caught ") + name + " again; killing " + plural(alive_, "rank"));
        signal_groups(SIGKILL);
        killed_ = true;
        give_up_at_ = Clock::now() + kKillGrace;
      }
    }
  }
  reap();
}

void Launcher::reap() {
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) return;
    for (int r = 0; r < opts_.size; ++r)
      if (ranks_[static_cast<std::size_t>(r)].pid == pid) rank_exited(r, status);
    // Any other pid was a descendant re-parented to us; reaping it was the whole point.
  }
}

void Launcher::rank_exited(int r, int status) {
  Rank& rk = ranks_[static_cast<std::size_t>(r)];
  if (!rk.alive) return;
  rk.alive = false;
  rk.ended = std::time(nullptr);
  --alive_;
  read_pmi(r, true);
  // Descendants may hold the pipes open indefinitely, so take what the rank wrote and stop.
  rk.out.finish();
  rk.err.finish();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) unclean_ = true;
  if (terminating_) return;
  const std::string who = "rank " + std::to_string(r) + " (pid " + std::to_string(rk.pid) + ")";
  int code = 0;
  std::string what;
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
    code = WEXITSTATUS(status);
    what = who + " exited with code " + std::to_string(code);
  } else if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    code = 128 + sig;
    what = who + " was killed by signal " + std::to_string(sig) + " (" + signal_name(sig) + ")";
  }
  // Exit 0 is success even without PMI finalize: the other ranks keep running.
  if (code == 0) return;
  if (opts_.keep_going) {
    if (!failed_) {
      failed_ = true;
      exit_code_ = code;
    }
    note(what + "; --keep-going: the other " + plural(alive_, "rank") + " run on");
    return;
  }
  fail(code, what);
}

void Launcher::read_pmi(int r, bool drain) {
  Rank& rk = ranks_[static_cast<std::size_t>(r)];
  char buf[16384];
  while (rk.pmi_fd >= 0) {
    ssize_t n = ::read(rk.pmi_fd, buf, sizeof buf);
    if (n > 0) {
      pmi_.feed(r, std::string_view(buf, static_cast<std::size_t>(n)));
      if (!drain) return;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!drain) return;
    }
    // EOF, a reset, or a rank that is gone: the connection is over either way.
    close_fd(rk.pmi_fd);
    pmi_.disconnect(r);
  }
}

void Launcher::send(int r, std::string_view line) {
  Rank& rk = ranks_[static_cast<std::size_t>(r)];
  if (rk.pmi_fd < 0) return;
  std::string msg(line);
  msg.push_back('\n');
  write_all(rk.pmi_fd, msg);  // a rank that vanished just misses its reply
}

void Launcher::aborted(int r, int code, std::string_view msg) {
  if (terminating_) return;
  std::string text = "rank " + std::to_string(r) + " (pid " +
                     std::to_string(ranks_[static_cast<std::size_t>(r)].pid) +
                     ") called PMI abort with code " + std::to_string(code);
  if (!msg.empty()) text += ": " + std::string(msg);
  fail(code, text, r);
}

void Launcher::fail(int code, const std::string& msg, int culprit) {
  if (!failed_) {
    failed_ = true;
    exit_code_ = code;
  }
  note(msg);
  // An aborting rank is still running and is terminated too, but it is not one of "the other".
  const int others =
      alive_ - (culprit >= 0 && ranks_[static_cast<std::size_t>(culprit)].alive ? 1 : 0);
  if (others > 0) note("terminating the other " + plural(others, "rank"));
  terminate();
}

void Launcher::terminate() {
  if (terminating_) return;
  terminating_ = true;
  kill_at_ = Clock::now() + kTermGrace;
  signal_groups(SIGTERM);
}

void Launcher::signal_groups(int sig) {
  // Groups of ranks already reaped are signalled too: their descendants may live on. A
  // group id stays reserved while any member exists, so this cannot hit a stranger's group.
  for (const Rank& rk : ranks_)
    if (rk.pid > 0) ::kill(-rk.pid, sig);
}

bool Launcher::any_group_left() const {
  for (const Rank& rk : ranks_)
    if (rk.pid > 0 && ::kill(-rk.pid, 0) == 0) return true;
  return false;
}

void Launcher::finish() {
  for (int r = 0; r < opts_.size; ++r) {
    Rank& rk = ranks_[static_cast<std::size_t>(r)];
    rk.out.finish();
    rk.err.finish();
    close_fd(rk.pmi_fd);
  }
  reap();
  remove_shm_segments();
  close_fd(null_fd_);
  close_fd(g_signal_pipe[0]);
  close_fd(g_signal_pipe[1]);
}

void Launcher::remove_shm_segments() {
  EndedJob job{.ranks = {}, .started = started_, .unclean = unclean_ || failed_, .sweep_ucx = opts_.sweep_ucx};
  for (const Rank& rk : ranks_) job.ranks.push_back(EndedRank{.pid = rk.pid, .ended = rk.ended});
  for (const std::string& line : remove_left_segments(job)) note(line);
}

}  // namespace

int run_job(const Options& opts) {
  Launcher launcher(opts);
  return launcher.run();
}

}  // namespace ferryrun
