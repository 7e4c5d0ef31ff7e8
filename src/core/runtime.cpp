#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <exception>

#include "common/cpu_relax.hpp"
#include "common/log.hpp"
#include "common/queue_support.hpp"
#include "core/recv_blocks.hpp"
#include "core/runtime_impl.hpp"
#include "ferry/error.hpp"
#include "net/fatal_signals.hpp"
#include "net/registry.hpp"

namespace ferry {

namespace detail {

namespace {

std::string hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

// The options that shape what goes on the wire or which endpoints exist: ranks that disagree
// on one would truncate, misread or never reach each other's messages (or, for the peer
// timeout, send heartbeats more rarely than a peer's timeout allows).
constexpr const char* kJobWideOptions[] = {"transport", "provider", "network", "devices", "packet_size", "fragment", "fragment_max",
                                          "max_targets", "peer_timeout_ms"};

std::string job_wide_settings(const Resolved<RuntimeSettings>& options) {
  std::string text;
  for (const char* name : kJobWideOptions) text += options.value(name) + '\n';
  return text;
}

// Names the first job-wide option on which rank `other` differs from this rank, by the
// option table's own variable name.
[[noreturn]] void settings_differ(const Resolved<RuntimeSettings>& options, const std::string& theirs, int rank,
                                  int other) {
  std::size_t at = 0;
  for (const char* name : kJobWideOptions) {
    const std::size_t end = theirs.find('\n', at);
    if (end == std::string::npos) break;
    const std::string value = theirs.substr(at, end - at);
    if (value != options.value(name)) {
      const char* env = name;
      for (const ResolvedOption& o : options.options) {
        if (std::string_view(o.info->name) == name) env = o.info->env;
      }
      throw Error(std::string("ranks disagree on ") + env + ": rank " + std::to_string(other) + " has '" + value +
                  "', rank " + std::to_string(rank) + " has '" + options.value(name) +
                  "'; every rank of a job must use the same " + env);
    }
    at = end + 1;
  }
  throw Error("rank " + std::to_string(other) + " sent settings this rank cannot read (a different ferry version?)");
}

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
  boot.put("ferry.host", mine);
  boot.put("ferry.settings", settings);
  boot.put("ferry.process", me);
  boot.fence();
  for (int r = 0; r < boot.size(); ++r) {
    hosts[static_cast<std::size_t>(r)] = boot.get(r, "ferry.host");
    if (r == boot.rank()) continue;
    const std::string theirs = boot.get(r, "ferry.settings");
    if (theirs != settings) settings_differ(options, theirs, boot.rank(), r);
    pid_t pid = 0;
    std::string ns;
    if (watchable && hosts[static_cast<std::size_t>(r)] == mine &&
        parse_process_identity(boot.get(r, "ferry.process"), pid, ns) && ns == my_ns && pid != my_pid) {
      watch.watch(r, pid);
    }
  }
  return hosts;
}

// Which backends this process uses and which one reaches each rank. FERRY_TRANSPORT names one
// backend for every peer, or `auto`: within the host the first registered backend that reaches
// the host but not the network (ferry's shm), a rank alone on its host to itself through the
// first that reaches only the rank (self), and across hosts FERRY_NETWORK's backend. The core knows a backend by
// its name and reach only (net/backend.hpp).
struct TransportPlan {
  std::string network;        // reaches the peers no other backend reaches ("" none)
  std::string host;           // reaches the ranks of this host but this one ("" none)
  std::string self;           // reaches this rank ("" none)
  std::string provider;       // for a backend with providers: a name, or "" for its best network
  std::vector<bool> on_host;  // by rank: shares this rank's host
};

// The first registered backend whose reach is exactly `reach`, or "".
std::string first_backend_reaching(unsigned reach) {
  for (const std::string& name : net::backend_names()) {
    if (net::backend_origin(name).rfind("built in", 0) != 0) continue;  // a module is never loaded to be asked
    if (net::backend(name, "FERRY_TRANSPORT=auto").reach == reach) return name;
  }
  return "";
}

TransportPlan plan_transports(const Config& config, const std::string& transport, const std::string& network,
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
    // "auto": a provider's own shared memory when every rank shares a host, else its best network.
    plan.provider = config.provider != "auto" ? config.provider : (away < 0 ? "shm" : "");
    return plan;
  }
  // A rank alone on its host talks to itself through the self backend; one with neighbours
  // through the host backend it needs anyway (one link fewer: each keeps receives posted).
  if (neighbours == 0) plan.self = first_backend_reaching(unsigned(net::Reach::self));
  if (neighbours > 0 || plan.self.empty()) plan.host = first_backend_reaching(net::Reach::self | net::Reach::host);
  if (plan.self.empty()) plan.self = plan.host;
  if (away >= 0) plan.network = network;
  if (plan.self.empty() && plan.host.empty() && plan.network.empty()) plan.network = network;
  plan.provider = config.provider != "auto" ? config.provider : "";
  return plan;
}

net::ShmCopy shm_copy(ShmCopyMode m) {
  switch (m) {
    case ShmCopyMode::cma: return net::ShmCopy::cma;
    case ShmCopyMode::copy: return net::ShmCopy::copy;
    case ShmCopyMode::automatic: break;
  }
  return net::ShmCopy::automatic;
}

}  // namespace

