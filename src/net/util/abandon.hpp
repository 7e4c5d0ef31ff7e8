// abandon.hpp — a backend's RMA operations in flight per peer, and giving up a failed peer's.
//
// Some providers never complete an operation whose peer died (libfabric's shm serves a read
// through the peer's own process; UCX without its peer error mode waits for an answer that
// never comes). A backend tracks each RMA operation (get, put, put_data) from post to
// completion here; when the core reports a peer failed, the ones still in flight to it get a
// grace period (kAbandonGraceMs) to complete by themselves, then are reported as events with
// -EHOSTDOWN and `abandoned` set, and a later completion of one is dropped.
//
// Contract: track/untrack from any posting thread (under a spin lock: RMA only, never the
// message path); settle, peer_failed, busy and abandon by the poll lock holder only. The core
// never reuses an abandoned context's memory, so an entry can never name a newer operation.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/spinlock.hpp"
#include "net/transport.hpp"

namespace ferry::net {

// Contexts with their peer's rank: open addressing, linear probing, a power-of-two size that
// doubles at half load (tombstones count), so an insert allocates only when the table grows.
// Not thread-safe: AbandonTracker guards it with a spin lock.
class RmaTable {
 public:
  RmaTable() : slots_(1024) {}
  void insert(OpContext* ctx, int rank) {
    if ((used_ + 1) * 2 > slots_.size()) grow();
    Slot* s = &slots_[index(ctx)];
    while (s->ctx != nullptr && s->ctx != tomb()) s = next(s);
    if (s->ctx == nullptr) ++used_;
    *s = Slot{ctx, rank};
  }
  // Removes `ctx`; false when it is not here.
  bool erase(OpContext* ctx) noexcept {
    for (Slot* s = &slots_[index(ctx)]; s->ctx != nullptr; s = next(s)) {
      if (s->ctx == ctx) {
        s->ctx = tomb();
        return true;
      }
    }
    return false;
  }
  // Removes every operation to `rank`, appending its context to `out`.
  void take_rank(int rank, std::vector<std::pair<OpContext*, int>>& out) {
    for (Slot& s : slots_) {
      if (s.ctx == nullptr || s.ctx == tomb() || s.rank != rank) continue;
      out.emplace_back(s.ctx, rank);
      s.ctx = tomb();
    }
  }

 private:
  struct Slot {
    OpContext* ctx = nullptr;  // null: empty; tomb(): erased
    int rank = -1;
  };
  static OpContext* tomb() noexcept { return reinterpret_cast<OpContext*>(std::uintptr_t{1}); }
  std::size_t index(const OpContext* ctx) const noexcept {
    // Contexts are at least 8-byte aligned; a multiplicative hash spreads the rest.
    const auto h = (reinterpret_cast<std::uintptr_t>(ctx) >> 3) * 0x9E3779B97F4A7C15ull;
    return static_cast<std::size_t>(h >> 20) & (slots_.size() - 1);
  }
  Slot* next(Slot* s) noexcept { return s + 1 == slots_.data() + slots_.size() ? slots_.data() : s + 1; }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    used_ = 0;
    for (const Slot& s : old)
      if (s.ctx != nullptr && s.ctx != tomb()) insert(s.ctx, s.rank);
  }
  std::vector<Slot> slots_;
  std::size_t used_ = 0;  // live entries and tombstones
};

class AbandonTracker {
 public:
  void track(OpContext* ctx, int rank) {
    std::lock_guard<detail::SpinLock> g(lock_);
    in_flight_.insert(ctx, rank);
    tracked_.fetch_add(1, std::memory_order_relaxed);
  }
  // The post of `ctx` failed: it was never in flight.
  void untrack(OpContext* ctx) noexcept {
    std::lock_guard<detail::SpinLock> g(lock_);
    if (in_flight_.erase(ctx)) tracked_.fetch_sub(1, std::memory_order_relaxed);
  }
  // Whether any operation may need settle(): one tracked or abandoned. By the poll lock holder,
  // for a completion it polled: relaxed suffices, because a tracked operation's track() happens
  // before its post, which the provider orders before the completion the caller holds, so the
  // load sees that increment or a later value, and only settle() or abandon() — this thread's
  // own — take the count back down for it. A completion of an untracked operation may see a
  // stale non-zero count: settle() then finds nothing, which is correct, only slower.
  bool tracking() const noexcept { return tracked_.load(std::memory_order_relaxed) != 0 || !abandoned_.empty(); }
  // A backend completion of the tracked `ctx`: true when it was reported abandoned already
  // (drop the event: the core has finished the operation).
  bool settle(OpContext* ctx) noexcept {
    if (__builtin_expect(!abandoned_.empty(), 0) && abandoned_.erase(ctx) != 0) return true;
    std::lock_guard<detail::SpinLock> g(lock_);
    if (in_flight_.erase(ctx)) tracked_.fetch_sub(1, std::memory_order_relaxed);
    return false;
  }
  void peer_failed(int rank) {
    failing_.push_back(Failing{rank, std::chrono::steady_clock::now() + std::chrono::milliseconds(kAbandonGraceMs)});
  }
  // Failed peers in their grace period, or abandoned operations not yet reported.
  bool busy() const noexcept { return !failing_.empty() || !abandoning_.empty(); }
  // Failed peers whose grace period is over: their operations still in flight become up to
  // `max` abandoned events; returns how many.
  int abandon(Event* events, int max) {
    const auto now = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < failing_.size();) {
      if (failing_[i].deadline > now) {
        ++i;
        continue;
      }
      const int rank = failing_[i].rank;
      {
        std::lock_guard<detail::SpinLock> g(lock_);
        const std::size_t before = abandoning_.size();
        in_flight_.take_rank(rank, abandoning_);
        tracked_.fetch_sub(abandoning_.size() - before, std::memory_order_relaxed);
      }
      failing_[i] = failing_.back();
      failing_.pop_back();
    }
    int n = 0;
    while (n < max && !abandoning_.empty()) {
      const auto [c, rank] = abandoning_.back();
      abandoning_.pop_back();
      abandoned_.insert(c);
      Event& out = events[n++];
      out = Event{};
      out.context = c;
      out.rank = rank;
      out.error = -EHOSTDOWN;
      out.abandoned = true;
    }
    return n;
  }

 private:
  struct Failing {
    int rank;
    std::chrono::steady_clock::time_point deadline;
  };
  detail::SpinLock lock_;
  RmaTable in_flight_;  // under lock_
  std::atomic<std::size_t> tracked_{0};  // in_flight_'s entries; changed under lock_, read by tracking()
  std::vector<Failing> failing_;
  std::vector<std::pair<OpContext*, int>> abandoning_;
  std::unordered_set<OpContext*> abandoned_;
};

}  // namespace ferry::net
