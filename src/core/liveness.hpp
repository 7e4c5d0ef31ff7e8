// liveness.hpp — names the peers that died: PeerWatch watches the processes of the peers on
// this host; Keepalive names a peer on another host that has gone silent.
//
// Ranks on one host (same host identity and the same PID namespace, as exchanged at start-up)
// know each other's process ids. For each such peer the watcher holds a pidfd, which becomes
// readable when the process ends (however it ends, before it is even reaped), so a check is
// one poll() over all of them with a zero timeout; where the kernel has no pidfd_open it falls
// back to kill(pid, 0). A peer on another host is not watched here: its transport's
// connection errors report it (see DeviceContext::transport_error), and Keepalive below
// reports one that falls silent without an error (its host down, the link cut).
//
// Concurrency: check() by one thread at a time (the runtime calls it under a try-lock, at
// most once per FERRY_PEER_CHECK_MS).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ferry::detail {

class PeerWatch {
 public:
  PeerWatch() = default;
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // Starts watching `rank`'s process.
  void watch(int rank, pid_t pid);
  // Appends to `dead` each watched rank whose process has ended since the last check; each
  // rank is reported once.
  void check(std::vector<int>& dead);
  bool empty() const noexcept { return peers_.empty(); }

 private:
  struct Peer {
    int rank;
    pid_t pid;
    int pidfd;  // -1: no pidfd, fall back to kill(pid, 0)
    bool reported = false;
  };
  std::vector<Peer> peers_;
};

// Silence detection for the peers on other hosts (FERRY_PEER_TIMEOUT_MS). Every process sends
// each such peer a heartbeat every timeout/4 on the keepalive's own channel (heartbeats.hpp),
// from a thread of its own that also polls the channel, so neither a rank busy computing nor a
// flood of data on either side delays them; heard() records one. The same thread calls check()
// every check interval: a peer not heard from for `timeout` is named. One tick counts at most
// twice the interval, so a checker that was itself stopped or starved blames nobody for it.
//
// Concurrency: none; start(), heard() and check() by the keepalive thread (start() may come
// before the thread does).
class Keepalive {
 public:
  Keepalive() = default;
  // Watches `peers` (ranks of a job of `size`), naming one after `timeout_ms` of silence;
  // checks come every `check_ms`.
  void start(int size, std::vector<int> peers, int timeout_ms, int check_ms);
  void heard(int rank) noexcept {
    if (rank >= 0 && static_cast<std::size_t>(rank) < heard_.size()) heard_[static_cast<std::size_t>(rank)] = 1;
  }
  // `elapsed_ns` since the last check. Appends to `silent` each watched peer silent for the
  // timeout; each is named once.
  void check(std::int64_t elapsed_ns, std::vector<int>& silent);
  const std::vector<int>& peers() const noexcept { return peers_; }
  bool empty() const noexcept { return peers_.empty(); }
  int timeout_ms() const noexcept { return static_cast<int>(timeout_ns_ / 1000000); }

 private:
  std::vector<int> peers_;
  std::vector<std::uint8_t> heard_;                      // by rank: heard since the last check
  std::vector<std::int64_t> silence_ns_;                 // by index in peers_
  std::vector<bool> reported_;                           // by index in peers_
  std::int64_t timeout_ns_ = 0;
  std::int64_t max_step_ns_ = 0;
};

// This process's identity for the watch: "<pid>:<pid namespace>", the namespace from
// /proc/self/ns/pid ("" where it cannot be read: then only the host identity is compared).
std::string process_identity();
// Parses process_identity() text; false when it does not parse.
bool parse_process_identity(const std::string& text, pid_t& pid, std::string& pid_namespace);

}  // namespace ferry::detail