RuntimeImpl::RuntimeImpl(const RuntimeOptions& options) : options_(resolve_options(options)) {
  set_log_level(config_.log);
  net::restore_fatal_signals();  // a crashed or stopped rank must end, not run our destructors
  if (config_.peer_timeout_ms != 0 && config_.peer_timeout_ms < 4 * config_.peer_check_ms) {
    throw Error("FERRY_PEER_TIMEOUT_MS=" + std::to_string(config_.peer_timeout_ms) + " is below 4 x FERRY_PEER_CHECK_MS=" +
                std::to_string(config_.peer_check_ms) + ": a peer would be failed before enough checks saw its "
                "heartbeats (raise FERRY_PEER_TIMEOUT_MS, lower FERRY_PEER_CHECK_MS, or set FERRY_PEER_TIMEOUT_MS=0)");
  }
  if (config_.lock_model == LockModel::serialized && config_.progress.value == ProgressMode::thread) {
    throw Error("FERRY_LOCK_MODEL=serialized with FERRY_PROGRESS=" + options_.value("progress") +
                ": progress threads would call into devices beside the application's thread, which that model "
                "does not allow (choose another lock model, or another progress mode)");
  }
  recv_blocks::set_limit(config_.recv_cache);
  recv_blocks::set_huge_from(config_.recv_huge);
  boot_ = bootstrap::make_bootstrap(options_.value("bootstrap"));  // the row's text: auto, single, pmi1, pmix
  rank_ = boot_->rank();
  set_log_rank(rank_);  // lines logged without a runtime at hand name this process's rank
  size_ = boot_->size();
  if (size_ > 0xFFFFFF) throw Error("job size " + std::to_string(size_) + " exceeds ferry's limit of 16777215 ranks");
  failed_ = std::make_unique<std::atomic<std::uint8_t>[]>(static_cast<std::size_t>(size_));
  departed_ = std::make_unique<std::atomic<std::uint8_t>[]>(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    failed_[static_cast<std::size_t>(r)].store(0, std::memory_order_relaxed);
    departed_[static_cast<std::size_t>(r)].store(0, std::memory_order_relaxed);
  }
  const TransportPlan plan =
      plan_transports(config_, options_.value("transport"), options_.value("network"),
                      exchange_hosts(*boot_, config_.host.empty() ? hostname() : config_.host, options_, watch_), rank_);
  // Each device's transports, in this order: [network][host][self], each one that is used.
  std::vector<std::string> used;
  for (const std::string& name : {plan.network, plan.host, plan.self}) {
    if (!name.empty() && std::find(used.begin(), used.end(), name) == used.end()) used.push_back(name);
  }
  for (const std::string& name : used) {
    const std::string setting = name == plan.network && options_.value("transport") == "auto"
                                    ? "FERRY_NETWORK=" + name
                                    : "FERRY_TRANSPORT=" + options_.value("transport");
    backends_.push_back(net::backend(name, setting).open(net::OpenParams{plan.provider}));
  }
  const auto index_of = [&](const std::string& name) {
    const auto at = std::find(used.begin(), used.end(), name);
    return name.empty() || at == used.end() ? -1 : static_cast<int>(at - used.begin());
  };
  if (!plan.network.empty()) network_ = backends_[static_cast<std::size_t>(index_of(plan.network))].get();
  std::vector<bool> away_ranks(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r) away_ranks[static_cast<std::size_t>(r)] = !plan.on_host[static_cast<std::size_t>(r)];
  // The lock model serialises every call into a device but with lockless (serialized: the
  // application does): a backend need not.
  const bool serialized = config_.lock_model != LockModel::lockless;
  if (config_.launcher_watch && boot_->kind() != "single") {
    const pid_t parent = ::getppid();
    if (parent > 1) launcher_ = parent;
  }
  targets_ = std::make_unique<std::atomic<std::uintptr_t>[]>(config_.max_targets);
  for (std::size_t i = 0; i < config_.max_targets; ++i) targets_[i].store(0, std::memory_order_relaxed);
  // The transport that reaches each rank: the self backend this rank, the host backend the
  // rest of this host, the network backend everyone else (and whatever the others do not).
  const int network_index = index_of(plan.network), host_index = index_of(plan.host), self_index = index_of(plan.self);
  std::vector<int> route(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    const bool here = plan.on_host[static_cast<std::size_t>(r)];
    int t = network_index;
    if (here && host_index >= 0) t = host_index;
    if (r == rank_ && self_index >= 0) t = self_index;
    route[static_cast<std::size_t>(r)] = t;
  }
  // The peers on other hosts, which the keepalive watches through a channel of its own. Every
  // rank agrees whether there is one: each has peers away exactly when the job spans two hosts.
  std::vector<int> away;
  for (int r = 0; r < size_; ++r)
    if (!plan.on_host[static_cast<std::size_t>(r)]) away.push_back(r);
  const auto params = [&](int device, bool heartbeat) {
    return net::TransportParams{.rank = rank_,
                                .size = size_,
                                .device = device,
                                .packet_size = config_.packet_size,
                                .packets = config_.packets,
                                .cells = round_up_pow2(config_.shm_cells),
                                .serialized = serialized,
                                .heartbeat = heartbeat,
                                .away = away_ranks,
                                .copy = shm_copy(config_.shm_copy)};
  };
  if (config_.peer_timeout_ms != 0 && !away.empty()) {
    heartbeats_ = std::make_unique<HeartbeatChannel>(network_->make_transport(params(0, true)), rank_, size_);
    boot_->put("ferry.alive", heartbeats_->address());
  }
  for (int d = 0; d < config_.devices; ++d) {
    std::vector<std::unique_ptr<net::Transport>> transports;
    for (auto& backend : backends_) transports.push_back(backend->make_transport(params(d, false)));
    devices_.push_back(std::make_unique<DeviceImpl>(*this, d, config_, std::move(transports), route));
    const LockModel model = config_.lock_model;
    const bool direct = model == LockModel::lockless || model == LockModel::serialized;
    lock_models_.push_back(direct ? nullptr : std::make_unique<LockModelImpl>(*devices_.back(), model));
    for (std::size_t t = 0; t < devices_.back()->transport_count(); ++t) {
      boot_->put("ferry.ep." + std::to_string(d) + "." + std::to_string(t), devices_.back()->transport(t).address());
    }
  }
  boot_->fence();
  for (int d = 0; d < config_.devices; ++d) {
    DeviceImpl& dev = *devices_[static_cast<std::size_t>(d)];
    for (std::size_t t = 0; t < dev.transport_count(); ++t) {
      std::vector<std::string> addresses(static_cast<std::size_t>(size_));
      for (int r = 0; r < size_; ++r) {
        if (route[static_cast<std::size_t>(r)] != static_cast<int>(t)) continue;
        addresses[static_cast<std::size_t>(r)] = boot_->get(r, "ferry.ep." + std::to_string(d) + "." + std::to_string(t));
      }
      dev.transport(t).connect(addresses);
    }
    dev.start();
    handles_.push_back(Device(&dev, lock_models_[static_cast<std::size_t>(d)].get()));
  }
  if (heartbeats_ != nullptr) {
    std::vector<std::string> addresses(static_cast<std::size_t>(size_));
    for (int r : away) addresses[static_cast<std::size_t>(r)] = boot_->get(r, "ferry.alive");
    heartbeats_->connect(addresses);
  }
  // Every rank has its receives posted before anyone sends, and every peer has attached to
  // this rank's shared memory, which can now go from the namespace.
  boot_->barrier();
  for (auto& dev : devices_) {
    for (std::size_t t = 0; t < dev->transport_count(); ++t) dev->transport(t).connected();
  }
  if (heartbeats_ != nullptr) {
    heartbeats_->connected();
    keepalive_.start(size_, std::move(away), config_.peer_timeout_ms, config_.peer_check_ms);
    keepalive_thread_ = std::thread([this] { keep_alive(); });
  }
  try {
    progress_threads_ = start_progress_threads(config_, handles_);
  } catch (...) {
    stop_keepalive();  // a joinable thread must not be destroyed
    throw;
  }
}

