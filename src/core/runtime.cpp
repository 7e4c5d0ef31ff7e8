// runtime.cpp — the runtime's wiring: the constructor (bootstrap, the plan of transports,
// the owners of the runtime's jobs, devices and their lock models, the keepalive channel, the
// address exchange), what the barrier needs of the devices, finalize and teardown. What
// decides the plan is in job_plan.cpp, the public handles' bodies in runtime_api.cpp.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <string>
#include <unordered_map>

#include "common/cpu_relax.hpp"
#include "common/log.hpp"
#include "common/queue_support.hpp"
#include "core/counted_bootstrap.hpp"
#include "core/job_plan.hpp"
#include "core/recv_blocks.hpp"
#include "core/runtime_impl.hpp"
#include "ferry/error.hpp"
#include "net/fatal_signals.hpp"
#include "net/registry.hpp"

namespace ferry {

namespace detail {

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
  failures_ = std::make_unique<PeerFailures>(rank_, size_, config_);
  CountedBootstrap counted(*boot_);  // start-up's reads, for the footprint
  const std::vector<std::string> hosts =
      exchange_hosts(counted, config_.host.empty() ? hostname() : config_.host, options_, failures_->watch());
  const TransportPlan plan = plan_transports(options_.value("transport"), options_.value("network"), hosts, rank_);
  {
    std::unordered_map<std::string, std::uint32_t> first;  // host -> its lowest rank
    host_of_.resize(hosts.size());
    for (std::size_t r = 0; r < hosts.size(); ++r) host_of_[r] = first.try_emplace(hosts[r], static_cast<std::uint32_t>(r)).first->second;
  }
  // Each device's transports, in this order: [network][host][self], each one that is used.
  std::vector<std::string> used;
  for (const std::string& name : {plan.network, plan.host, plan.self}) {
    if (!name.empty() && std::find(used.begin(), used.end(), name) == used.end()) used.push_back(name);
  }
  for (const std::string& name : used) {
    const std::string setting = name == plan.network && options_.value("transport") == "auto"
                                    ? "FERRY_NETWORK=" + name
                                    : "FERRY_TRANSPORT=" + options_.value("transport");
    backends_.push_back(net::backend(name, setting).open(net::OpenParams{config_.backends, plan.one_host, config_.packet_size}));
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
    if (parent > 1) failures_->watch_launcher(parent);
  }
  targets_ = std::make_unique<TargetTable>(config_.max_targets, rank_);
  barrier_ = std::make_unique<Barrier>(rank_, size_, *failures_, static_cast<BarrierDevices&>(*this));
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
  // Whether the job spans hosts: then the keepalive watches the peers on other hosts through a
  // channel of its own. Every rank agrees: each has peers away exactly when the job spans two.
  const bool any_away = std::find(plan.on_host.begin(), plan.on_host.end(), false) != plan.on_host.end();
  const auto params = [&](int device, bool heartbeat, const std::vector<bool>& away) {
    return net::TransportParams{.rank = rank_,
                                .size = size_,
                                .device = device,
                                .packet_size = config_.packet_size,
                                .packets = config_.packets,
                                .serialized = serialized,
                                .heartbeat = heartbeat,
                                .away = away};
  };
  std::vector<int> links;  // the keepalive channel's peers: this rank's links on the ring
  if (config_.peer_timeout_ms != 0 && any_away) {
    // Its links include ranks of this host (notices take the ring's shortcuts): every channel
    // endpoint handles its peer's failure as one away would.
    std::vector<bool> all_away(static_cast<std::size_t>(size_), true);
    all_away[static_cast<std::size_t>(rank_)] = false;
    auto channel = std::make_unique<HeartbeatChannel>(network_->make_transport(params(0, true, all_away)), rank_, size_);
    failures_->set_heartbeats(std::move(channel));
    links = failures_->use_ring(std::make_shared<const RingLayout>(host_indices(hosts)));
    boot_->put("ferry.alive", failures_->heartbeats()->address());
  }
  for (int d = 0; d < config_.devices; ++d) {
    std::vector<std::unique_ptr<net::Transport>> transports;
    for (auto& backend : backends_) transports.push_back(backend->make_transport(params(d, false, away_ranks)));
    devices_.push_back(std::make_unique<DeviceImpl>(device_parts(), d, config_, std::move(transports), route));
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
    std::size_t peers = 0;
    for (std::size_t t = 0; t < dev.transport_count(); ++t) {
      const std::string key = "ferry.ep." + std::to_string(d) + "." + std::to_string(t);
      std::vector<bool> reached(static_cast<std::size_t>(size_));
      for (int r = 0; r < size_; ++r) {
        reached[static_cast<std::size_t>(r)] = route[static_cast<std::size_t>(r)] == static_cast<int>(t);
      }
      // On first use over the network backend, whose peers may be the whole job; a host's
      // backend has at most a host's ranks, and ferry's shm unlinks its segments once every
      // peer attached, at start-up, so that a killed job leaves none behind.
      if (config_.connect == ConnectMode::lazy && static_cast<int>(t) == network_index &&
          dev.transport(t).connect_on_demand(reached, address_lookup(key))) {
        dev.add_connecting_on_demand(t);
        continue;
      }
      std::vector<std::string> addresses(static_cast<std::size_t>(size_));
      for (int r = 0; r < size_; ++r) {
        if (!reached[static_cast<std::size_t>(r)]) continue;
        addresses[static_cast<std::size_t>(r)] = counted.get(r, key);
        ++address_reads_;
        if (r != rank_) ++peers;
      }
      dev.transport(t).connect(addresses);
    }
    dev.set_peers_connected(peers);
    dev.start();
    handles_.push_back(Device(&dev, lock_models_[static_cast<std::size_t>(d)].get()));
  }
  if (HeartbeatChannel* heartbeats = failures_->heartbeats()) {
    std::vector<std::string> addresses(static_cast<std::size_t>(size_));
    for (int r : links) addresses[static_cast<std::size_t>(r)] = counted.get(r, "ferry.alive");
    address_reads_ += links.size();
    keepalive_links_ = links.size();
    heartbeats->connect(addresses);
  }
  bootstrap_reads_ = counted.reads();
  // Every rank has its receives posted before anyone sends, and every peer has attached to
  // this rank's shared memory, which can now go from the namespace.
  boot_->barrier();
  for (auto& dev : devices_) {
    for (std::size_t t = 0; t < dev->transport_count(); ++t) dev->transport(t).connected();
  }
  if (HeartbeatChannel* heartbeats = failures_->heartbeats()) {
    heartbeats->connected();
    failures_->start_keepalive();
  }
  try {
    progress_threads_ = start_progress_threads(config_, handles_);
  } catch (...) {
    failures_->stop_keepalive();  // before the devices go, as finalize would
    throw;
  }
}

net::AddressLookup RuntimeImpl::address_lookup(std::string key) {
  return [this, key = std::move(key)](int rank, std::string& address) noexcept -> int {
    const std::unique_lock<std::mutex> hold(boot_mutex_, std::try_to_lock);
    if (!hold.owns_lock()) return -EAGAIN;
    try {
      address = boot_->get(rank, key);
    } catch (const std::exception& e) {
      FERRY_LOG_AT(error, rank_, -1, "connecting rank %d: its address (%s): %s", rank, key.c_str(), e.what());
      return -EHOSTUNREACH;
    }
    lazy_reads_.fetch_add(1, std::memory_order_relaxed);
    if (!address.empty()) return 0;
    FERRY_LOG_AT(error, rank_, -1, "connecting rank %d: it published no address (%s)", rank, key.c_str());
    return -EHOSTUNREACH;
  };
}

Footprint RuntimeImpl::footprint() const {
  const std::size_t lazy = lazy_reads_.load(std::memory_order_relaxed);
  Footprint f{.devices = {},
              .bootstrap_reads = bootstrap_reads_ + lazy,
              .address_reads = address_reads_ + lazy,
              .keepalive_links = keepalive_links_,
              .recv_cache_bytes = recv_blocks::cached_bytes()};
  for (const auto& d : devices_) f.devices.push_back(d->footprint());
  return f;
}

void RuntimeImpl::perform_deferred() {
  for (auto& t : lock_models_) {
    if (t != nullptr) {
      const std::uint64_t before = t->deferred();
      IdleBackoff idle;
      while (t->performed() < before) idle(t->progress());
    }
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
    const double limit = failures_->failure_count() != 0 ? net::kAbandonGraceMs / 1000.0 + 0.5 : 10.0;
    const std::size_t left = drain(*d, limit);
    if (left != 0) {
      FERRY_LOG_AT(warn, rank_, -1, "finalize: %zu operations still in flight on device %d after %.0f s", left,
                   d->index(), limit);
    }
  }
  std::exception_ptr failure;
  try {
    barrier_->wait();
  } catch (const PeerFailed&) {
    failure = std::current_exception();
  } catch (const std::exception& e) {
    FERRY_LOG_AT(error, rank_, -1, "finalize: %s", e.what());
  }
  failures_->stop_keepalive();
  if (!devices_.empty()) barrier_->depart();
  finalized_.store(true);
  for (auto& d : devices_) d->mark_finalized();
  targets_->drop_parked();
  if (failure) std::rethrow_exception(failure);
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
  failures_->stop_keepalive();  // finalize threw before it stopped it
  failures_->close_heartbeats();
  handles_.clear();
  lock_models_.clear();  // an offload thread must be gone before its device's endpoint
  devices_.clear();
  backends_.clear();
  boot_.reset();
}

}  // namespace detail

}  // namespace ferry
