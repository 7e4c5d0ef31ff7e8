// liveness.hpp — watches the processes of the peers on this host and names the ones that died.
//
// Ranks on one host (same host identity and the same PID namespace, as exchanged at start-up)
// know each other's process ids. For each such peer the watcher holds a pidfd, which becomes
// readable when the process ends (however it ends, before it is even reaped), so a check is
// one poll() over all of them with a zero timeout; where the kernel has no pidfd_open it falls
// back to kill(pid, 0). A peer on another host is not watched here: its transport's
// connection errors report it (see DeviceContext::transport_error).
//
// Concurrency: check() by one thread at a time (the runtime calls it under a try-lock, at
// most once per FERRY_PEER_CHECK_MS).
#pragma once

#include <sys/types.h>

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

// This process's identity for the watch: "<pid>:<pid namespace>", the namespace from
// /proc/self/ns/pid ("" where it cannot be read: then only the host identity is compared).
std::string process_identity();
// Parses process_identity() text; false when it does not parse.
bool parse_process_identity(const std::string& text, pid_t& pid, std::string& pid_namespace);

}  // namespace ferry::detail