void RuntimeImpl::barrier_arrived(int src, std::uint32_t step) noexcept {
  if (src < 0 || src >= size_) return;
  if (step == kDepartStep) {
    departed_[static_cast<std::size_t>(src)].store(1, std::memory_order_relaxed);
    return;
  }
  // Release, paired with the barrier's acquire: what the thread that took this arrival in did
  // before (a peer's put it applied, say, under the offload model) happens before what the
  // barrier's caller does after it.
  barrier_steps_[(step >> 8) & 1][step & 31].fetch_add(1, std::memory_order_release);
}

void RuntimeImpl::barrier() {
  throw_if_failed("barrier");
  // The barrier's steps travel on device 0, whose progress this thread cannot run again from
  // inside it: the wait would never end.
  if (devices_[0]->progressing_here()) {
    throw Error("barrier: called from inside device 0's progress (from a Handler's callback, say); its steps "
                "arrive through that progress, which must return first");
  }
  // Operations this rank posted before the barrier are performed before it: a deferring lock
  // model (lockq, offload) may still hold some in its queue.
  for (auto& t : lock_models_) {
    if (t != nullptr) {
      const std::uint64_t before = t->deferred();
      IdleBackoff idle;
      while (t->performed() < before) idle(t->progress());
    }
  }
  const std::uint32_t parity = barrier_epoch_++ & 1;
  int round = 0;
  // Ranks reach a barrier at different times: the early ones yield their core once progress
  // finds nothing for a while, to the late ones when ranks outnumber cores.
  IdleBackoff idle;
  for (int dist = 1; dist < size_; dist *= 2, ++round) {
    const int to = (rank_ + dist) % size_;
    const std::uint32_t step = (parity << 8) | static_cast<std::uint32_t>(round);
    while (!post_barrier_step(to, step)) {
      idle(progress_devices());
      throw_if_failed("barrier");
    }
    std::atomic<int>& arrived = barrier_steps_[parity][round];
    // A failed peer ends the wait only while the step is missing: its sender, or a rank the
    // sender waits for, may be the failed one, and nothing else would end it.
    while (arrived.load(std::memory_order_acquire) == 0) {
      idle(progress_devices());
      if (arrived.load(std::memory_order_acquire) == 0) throw_if_failed("barrier");
    }
    // Relaxed: only the count matters here; the acquire above ordered the data.
    arrived.fetch_sub(1, std::memory_order_relaxed);
  }
}

