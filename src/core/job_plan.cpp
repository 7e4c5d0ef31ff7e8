// job_plan.cpp — what every rank agrees on before it opens anything: each rank's host, the
// job-wide settings checked equal on every rank, and the plan of which backend reaches each
// peer (job_plan.hpp).
#include "core/job_plan.hpp"

#include <unistd.h>

#include <algorithm>
#include <string_view>

#include "ferry/error.hpp"
#include "net/registry.hpp"

namespace ferry::detail {

std::string hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

namespace {

// The core's options that shape what goes on the wire or which endpoints exist: ranks that
// disagree on one would truncate, misread or never reach each other's messages (or, for the
// peer timeout, send heartbeats more rarely than a peer's timeout allows; for the collectives'
// algorithms, run different schedules of one collective).
constexpr const char* kJobWideOptions[] = {"transport",      "network",    "devices",        "packet_size",
                                          "fragment",       "fragment_max", "max_targets",  "peer_timeout_ms",
                                          "coll_allreduce", "coll_bcast", "coll_allgather", "coll_large"};

// The core's job-wide options, then the backends' rows that declare themselves job-wide (the
// core cannot know which of a backend's settings its peers must share).
std::vector<std::string> job_wide_names() {
  std::vector<std::string> names(std::begin(kJobWideOptions), std::end(kJobWideOptions));
  for (const BackendOptionTable& t : backend_option_tables()) {
    for (const BackendOption& row : t.rows) {
      if (row.job_wide) names.emplace_back(row.info.name);
    }
  }
  return names;
}

std::string job_wide_settings(const Resolved<RuntimeSettings>& options) {
  std::string text;
  for (const std::string& name : job_wide_names()) text += options.value(name) + '\n';
  return text;
}

// Names the first job-wide option on which rank `other` differs from this rank, by the
// option table's own variable name.
[[noreturn]] void settings_differ(const Resolved<RuntimeSettings>& options, const std::string& theirs, int rank,
                                  int other) {
  std::size_t at = 0;
  for (const std::string& name : job_wide_names()) {
    const std::size_t end = theirs.find('\n', at);
    if (end == std::string::npos) break;
    const std::string value = theirs.substr(at, end - at);
    if (value != options.value(name)) {
      std::string env = name;
      for (const ResolvedOption& o : options.options) {
        if (o.info->name == name) env = o.info->env;
      }
      throw Error(std::string("ranks disagree on ") + env + ": rank " + std::to_string(other) + " has '" + value +
                  "', rank " + std::to_string(rank) + " has '" + options.value(name) +
                  "'; every rank of a job must use the same " + env);
    }
    at = end + 1;
  }
  throw Error("rank " + std::to_string(other) + " sent settings this rank cannot read (a different ferry version?)");
}

// A rank's record for the host map: its host, its process identity and its job-wide settings,
// each as "<decimal length>:<bytes>", so that the host map costs one read per rank.
constexpr std::size_t kRecordFields = 3;

std::string encode_record(const std::string (&fields)[kRecordFields]) {
  std::string out;
  for (const std::string& f : fields) out += std::to_string(f.size()) + ':' + f;
  return out;
}

// False when `text` is not kRecordFields such fields exactly (a peer's bytes, checked).
bool decode_record(std::string_view text, std::string (&fields)[kRecordFields]) {
  for (std::string& f : fields) {
    const std::size_t colon = text.find(':');
    if (colon == std::string_view::npos || colon == 0 || colon > 6) return false;
    std::size_t n = 0;
    for (char c : text.substr(0, colon)) {
      if (c < '0' || c > '9') return false;
      n = n * 10 + static_cast<std::size_t>(c - '0');
    }
    if (n > text.size() - colon - 1) return false;
    f.assign(text.substr(colon + 1, n));
    text.remove_prefix(colon + 1 + n);
  }
  return text.empty();
}

}  // namespace

// Every rank's host identity (FERRY_HOST, else the hostname), by rank; each rank checks that
// every other one uses the same job-wide options.
// Also starts watching the processes of the peers on this host (same host identity, same PID
// namespace).
std::vector<std::string> exchange_hosts(bootstrap::Bootstrap& boot, const std::string& mine,
                                        const Resolved<RuntimeSettings>& options, PeerWatch& watch) {
  std::vector<std::string> hosts(static_cast<std::size_t>(boot.size()), mine);
  if (boot.size() == 1) return hosts;
  const std::string settings = job_wide_settings(options);
  const std::string me = process_identity();
  pid_t my_pid = 0;
  std::string my_ns;
  const bool watchable = parse_process_identity(me, my_pid, my_ns);
  boot.put("ferry.rank", encode_record({mine, me, settings}));
  boot.fence();
  for (int r = 0; r < boot.size(); ++r) {
    if (r == boot.rank()) continue;
    std::string theirs[kRecordFields];  // host, process, settings
    if (!decode_record(boot.get(r, "ferry.rank"), theirs)) {
      throw Error("rank " + std::to_string(r) + " sent a host record this rank cannot read (a different ferry version?)");
    }
    hosts[static_cast<std::size_t>(r)] = theirs[0];
    if (theirs[2] != settings) settings_differ(options, theirs[2], boot.rank(), r);
    pid_t pid = 0;
    std::string ns;
    if (watchable && theirs[0] == mine && parse_process_identity(theirs[1], pid, ns) && ns == my_ns && pid != my_pid) {
      watch.watch(r, pid);
    }
  }
  return hosts;
}

namespace {

// The first registered built-in backend whose reach is exactly `reach`, or "": a module is
// never loaded for auto to find out it is not wanted.
std::string first_backend_reaching(unsigned reach) {
  for (const std::string& name : net::backend_names()) {
    if (net::backend_origin(name).rfind("built in", 0) != 0) continue;
    if (net::backend_reach(name) == reach) return name;
  }
  return "";
}

}  // namespace

TransportPlan plan_transports(const std::string& transport, const std::string& network,
                              const std::vector<std::string>& hosts, int rank) {
  TransportPlan plan;
  const std::string& mine = hosts[static_cast<std::size_t>(rank)];
  plan.on_host.resize(hosts.size());
  int away = -1;
  int neighbours = 0;
  for (std::size_t r = 0; r < hosts.size(); ++r) {
    plan.on_host[r] = hosts[r] == mine;
    if (!plan.on_host[r] && away < 0) away = static_cast<int>(r);
    if (plan.on_host[r] && static_cast<int>(r) != rank) ++neighbours;
  }
  if (transport != "auto") {
    const std::string setting = "FERRY_TRANSPORT=" + transport;
    const net::BackendInfo& b = net::backend(transport, setting);
    if (away >= 0 && !net::reaches(b.reach, net::Reach::network)) {
      throw Error(setting + ": rank " + std::to_string(away) + " is on host '" + hosts[static_cast<std::size_t>(away)] +
                  "', rank " + std::to_string(rank) + " on '" + mine + "'; the " + transport +
                  " backend reaches only ranks of one host (use FERRY_TRANSPORT=auto or a network backend)");
    }
    if (neighbours > 0 && !net::reaches(b.reach, net::Reach::host)) {
      throw Error(setting + ": the " + transport + " backend reaches only this rank, and the job has " +
                  std::to_string(hosts.size()) + " ranks (use FERRY_TRANSPORT=auto, shm or a network backend)");
    }
    if (net::reaches(b.reach, net::Reach::network)) {
      plan.network = transport;
    } else {
      plan.host = transport;
    }
    plan.one_host = away < 0;
    return plan;
  }
  // A rank alone on its host talks to itself through the self backend; one with neighbours
  // through the host backend it needs anyway (one link fewer: each keeps receives posted).
  if (neighbours == 0) plan.self = first_backend_reaching(unsigned(net::Reach::self));
  if (neighbours > 0 || plan.self.empty()) plan.host = first_backend_reaching(net::Reach::self | net::Reach::host);
  if (plan.self.empty()) plan.self = plan.host;
  if (away >= 0) plan.network = network;
  if (plan.self.empty() && plan.host.empty() && plan.network.empty()) plan.network = network;
  return plan;
}

}  // namespace ferry::detail
