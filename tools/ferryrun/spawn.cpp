// spawn.cpp — fork/exec of one rank with a PMI socketpair and optional output pipes.
#include "spawn.hpp"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string_view>
#include <utility>

#include "io.hpp"

extern char** environ;

namespace ferryrun {
namespace {

bool is_launcher_variable(std::string_view entry) {
  std::string_view name = entry.substr(0, entry.find('='));
  if (name.rfind("PMIX_", 0) == 0) return true;
  for (std::string_view v : {"PMI_PORT", "PMI_FD", "PMI_RANK", "PMI_SIZE", "PMI_ID",
                             "PMI_SPAWNED", "FERRY_LAUNCHER"})
    if (name == v) return true;
  return false;
}

std::string errno_text(const char* what, int rank) {
  return std::string(what) + " for rank " + std::to_string(rank) + ": " + std::strerror(errno);
}

// Runs in the forked child; only async-signal-safe calls from here to exec.
[[noreturn]] void exec_child(const SpawnRequest& req, char* const* argv, char* const* envp,
                             int pmi_fd, int out_w, int err_w, int status_w, pid_t parent) {
  // No rank outlives ferryrun, even a ferryrun ended by SIGKILL (which no handler of its own
  // sees): the kernel kills the rank when its parent ends. The setting survives exec. A parent
  // that ended before this line sends nothing, so the child looks for itself.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);

  // Its own process group lets ferryrun signal the rank together with anything it forks.
  ::setpgid(0, 0);

  // The parent blocked its handled signals around fork so that none runs ferryrun's handler
  // in this child; defaults go back before unblocking. SIGPIPE is ignored by ferryrun, and an
  // ignored disposition would survive exec.
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::signal(sig, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);

  if (req.stdin_fd >= 0) ::dup2(req.stdin_fd, STDIN_FILENO);
  if (out_w >= 0) ::dup2(out_w, STDOUT_FILENO);
  if (err_w >= 0) ::dup2(err_w, STDERR_FILENO);

  // The PMI socket is the one fd the program must keep across exec.
  int flags = ::fcntl(pmi_fd, F_GETFD);
  ::fcntl(pmi_fd, F_SETFD, flags & ~FD_CLOEXEC);

  ::execvpe(argv[0], argv, envp);

  // The status pipe is close-on-exec: reaching here means exec failed, and the parent learns
  // why from the errno written into it (EOF instead means success).
  int err = errno;
  ssize_t ignored = ::write(status_w, &err, sizeof err);
  (void)ignored;
  ::_exit(127);
}

}  // namespace

std::vector<std::string> inherited_environment() {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e)
    if (!is_launcher_variable(*e)) env.emplace_back(*e);
  return env;
}

SpawnedRank spawn_rank(const SpawnRequest& req) {
  SpawnedRank out;
  int sv[2] = {-1, -1};
  int outp[2] = {-1, -1};
  int errp[2] = {-1, -1};
  int status[2] = {-1, -1};
  auto close_all = [&] {
    for (int* fd : {&sv[0], &sv[1], &outp[0], &outp[1], &errp[0], &errp[1], &status[0],
                    &status[1]})
      close_fd(*fd);
  };

  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    out.error = errno_text("cannot create the PMI socket", req.rank);
    return out;
  }
  if (req.capture_output &&
      (::pipe2(outp, O_CLOEXEC) != 0 || ::pipe2(errp, O_CLOEXEC) != 0)) {
    out.error = errno_text("cannot create the output pipes", req.rank);
    close_all();
    return out;
  }
  if (::pipe2(status, O_CLOEXEC) != 0) {
    out.error = errno_text("cannot create the exec status pipe", req.rank);
    close_all();
    return out;
  }

  // Everything exec needs is built before fork, so the child allocates nothing.
  std::vector<std::string> env = *req.env;
  env.push_back("PMI_FD=" + std::to_string(sv[1]));
  env.push_back("PMI_RANK=" + std::to_string(req.rank));
  env.push_back("PMI_SIZE=" + std::to_string(req.size));
  env.push_back("FERRY_LAUNCHER=ferryrun");
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = req.argv;
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);

  sigset_t handled, saved;
  sigemptyset(&handled);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&handled, sig);
  ::sigprocmask(SIG_BLOCK, &handled, &saved);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0) exec_child(req, argv.data(), envp.data(), sv[1], outp[1], errp[1], status[1], parent);
  int fork_errno = errno;
  ::sigprocmask(SIG_SETMASK, &saved, nullptr);
  if (pid < 0) {
    errno = fork_errno;
    out.error = errno_text("cannot fork", req.rank);
    close_all();
    return out;
  }

  // Also set from this side: whichever of parent and child runs first, the group exists
  // before ferryrun might need to signal it. EACCES after the child's exec is harmless.
  ::setpgid(pid, pid);
  out.pid = pid;

  close_fd(sv[1]);
  close_fd(outp[1]);
  close_fd(errp[1]);
  close_fd(status[1]);

  int err = 0;
  ssize_t n;
  do {
    n = ::read(status[0], &err, sizeof err);
  } while (n < 0 && errno == EINTR);
  close_fd(status[0]);
  if (n == static_cast<ssize_t>(sizeof err)) {
    out.exec_errno = err;
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    out.pid = -1;
    close_all();
    return out;
  }

  out.pmi_fd = std::exchange(sv[0], -1);
  out.out_fd = std::exchange(outp[0], -1);
  out.err_fd = std::exchange(errp[0], -1);
  return out;
}

}  // namespace ferryrun