void RuntimeImpl::finalize() {
  progress_threads_.reset();  // FERRY_PROGRESS=thread:N: from here finalize progresses alone
  if (finalized_.load()) return;
  // Everyone's operations complete while everyone still progresses; then the barrier. With a
  // failed peer the barrier cannot complete: this rank closes anyway and reports the failure.
  for (auto& d : devices_) {
    // After a failure: long enough for a transport to give up the failed peer's operations
    // (net::kAbandonGraceMs), so each still completes, with the failure, before teardown.
    const double limit = failure_count() != 0 ? net::kAbandonGraceMs / 1000.0 + 0.5 : 10.0;
    const std::size_t left = drain(*d, limit);
    if (left != 0) {
      FERRY_LOG_AT(warn, rank_, -1, "finalize: %zu operations still in flight on device %d after %.0f s", left,
                   d->index(), limit);
    }
  }
  std::exception_ptr failure;
  try {
    barrier();
  } catch (const PeerFailed&) {
    failure = std::current_exception();
  } catch (const std::exception& e) {
    FERRY_LOG_AT(error, rank_, -1, "finalize: %s", e.what());
  }
  stop_keepalive();
  depart();
  finalized_.store(true);
  for (auto& d : devices_) d->mark_finalized();
  std::lock_guard<std::mutex> guard(park_mutex_);
  for (const auto& [id, c] : parked_) {
    FERRY_LOG_AT(warn, rank_, -1,
                 "an active message from rank %d for remote target %u was never delivered: "
                 "no completion object was exposed under that id",
                 c.rank, static_cast<unsigned>(id));
  }
  parked_.clear();
  if (failure) std::rethrow_exception(failure);
}

