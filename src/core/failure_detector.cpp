// failure_detector.cpp — peer failure detection (PeerFailures): a failure recorded once and
// counted for every device, the keepalive thread's heartbeats and silence checks, the watch of
// this host's peers' processes and of the launcher.
#include "core/failure_detector.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <exception>

#include "common/log.hpp"
#include "ferry/error.hpp"
#include "net/transport.hpp"

namespace ferry::detail {

PeerFailures::PeerFailures(int rank, int size, const Config& config)
    : rank_(rank),
      size_(size),
      config_(config),
      failed_(std::make_unique<std::atomic<std::uint8_t>[]>(static_cast<std::size_t>(size))),
      departed_(std::make_unique<std::atomic<std::uint8_t>[]>(static_cast<std::size_t>(size))) {
  for (int r = 0; r < size_; ++r) {
    failed_[static_cast<std::size_t>(r)].store(0, std::memory_order_relaxed);
    departed_[static_cast<std::size_t>(r)].store(0, std::memory_order_relaxed);
  }
}

// A joinable thread must not be destroyed: a runtime whose construction failed after the
// keepalive started still ends it here.
PeerFailures::~PeerFailures() { stop_keepalive(); }

const std::vector<int>& PeerFailures::use_ring(std::shared_ptr<const RingLayout> ring) {
  monitor_ = std::make_unique<RingMonitor>(std::move(ring), rank_, config_.peer_timeout_ms, config_.peer_check_ms);
  spread_.assign(static_cast<std::size_t>(size_), 0);
  return monitor_->links();
}

void PeerFailures::start_keepalive() {
  keepalive_thread_ = std::thread([this] { keep_alive(); });
}

void PeerFailures::close_heartbeats() noexcept {
  if (heartbeats_ == nullptr) return;
  if (monitor_ != nullptr) {
    for (int r : monitor_->links())
      if (failed(r)) heartbeats_->peer_failed(r);
  }
  heartbeats_.reset();
}

void PeerFailures::spread_new_failures() {
  const std::uint32_t count = failure_count();
  if (count == spread_count_) return;
  spread_count_ = count;
  for (int r = 0; r < size_; ++r) {
    std::uint8_t& given = spread_[static_cast<std::size_t>(r)];
    if (given == 0 && failed(r)) {
      given = 1;
      monitor_->spread(r);
    }
  }
}

void PeerFailures::peer_failed(int rank, const std::string& how) noexcept {
  if (rank < 0 || rank >= size_ || rank == rank_) return;
  // A rank that finalized ends its connections as it leaves: that is no failure.
  if (has_departed(rank)) return;
  if (failed_[static_cast<std::size_t>(rank)].exchange(1, std::memory_order_relaxed) != 0) return;
  int none = -1;
  first_failed_.compare_exchange_strong(none, rank, std::memory_order_relaxed);
  FERRY_LOG_AT(error, rank_, -1, "rank %d failed: %s", rank, how.c_str());
  // Release: a device that reads the new count (acquire) also reads the flag set above.
  failure_count_.fetch_add(1, std::memory_order_release);
}

// Every check interval: the keepalive channel polled (a heartbeat marks its sender heard, a
// departing one marks it departed, a notice fails its subject), then the ring's step:
// heartbeats to this rank's guardians, the silence check of its wards, and a notice to every
// link of each failure newly recorded here, whoever found it. From a thread of its own, not
// from progress: a rank that computes for a while without calling progress is still heard and
// still hears. While notices move, the thread also wakes every kNoticePollMs between checks,
// so a notice crosses each hop in milliseconds, not in a check interval. A message refused for
// now (a full queue, a connection still being made) is tried again at the next wake. When the
// thread stops (finalize), each link gets a departing heartbeat, so the silence that follows is
// not taken for a failure even before the departure message on the data path, behind whatever
// this rank sent last, reaches it.
void PeerFailures::keep_alive() noexcept {
  using Clock = std::chrono::steady_clock;
  constexpr auto kNoticePollMs = std::chrono::milliseconds(2);
  const auto tick = std::chrono::milliseconds(config_.peer_check_ms);
  struct Channel final : RingMonitor::Outbox {
    HeartbeatChannel& channel;
    explicit Channel(HeartbeatChannel& c) : channel(c) {}
    int send(int to, Beat kind, int subject) noexcept override { return channel.send(to, kind, subject); }
  } out(*heartbeats_);
  const GoneFn gone = [this](int r) { return failed(r) || has_departed(r); };
  Clock::time_point last_check = Clock::now(), next_check = last_check;
  Clock::time_point busy_until{};  // notices moved recently: wake often until then
  std::vector<int> silent;
  std::vector<HeartbeatChannel::Arrived> arrived;
  arrived.reserve(64);
  bool warned = false, warned_oom = false;
  std::unique_lock<std::mutex> lock(keepalive_mutex_);
  for (bool first = true;; first = false) {
    if (!first) {
      const Clock::time_point wake = Clock::now() < busy_until ? std::min(next_check, Clock::now() + kNoticePollMs)
                                                               : next_check;
      if (keepalive_wake_.wait_until(lock, wake, [this] { return keepalive_stop_; })) break;
    }
    lock.unlock();
    try {
      arrived.clear();
      heartbeats_->poll(arrived);
      bool notices = false;
      for (const HeartbeatChannel::Arrived& a : arrived) {
        switch (a.kind) {
          case Beat::alive: monitor_->heard(a.rank); break;
          case Beat::departing:
            monitor_->heard(a.rank);
            departed(a.rank);
            break;
          case Beat::failed:
            notices = true;
            if (a.subject == rank_) {
              // Its guardians or the ring took this rank for failed (a cut link, a stall):
              // from here on it is gone from this rank too, on both sides of the cut.
              peer_failed(a.rank, "it reported this rank failed (a cut between them, or this rank stalled)");
            } else {
              peer_failed(a.subject, "rank " + std::to_string(a.rank) + " reported it failed");
            }
            break;
        }
      }
      const Clock::time_point now = Clock::now();
      if (now >= next_check) {
        const std::int64_t elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_check).count();
        last_check = now;
        next_check = now + tick;
        silent.clear();
        spread_new_failures();
        const std::uint64_t version =
            std::uint64_t{failure_count()} << 32 | departures_.load(std::memory_order_relaxed);
        monitor_->tick(std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count(), elapsed,
                       version, gone, out, silent);
        for (int r : silent) {
          peer_failed(r, "no heartbeat from it for " + std::to_string(config_.peer_timeout_ms) +
                             " ms (FERRY_PEER_TIMEOUT_MS): its host, its process or the link to it is down");
        }
      }
      spread_new_failures();
      monitor_->flush(gone, out);
      if (notices || monitor_->spreading()) busy_until = now + tick;
      if (monitor_->send_error() != 0 && !warned) {
        FERRY_LOG_AT(warn, rank_, -1, "keepalive: a message to rank %d failed: %s", monitor_->send_error_peer(),
                     net::error_text("inject", monitor_->send_error()).c_str());
        warned = true;
      }
    } catch (const std::exception& e) {
      // Out of memory (a vector or a message string): the step is tried again at the next
      // wake; a peer in `silent` not yet failed is named then.
      if (!warned_oom) FERRY_LOG_AT(warn, rank_, -1, "keepalive: %s", e.what());
      warned_oom = true;
    }
    lock.lock();
  }
  lock.unlock();
  // Departing: best effort, a few polls to let the channel send them.
  monitor_->depart(gone, out);
  arrived.clear();
  for (int i = 0; i < 5; ++i) {
    try {
      heartbeats_->poll(arrived);
    } catch (...) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void PeerFailures::stop_keepalive() noexcept {
  if (!keepalive_thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> guard(keepalive_mutex_);
    keepalive_stop_ = true;
  }
  keepalive_wake_.notify_all();
  keepalive_thread_.join();
}

std::vector<int> PeerFailures::failed_ranks() const {
  std::vector<int> out;
  if (failure_count() == 0) return out;
  for (int r = 0; r < size_; ++r)
    if (failed(r)) out.push_back(r);
  return out;
}

void PeerFailures::throw_if_failed(const char* call) const {
  if (__builtin_expect(failure_count() == 0, 1)) return;
  const int r = first_failed_.load(std::memory_order_relaxed);
  const std::vector<int> all = failed_ranks();
  std::string list;
  for (int f : all) list += (list.empty() ? "" : ", ") + std::to_string(f);
  throw PeerFailed(r, std::string(call) + ": rank " + std::to_string(r) + " failed (failed ranks: " + list + ")");
}

void PeerFailures::check_peers() noexcept {
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
      if (!has_departed(r)) {
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
