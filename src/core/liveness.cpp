#include "core/liveness.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <string>
#include <utility>

namespace ferry::detail {

namespace {

int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  const long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd >= 0) {
    ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);  // pidfds are close-on-exec already; be sure
    return static_cast<int>(fd);
  }
#else
  (void)pid;
#endif
  return -1;
}

}  // namespace

PeerWatch::~PeerWatch() {
  for (const Peer& p : peers_)
    if (p.pidfd >= 0) ::close(p.pidfd);
}

void PeerWatch::watch(int rank, pid_t pid) {
  const int fd = open_pidfd(pid);
  // A process already gone (ESRCH) is watched by pid and found dead at the first check.
  peers_.push_back(Peer{rank, pid, fd});
}

void PeerWatch::check(std::vector<int>& dead) {
  if (peers_.empty()) return;
  // At most once per FERRY_PEER_CHECK_MS, off every message path: allocating here is fine.
  std::vector<pollfd> fds;
  std::vector<std::size_t> which;
  fds.reserve(peers_.size());
  which.reserve(peers_.size());
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    Peer& p = peers_[i];
    if (p.reported) continue;
    if (p.pidfd >= 0) {
      fds.push_back(pollfd{p.pidfd, POLLIN, 0});
      which.push_back(i);
    } else if (::kill(p.pid, 0) != 0 && errno == ESRCH) {
      p.reported = true;
      dead.push_back(p.rank);
    }
  }
  if (fds.empty()) return;
  if (::poll(fds.data(), fds.size(), 0) <= 0) return;
  for (std::size_t k = 0; k < fds.size(); ++k) {
    if ((fds[k].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    Peer& p = peers_[which[k]];
    p.reported = true;
    dead.push_back(p.rank);
  }
}

std::string process_identity() {
  std::string text = std::to_string(::getpid()) + ":";
  char ns[128];
  const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
  if (n > 0) text.append(ns, static_cast<std::size_t>(n));
  return text;
}

bool parse_process_identity(const std::string& text, pid_t& pid, std::string& pid_namespace) {
  const std::size_t colon = text.find(':');
  if (colon == std::string::npos || colon == 0) return false;
  long value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + colon, value);
  if (ec != std::errc() || end != text.data() + colon || value <= 0) return false;
  pid = static_cast<pid_t>(value);
  pid_namespace = text.substr(colon + 1);
  return true;
}

void Keepalive::start(std::vector<int> peers, int timeout_ms, int check_ms) {
  peers_ = std::move(peers);
  std::sort(peers_.begin(), peers_.end());
  peers_.erase(std::unique(peers_.begin(), peers_.end()), peers_.end());
  heard_.assign(peers_.size(), 0);
  watched_.assign(peers_.size(), 1);
  silence_ns_.assign(peers_.size(), 0);
  reported_.assign(peers_.size(), 0);
  timeout_ns_ = std::int64_t{timeout_ms} * 1000000;
  max_step_ns_ = std::int64_t{check_ms} * 2000000;
}

std::size_t Keepalive::index_of(int rank) const noexcept {
  const auto at = std::lower_bound(peers_.begin(), peers_.end(), rank);
  return at != peers_.end() && *at == rank ? static_cast<std::size_t>(at - peers_.begin()) : peers_.size();
}

void Keepalive::watch(const std::vector<int>& watched) {
  std::vector<std::uint8_t> now(peers_.size(), 0);
  for (int r : watched) {
    const std::size_t i = index_of(r);
    if (i < peers_.size()) now[i] = 1;
  }
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    if (now[i] != 0 && watched_[i] == 0) silence_ns_[i] = 0;
  }
  watched_ = std::move(now);
}

void Keepalive::check(std::int64_t elapsed_ns, std::vector<int>& silent) {
  const std::int64_t step = std::clamp<std::int64_t>(elapsed_ns, 0, max_step_ns_);
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    const bool heard = heard_[i] != 0;
    heard_[i] = 0;
    if (watched_[i] == 0) continue;
    if (heard) {
      silence_ns_[i] = 0;
      continue;
    }
    silence_ns_[i] += step;
    if (silence_ns_[i] >= timeout_ns_ && reported_[i] == 0) {
      reported_[i] = 1;
      silent.push_back(peers_[i]);
    }
  }
}

}  // namespace ferry::detail