void RuntimeImpl::peer_failed(int rank, const std::string& how) noexcept {
  if (rank < 0 || rank >= size_ || rank == rank_) return;
  // A rank that finalized ends its connections as it leaves: that is no failure.
  if (departed_[static_cast<std::size_t>(rank)].load(std::memory_order_relaxed) != 0) return;
  if (failed_[static_cast<std::size_t>(rank)].exchange(1, std::memory_order_relaxed) != 0) return;
  int none = -1;
  first_failed_.compare_exchange_strong(none, rank, std::memory_order_relaxed);
  FERRY_LOG_AT(error, rank_, -1, "rank %d failed: %s", rank, how.c_str());
  // Release: a device that reads the new count (acquire) also reads the flag set above.
  failure_count_.fetch_add(1, std::memory_order_release);
}

// Tells every peer this rank is finalizing, so the end of its process that follows is not
// taken for a failure. Best effort within a second: a peer that misses it (its queue full all
// that time) reports this rank failed, which is what it would see anyway.
void RuntimeImpl::depart() noexcept {
  if (devices_.empty() || size_ == 1) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  try {
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || failed(r)) continue;
      IdleBackoff idle;
      while (!post_barrier_step(r, kDepartStep) && std::chrono::steady_clock::now() < deadline) {
        idle(progress_devices());
      }
    }
  } catch (const std::exception& e) {
    FERRY_LOG_AT(warn, rank_, -1, "finalize: could not tell every peer this rank is leaving: %s", e.what());
  }
}

