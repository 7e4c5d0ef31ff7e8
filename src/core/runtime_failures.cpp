// runtime_failures.cpp — peer failure detection: a failure recorded once and told to every
// device, the departure a finalizing rank announces, the keepalive thread's heartbeats and
// silence checks, the watch of this host's peers' processes and of the launcher.
#include <unistd.h>

#include <chrono>
#include <exception>

#include "common/log.hpp"
#include "core/runtime_impl.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {

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

}  // namespace ferry::detail
