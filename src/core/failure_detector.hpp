// failure_detector.hpp — PeerFailures: which peers failed, and everything that finds out:
// the watch of this host's peers' processes and of the launcher (check_peers, from progress),
// the keepalive thread with its heartbeat channel and its share of the monitoring ring (peers on
// other hosts, monitor_ring.hpp), the departures that
// tell a finalizing peer's end from a failure, and what transports report (peer_failed).
//
// Contract: failed_[r] goes 0 -> 1 once (exchange), then failure_count_ is incremented with
// release; a reader that acquires the count sees every flag set before it. failed() reads a
// flag relaxed: a post that reads a stale 0 goes to the transport, which fails or is dropped
// like one posted just before the failure; ordering against a device's pending-operation
// tables comes from their own locks (see DeviceImpl::fail_peer). first_failed_ is relaxed: it
// only names a rank in an error, read after the count says there is one. departed_ is relaxed
// (see there). The watch is under watch_mutex_ (try_lock: one checker at a time); the
// keepalive's state is its thread's alone once started.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/config.hpp"
#include "core/heartbeats.hpp"
#include "core/liveness.hpp"
#include "core/monitor_ring.hpp"

namespace ferry::detail {

class PeerFailures {
 public:
  PeerFailures(int rank, int size, const Config& config);
  ~PeerFailures();  // stops the keepalive thread if it still runs
  PeerFailures(const PeerFailures&) = delete;
  PeerFailures& operator=(const PeerFailures&) = delete;

  // Setup, before any device progresses: this host's peers' processes to watch (filled by
  // exchange_hosts), the launcher's pid to watch (FERRY_LAUNCHER_WATCH), the keepalive's
  // channel (when the job spans hosts and FERRY_PEER_TIMEOUT_MS is not 0).
  PeerWatch& watch() noexcept { return watch_; }
  void watch_launcher(pid_t parent) noexcept { launcher_ = parent; }
  void set_heartbeats(std::unique_ptr<HeartbeatChannel> channel) noexcept { heartbeats_ = std::move(channel); }
  HeartbeatChannel* heartbeats() noexcept { return heartbeats_.get(); }
  // The monitoring ring (monitor_ring.hpp), before the channel connects: the ranks it links
  // this one to, the only ones whose channel addresses it needs.
  const std::vector<int>& use_ring(std::shared_ptr<const RingLayout> ring);
  // Starts the keepalive thread over the channel and the ring.
  void start_keepalive();
  // Its end (idempotent); departing heartbeats go out as it stops.
  void stop_keepalive() noexcept;
  // Teardown, after stop_keepalive: the channel closed, a failed peer's connection abandoned,
  // not closed (libfabric's rxm can crash flushing an inject to a peer that is unreachable).
  void close_heartbeats() noexcept;

  // Records that `rank` failed, once (not this rank, nor one that departed), and tells every
  // device through the count (each acts on it in its next progress, under its poll lock).
  // Any thread; `how` says what showed it.
  void peer_failed(int rank, const std::string& how) noexcept;
  // Relaxed: see the contract above.
  bool failed(int rank) const noexcept { return failed_[static_cast<std::size_t>(rank)].load(std::memory_order_relaxed) != 0; }
  const std::atomic<std::uint8_t>* failed_table() const noexcept { return failed_.get(); }
  // Bumped by every new failure; a device compares it with the value it last acted on.
  // Acquire pairs with the release increment in peer_failed(): a device that sees the new
  // count sees the failed_ flag set before it.
  std::uint32_t failure_count() const noexcept { return failure_count_.load(std::memory_order_acquire); }
  std::vector<int> failed_ranks() const;
  // Throws PeerFailed naming the first failed rank, if any; `call` names the caller.
  void throw_if_failed(const char* call) const;
  // At most once per FERRY_PEER_CHECK_MS (by whichever progress call comes first): checks the
  // watched peers' processes; one seen ended is failed at the next check unless it departed.
  // Cheap when it is not yet time: one clock read. Peers on other hosts are the keepalive
  // thread's (keep_alive).
  void check_peers() noexcept;
  // `rank` finalized (its departure message arrived): its end that follows is no failure.
  void departed(int rank) noexcept {
    if (departed_[static_cast<std::size_t>(rank)].exchange(1, std::memory_order_relaxed) == 0) {
      departures_.fetch_add(1, std::memory_order_relaxed);
    }
  }

 private:
  bool has_departed(int rank) const noexcept {
    return departed_[static_cast<std::size_t>(rank)].load(std::memory_order_relaxed) != 0;
  }
  // The keepalive thread's body: the channel polled, heartbeats out, notices of failures in
  // and out, silence checks; departing heartbeats when it stops.
  void keep_alive() noexcept;
  // Gives the ring every failure recorded since the last call (the keepalive thread's).
  void spread_new_failures();

  const int rank_;
  const int size_;
  const Config& config_;
  std::unique_ptr<std::atomic<std::uint8_t>[]> failed_;  // by rank: 1 once the rank failed
  std::atomic<std::uint32_t> failure_count_{0};
  std::atomic<int> first_failed_{-1};
  PeerWatch watch_;
  std::mutex watch_mutex_;  // check_peers takes it with try_lock: one checker at a time
  std::atomic<std::int64_t> next_check_ns_{0};  // steady clock; relaxed: a hint, the mutex guards the watch
  // By rank: 1 once its departure message (data path) or departing heartbeat (keepalive
  // channel) arrived. Relaxed: check_peers reads it one check interval after the watch saw the
  // process end, long after the message was polled; the keepalive thread and peer_failed only
  // need it eventually (a peer failed just before its departure is seen is still a peer that
  // stopped answering), and it guards no other data.
  std::unique_ptr<std::atomic<std::uint8_t>[]> departed_;
  // Departures recorded: with failure_count(), the ring's gone_version. Relaxed like departed_:
  // a change seen a tick late only delays the ring's next guardians by that tick.
  std::atomic<std::uint32_t> departures_{0};
  std::vector<int> suspects_;  // under watch_mutex_: processes seen ended at the last check
  pid_t launcher_ = 0;         // FERRY_LAUNCHER_WATCH: the parent at start-up (0: not watched)
  // The keepalive's channel, or null; used only by the keepalive thread once it runs.
  std::unique_ptr<HeartbeatChannel> heartbeats_;
  std::unique_ptr<RingMonitor> monitor_;  // made before the keepalive thread, used only by it
  std::vector<std::uint8_t> spread_;      // by rank: a failure the ring was given (keepalive thread)
  std::uint32_t spread_count_ = 0;        // failure_count() when spread_ was last brought up to date
  std::thread keepalive_thread_;
  std::mutex keepalive_mutex_;
  std::condition_variable keepalive_wake_;
  bool keepalive_stop_ = false;  // under keepalive_mutex_
};

}  // namespace ferry::detail