// Every check interval: the keepalive channel polled (each heartbeat arrived marks its sender
// heard; a departing one marks it departed), a heartbeat to each peer on another host that has
// neither failed nor departed once a quarter of the timeout has passed since its last, then
// the silence check. From a thread of its own, not from progress: a rank that computes for a
// while without calling progress is still heard and still hears. A heartbeat refused for now
// (a full queue, a connection still being made) is tried again at the next tick. When the
// thread stops (finalize), each such peer gets a departing heartbeat, so the silence that
// follows is not taken for a failure even before the departure message on the data path,
// behind whatever this rank sent last, reaches it.
void RuntimeImpl::keep_alive() noexcept {
  using Clock = std::chrono::steady_clock;
  const auto tick = std::chrono::milliseconds(config_.peer_check_ms);
  const auto beat_every = std::chrono::milliseconds(std::max(1, keepalive_.timeout_ms() / 4));
  const std::vector<int>& peers = keepalive_.peers();
  std::vector<Clock::time_point> next_beat(peers.size(), Clock::time_point{});
  Clock::time_point last_check = Clock::now();
  std::vector<int> silent;
  std::vector<HeartbeatChannel::Arrived> arrived;
  arrived.reserve(64);
  bool warned = false, warned_oom = false;
  auto gone = [this](int r) { return failed(r) || departed_[static_cast<std::size_t>(r)].load(std::memory_order_relaxed) != 0; };
  std::unique_lock<std::mutex> lock(keepalive_mutex_);
  for (bool first = true;; first = false) {
    if (!first && keepalive_wake_.wait_for(lock, tick, [this] { return keepalive_stop_; })) break;
    lock.unlock();
    try {
      arrived.clear();
      heartbeats_->poll(arrived);
      for (const HeartbeatChannel::Arrived& a : arrived) {
        keepalive_.heard(a.rank);
        if (a.kind == Beat::departing) departed_[static_cast<std::size_t>(a.rank)].store(1, std::memory_order_relaxed);
      }
      const Clock::time_point now = Clock::now();
      for (std::size_t i = 0; i < peers.size(); ++i) {
        if (now < next_beat[i] || gone(peers[i])) continue;
        const int rc = heartbeats_->send(peers[i], Beat::alive);
        if (rc == -EAGAIN) continue;  // due again at the next tick
        next_beat[i] = now + beat_every;
        if (rc != 0 && !warned) {
          FERRY_LOG_AT(warn, rank_, -1, "a heartbeat to rank %d failed: %s", peers[i],
                       net::error_text("inject", rc).c_str());
          warned = true;
        }
      }
      const std::int64_t elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_check).count();
      last_check = now;
      silent.clear();
      keepalive_.check(elapsed, silent);
      for (int r : silent) {
        peer_failed(r, "no heartbeat from it for " + std::to_string(keepalive_.timeout_ms()) +
                           " ms (FERRY_PEER_TIMEOUT_MS): its host, its process or the link to it is down");
      }
    } catch (const std::exception& e) {
      // Out of memory (a vector or a message string): the check is tried again at the next
      // tick; a peer in `silent` not yet failed is named then.
      if (!warned_oom) FERRY_LOG_AT(warn, rank_, -1, "keepalive: %s", e.what());
      warned_oom = true;
    }
    lock.lock();
  }
  lock.unlock();
  // Departing: best effort, a few polls to let the channel send them.
  for (int r : peers) {
    if (!gone(r)) (void)heartbeats_->send(r, Beat::departing);
  }
  arrived.clear();
  for (int i = 0; i < 5; ++i) {
    try {
      heartbeats_->poll(arrived);
    } catch (...) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void RuntimeImpl::stop_keepalive() noexcept {
  if (!keepalive_thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> guard(keepalive_mutex_);
    keepalive_stop_ = true;
  }
  keepalive_wake_.notify_all();
  keepalive_thread_.join();
}

std::vector<int> RuntimeImpl::failed_ranks() const {
  std::vector<int> out;
  if (failure_count() == 0) return out;
  for (int r = 0; r < size_; ++r)
    if (failed(r)) out.push_back(r);
  return out;
}

void RuntimeImpl::throw_if_failed(const char* call) const {
  if (__builtin_expect(failure_count() == 0, 1)) return;
  const int r = first_failed_.load(std::memory_order_relaxed);
  const std::vector<int> all = failed_ranks();
  std::string list;
  for (int f : all) list += (list.empty() ? "" : ", ") + std::to_string(f);
  throw PeerFailed(r, std::string(call) + ": rank " + std::to_string(r) + " failed (failed ranks: " + list + ")");
}

void RuntimeImpl::check_peers() noexcept {
  if (watch_.empty() && launcher_ == 0) return;
  const std::int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now().time_since_epoch()).count();
  if (now < next_check_ns_.load(std::memory_order_relaxed)) return;
  std::unique_lock<std::mutex> lock(watch_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  next_check_ns_.store(now + std::int64_t{config_.peer_check_ms} * 1000000, std::memory_order_relaxed);
  if (launcher_ != 0 && ::getppid() != launcher_) {
    // Orphaned: the launcher (or its daemon) is gone, and with it the job. Ending here is the
    // only way not to spin forever in progress (mpirun killed by SIGKILL leaves its ranks).
    FERRY_LOG_AT(error, rank_, -1, "the launcher's process (pid %d) ended: ending this rank (FERRY_LAUNCHER_WATCH=off keeps it)",
                 static_cast<int>(launcher_));
    std::_Exit(1);
  }
  // A process seen ended is confirmed failed at the next check, unless its departure message
  // came meanwhile: a rank that finalized sent it before it could end, and by the next check
  // (an interval and at least 1024 progress calls later) this rank has polled it.
  std::vector<int> dead;
  try {
    for (int r : suspects_) {
      if (departed_[static_cast<std::size_t>(r)].load(std::memory_order_relaxed) == 0) {
        peer_failed(r, "its process ended (seen by this rank's watch of the processes on its host)");
      }
    }
    suspects_.clear();
    watch_.check(dead);
    suspects_ = std::move(dead);
  } catch (...) {
    return;  // out of memory: try again at the next check
  }
}

bool RuntimeImpl::post_barrier_step(int to, std::uint32_t step) {
  struct Step {
    int to;
    std::uint32_t step;
  } args{to, step};
  auto post = [](DeviceImpl& dev, void* p) {
    const auto* a = static_cast<const Step*>(p);
    return dev.post_barrier_step(a->to, a->step);
  };
  if (LockModelImpl* lm = lock_models_[0].get()) return lm->exclusive(post, &args);
  return post(*devices_[0], &args);
}

bool RuntimeImpl::progress_devices() {
  bool any = false;
  for (std::size_t d = 0; d < devices_.size(); ++d) {
    if (LockModelImpl* lm = lock_models_[d].get()) {
      any |= lm->progress();
    } else {
      any |= devices_[d]->progress();
    }
  }
  return any;
}

std::size_t RuntimeImpl::drain(DeviceImpl& device, double seconds) {
  LockModelImpl* lock_model = lock_models_[static_cast<std::size_t>(device.index())].get();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  auto busy = [&] { return (lock_model != nullptr ? lock_model->queued() : 0) + device.in_flight(); };
  IdleBackoff idle;
  while (busy() != 0 && std::chrono::steady_clock::now() < deadline) {
    idle(lock_model != nullptr ? lock_model->progress() : device.progress());
  }
  return busy();
}

RuntimeImpl::~RuntimeImpl() {
  try {
    finalize();
  } catch (...) {
  }
  stop_keepalive();  // finalize threw before it stopped it
  if (heartbeats_ != nullptr) {
    // A failed peer's connection is abandoned, not closed (libfabric's rxm can crash flushing
    // an inject to a peer that is unreachable).
    for (int r : keepalive_.peers())
      if (failed(r)) heartbeats_->peer_failed(r);
    heartbeats_.reset();
  }
  handles_.clear();
  lock_models_.clear();  // an offload thread must be gone before its device's endpoint
  devices_.clear();
  backends_.clear();
  boot_.reset();
}

void RuntimeImpl::expose(CompletionObject& object, std::uint16_t id) {
  if (id >= config_.max_targets) {
    throw Error("expose: id=" + std::to_string(id) + " is out of range; FERRY_MAX_TARGETS=" +
                std::to_string(config_.max_targets));
  }
  static_assert(alignof(CompletionObject) > kAtOnce, "targets_ keeps a flag in the address's low bit");
  const std::uintptr_t entry = reinterpret_cast<std::uintptr_t>(&object) | (object.batches() ? 0 : kAtOnce);
  std::uintptr_t expected = 0;
  // Release: a progress thread that loads the entry (acquire) sees a constructed object.
  if (!targets_[id].compare_exchange_strong(expected, entry, std::memory_order_release, std::memory_order_relaxed)) {
    throw Error("expose: id=" + std::to_string(id) + " is already exposed");
  }
  std::lock_guard<std::mutex> guard(park_mutex_);
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (it->first == id) {
      object.signal(std::move(it->second));
      it = parked_.erase(it);
    } else {
      ++it;
    }
  }
}

