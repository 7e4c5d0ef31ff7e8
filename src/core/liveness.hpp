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

// Silence detection for the peers on other hosts (FERRY_PEER_TIMEOUT_MS): the wards of this
// rank on the monitoring ring (monitor_ring.hpp), among the peers its keepalive channel links
// it to. Their heartbeats come every timeout/4 on the keepalive's own channel (heartbeats.hpp),
// sent from a thread of their own that also polls the channel, so neither a rank busy computing
// nor a flood of data on either side delays them; heard() records one. The same thread calls
// check() every check interval: a watched peer not heard from for `timeout` is named. One tick
// counts at most twice the interval, so a checker that was itself stopped or starved blames
// nobody for it; a peer starts its silence from zero when it becomes watched.
//
// Concurrency: none; start(), watch(), heard() and check() by the keepalive thread (start()
// may come before the thread does).
class Keepalive {
 public:
  Keepalive() = default;
  // The peers that may be watched (`peers`, any order), all of them watched until watch() says
  // otherwise, naming one after `timeout_ms` of silence; checks come every `check_ms`.
  void start(std::vector<int> peers, int timeout_ms, int check_ms);
  // Watches exactly those of `peers` that are in `watched`; one newly watched starts silent
  // for no time.
  void watch(const std::vector<int>& watched);
  void heard(int rank) noexcept {
    const std::size_t i = index_of(rank);
    if (i < peers_.size()) heard_[i] = 1;
  }
  // `elapsed_ns` since the last check. Appends to `silent` each watched peer silent for the
  // timeout; each is named once.
  void check(std::int64_t elapsed_ns, std::vector<int>& silent);
  const std::vector<int>& peers() const noexcept { return peers_; }
  bool empty() const noexcept { return peers_.empty(); }
  int timeout_ms() const noexcept { return static_cast<int>(timeout_ns_ / 1000000); }

 private:
  // peers_.size() when `rank` is not a peer.
  std::size_t index_of(int rank) const noexcept;

  std::vector<int> peers_;                 // sorted
  std::vector<std::uint8_t> heard_;        // by index in peers_: heard since the last check
  std::vector<std::uint8_t> watched_;      // by index in peers_
  std::vector<std::int64_t> silence_ns_;   // by index in peers_
  std::vector<std::uint8_t> reported_;     // by index in peers_
  std::int64_t timeout_ns_ = 0;
  std::int64_t max_step_ns_ = 0;
};

// This process's identity for the watch: "<pid>:<pid namespace>", the namespace from
// /proc/self/ns/pid ("" where it cannot be read: then only the host identity is compared).
std::string process_identity();
// Parses process_identity() text; false when it does not parse.
bool parse_process_identity(const std::string& text, pid_t& pid, std::string& pid_namespace);

}  // namespace ferry::detail
