// job_plan.hpp — what the runtime settles before it opens a backend: every rank's host, the
// job-wide settings (equal on every rank, or an error naming the first that differs), and the
// plan of which backend reaches each peer. Called by the runtime's constructor only.
#pragma once

#include <string>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "core/liveness.hpp"
#include "ferry/options.hpp"

namespace ferry::detail {

// This machine's hostname, or "unknown".
std::string hostname();

// Every rank's host identity (`mine` on this rank), by rank, after checking that every rank
// uses the same job-wide options (throws ferry::Error naming the first that differs). Starts
// watching the processes of the peers on this host (same host identity, same PID namespace).
std::vector<std::string> exchange_hosts(bootstrap::Bootstrap& boot, const std::string& mine,
                                        const Resolved<RuntimeSettings>& options, PeerWatch& watch);

// Which backends this process uses and which one reaches each rank. FERRY_TRANSPORT names one
// backend for every peer, or `auto`: within the host the first registered backend that reaches
// the host but not the network (ferry's shm), a rank alone on its host to itself through the
// first that reaches only the rank (self), and across hosts FERRY_NETWORK's backend. The core
// knows a backend by its name and reach only (net/backend.hpp).
struct TransportPlan {
  std::string network;        // reaches the peers no other backend reaches ("" none)
  std::string host;           // reaches the ranks of this host but this one ("" none)
  std::string self;           // reaches this rank ("" none)
  bool one_host = false;      // FERRY_TRANSPORT named one backend for every peer, all on this host
  std::vector<bool> on_host;  // by rank: shares this rank's host
};

// The plan for this rank of a job whose ranks sit on `hosts`, under FERRY_TRANSPORT's and
// FERRY_NETWORK's text. Throws ferry::Error when the named backend cannot reach every peer.
TransportPlan plan_transports(const std::string& transport, const std::string& network,
                              const std::vector<std::string>& hosts, int rank);

}  // namespace ferry::detail