void RuntimeImpl::unexpose(std::uint16_t id) noexcept { targets_[id].store(0, std::memory_order_release); }

void RuntimeImpl::deliver(std::uint16_t id, Completion&& completion) noexcept {
  if (CompletionObject* t = exposed(id)) {
    t->signal(std::move(completion));
    return;
  }
  if (id >= config_.max_targets) {
    // No expose() can name it: parked, it would wait forever. The sender's id is not ours.
    FERRY_LOG_AT(warn, rank_, -1, "dropped a message from rank %d for target %u: FERRY_MAX_TARGETS=%zu", completion.rank,
                 id, config_.max_targets);
    return;
  }
  std::lock_guard<std::mutex> guard(park_mutex_);
  if (CompletionObject* t = object_at(targets_[id].load(std::memory_order_acquire))) {
    t->signal(std::move(completion));
    return;
  }
  try {
    parked_.emplace_back(id, std::move(completion));
  } catch (...) {
    FERRY_LOG_AT(error, rank_, -1, "out of memory parking a message for target %u", id);
  }
}

}  // namespace detail

// ---- public handles --------------------------------------------------------------------------

Runtime::Runtime(const RuntimeOptions& options) : impl_(std::make_unique<detail::RuntimeImpl>(options)) {}
Runtime::~Runtime() = default;
int Runtime::rank() const noexcept { return impl_->rank(); }
int Runtime::size() const noexcept { return impl_->size(); }
int Runtime::device_count() const noexcept { return static_cast<int>(impl_->handles().size()); }
Device& Runtime::device(int index) {
  if (impl_->finalized()) throw Error("device: called after the runtime was finalized");
  if (index < 0 || index >= device_count()) {
    throw Error("device: index=" + std::to_string(index) + " is out of range; this runtime has " +
                std::to_string(device_count()) + " devices (FERRY_DEVICES)");
  }
  return impl_->handles()[static_cast<std::size_t>(index)];
}
std::string Runtime::provider() const { return impl_->provider(); }
std::string Runtime::transport() const { return impl_->transport(); }
std::string Runtime::transport_of(int rank) const {
  if (rank < 0 || rank >= size()) {
    throw Error("transport_of: rank=" + std::to_string(rank) + " is out of range; the job has " + std::to_string(size()) + " ranks");
  }
  return impl_->transport_of(rank);
}
std::string Runtime::bootstrap() const { return std::string(impl_->boot().kind()); }
const Resolved<RuntimeSettings>& Runtime::options() const noexcept { return impl_->options(); }
Exposure Runtime::expose(CompletionObject& object, std::uint16_t id) {
  if (impl_->finalized()) throw Error("expose: called after the runtime was finalized");
  impl_->expose(object, id);
  return Exposure(impl_.get(), id);
}
void Runtime::finalize() { impl_->finalize(); }
void Runtime::barrier() {
  if (impl_->finalized()) throw Error("barrier: called after the runtime was finalized");
  impl_->barrier();
}
std::vector<int> Runtime::failed_ranks() const { return impl_->failed_ranks(); }
std::uint32_t Runtime::failure_count() const noexcept { return impl_->failure_count(); }
void Runtime::kv_put(const std::string& key, const std::string& value) { impl_->boot().put(key, value); }
void Runtime::kv_fence() { impl_->boot().fence(); }
std::string Runtime::kv_get(int rank, const std::string& key) {
  if (rank < 0 || rank >= size()) {
    throw Error("kv_get: rank=" + std::to_string(rank) + " is out of range; the job has " + std::to_string(size()) + " ranks");
  }
  return impl_->boot().get(rank, key);
}

Exposure& Exposure::operator=(Exposure&& other) noexcept {
  if (this != &other) {
    if (rt_ != nullptr) rt_->unexpose(id_);
    rt_ = other.rt_;
    id_ = other.id_;
    other.rt_ = nullptr;
  }
  return *this;
}
Exposure::~Exposure() {
  if (rt_ != nullptr) rt_->unexpose(id_);
}

// Lockless devices call straight through (one predictable branch on the handle's own field);
// the other lock models go through the device's LockModelImpl.
Status Device::post_am(const AmArgs& a) {
  if (lock_model_ != nullptr) return lock_model_->post(a);
  return impl_->post_am(a);
}
Status Device::post_am_iovec(const AmIovecArgs& a) {
  if (lock_model_ != nullptr) return lock_model_->post(a);
  return impl_->post_am_iovec(a);
}
Status Device::post_send(const SendArgs& a) {
  if (lock_model_ != nullptr) return lock_model_->post(a);
  return impl_->post_send(a);
}
Status Device::post_recv(const RecvArgs& a) {
  if (lock_model_ != nullptr) return lock_model_->post(a);
  return impl_->post_recv(a);
}
Status Device::post_put(const PutArgs& a) {
  if (lock_model_ != nullptr) return lock_model_->post(a);
  return impl_->post_put(a);
}
Status Device::post_get(const GetArgs& a) {
  if (lock_model_ != nullptr) return lock_model_->post(a);
  return impl_->post_get(a);
}
bool Device::progress() {
  if (lock_model_ != nullptr) return lock_model_->progress();
  return impl_->progress();
}
MemoryRegion Device::register_memory(void* data, std::size_t size) { return impl_->register_memory(data, size); }
int Device::index() const noexcept { return impl_->index(); }
DeviceStats Device::stats() const noexcept {
  DeviceStats s = lock_model_ != nullptr ? lock_model_->stats() : DeviceStats{};
  s.malformed = impl_->malformed();
  s.delivered_inline = impl_->delivered_inline();
  return s;
}
std::size_t Device::eager_limit() const noexcept { return impl_->eager_limit(); }
std::size_t Device::iovec_eager_limit(std::size_t parts) const noexcept { return impl_->iovec_eager_limit(parts); }

MemoryRegion::MemoryRegion() noexcept = default;
MemoryRegion::MemoryRegion(std::unique_ptr<detail::RegionImpl> impl) noexcept : impl_(std::move(impl)) {}
MemoryRegion::MemoryRegion(MemoryRegion&&) noexcept = default;
MemoryRegion& MemoryRegion::operator=(MemoryRegion&&) noexcept = default;
MemoryRegion::~MemoryRegion() = default;
void* MemoryRegion::data() const noexcept { return impl_ ? impl_->data : nullptr; }
std::size_t MemoryRegion::size() const noexcept { return impl_ ? impl_->size : 0; }
RemoteKey MemoryRegion::remote_key() const {
  if (!impl_) throw Error("remote_key: the MemoryRegion is empty");
  RemoteKey k;
  k.base = reinterpret_cast<std::uint64_t>(impl_->data);
  k.size = impl_->size;
  k.key = impl_->key;
  k.rank = impl_->device->runtime().rank();
  k.device = impl_->device->index();
  return k;
}

const char* version() noexcept { return FERRY_VERSION_STRING; }

}  // namespace ferry
