// progress_policy.hpp — which device an idle thread progresses: Daps-style progress stealing
// (FERRY_PROGRESS=steal, [Daps] §IV), and the NUMA hint it uses. (The per-thread random
// source of FERRY_DEVICE_POLLING=random and of the steals is common/random.hpp.) Header-only and
// free of ferry's types, so the unit tests drive it with a fake progress function.
#pragma once

#include <dirent.h>
#include <sched.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "common/cache_line.hpp"
#include "common/random.hpp"

namespace ferry::parcel::detail {

// The NUMA node of the CPU the caller runs on now (-1 when the system does not say): the
// node<k> entry in /sys/devices/system/cpu/cpu<N>/. Threads are not pinned by default, so this
// is where the thread happened to be when asked — a placement hint, not a fact. Slow (reads a
// directory): callers cache it per thread.
inline int current_numa_node() noexcept {
  const int cpu = sched_getcpu();
  if (cpu < 0) return -1;
  char path[64];
  std::snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d", cpu);
  DIR* dir = opendir(path);
  if (dir == nullptr) return -1;
  int node = -1;
  while (dirent* e = readdir(dir)) {
    if (std::strncmp(e->d_name, "node", 4) == 0 && e->d_name[4] >= '0' && e->d_name[4] <= '9') {
      node = static_cast<int>(std::strtol(e->d_name + 4, nullptr, 10));
      break;
    }
  }
  closedir(dir);
  return node;
}

// Progress stealing among the workers of one process and its devices.
//
// Contract
//  - try_progress(d, f) runs f() (one progress call on device d) only if no other thread is
//    inside try_progress(d): in_progress[d] is a test-and-set flag, so two threads never
//    progress one device through this policy at once, and nobody ever waits for it (a held
//    flag means "someone is on it", which is all a would-be helper needs to know). The
//    exchange that takes it is acquire and the store that drops it is release: the next holder
//    sees everything the previous one did inside (the hint it left, anything f touched).
//  - likely_work[d] ("likely has work") is set when a progress call on d found something or
//    when an operation that will complete on d was posted (expect_work), and cleared when a
//    progress call on d found nothing.
//  - Owners: the workers whose static thread→device map names d register once (add_owner);
//    owner_busy(d, b) counts those running a task. d is unattended when it has no registered
//    owner or all of them are busy: no idle thread is polling it as its own.
//  - poll(): the idle thread's step. It progresses its own device; if that found nothing (or
//    someone else holds it), it picks one victim — unattended, likely to have work, not in
//    progress — preferring devices whose owner ran on the thread's own NUMA node, starting at
//    a random device so stealers spread out, and progresses it. One probe in 64 ignores the
//    hint (an unattended device that receives an unexpected message has no hint set: the
//    probe keeps it from starving). Never blocks: at most two try-locks.
//  - Hints, owner counts and nodes are relaxed atomics: they only steer the choice and guard
//    no data; a stale value costs one useless or one missed steal, never correctness.
class StealPolicy {
 public:
  explicit StealPolicy(int devices) : n_(devices), slots_(new Slot[static_cast<std::size_t>(devices)]) {}

  int devices() const noexcept { return n_; }

  // -1: another thread is progressing d, f did not run; 0: f ran and found nothing; 1: found work.
  template <class F>
  int try_progress(int d, F&& progress) {
    Slot& s = slots_[static_cast<std::size_t>(d)];
    // A plain load first: a visibly held flag costs no cache-line transfer for the writer.
    if (s.in_progress.load(std::memory_order_relaxed)) return -1;
    if (s.in_progress.exchange(true, std::memory_order_acquire)) return -1;
    struct Release {
      std::atomic<bool>& flag;
      ~Release() { flag.store(false, std::memory_order_release); }
    } release{s.in_progress};
    const bool found = progress(d);
    if (s.likely_work.load(std::memory_order_relaxed) != found) s.likely_work.store(found, std::memory_order_relaxed);
    return found ? 1 : 0;
  }

  void expect_work(int d) noexcept {
    Slot& s = slots_[static_cast<std::size_t>(d)];
    if (!s.likely_work.load(std::memory_order_relaxed)) s.likely_work.store(true, std::memory_order_relaxed);
  }

  void add_owner(int d, int node) noexcept {
    Slot& s = slots_[static_cast<std::size_t>(d)];
    int none = -1;
    s.node.compare_exchange_strong(none, node, std::memory_order_relaxed);  // the first owner's node names the device's
    s.owners.fetch_add(1, std::memory_order_relaxed);
  }

  void owner_busy(int d, bool busy) noexcept {
    slots_[static_cast<std::size_t>(d)].busy.fetch_add(busy ? 1 : -1, std::memory_order_relaxed);
  }

  bool unattended(int d) const noexcept {
    const Slot& s = slots_[static_cast<std::size_t>(d)];
    const int owners = s.owners.load(std::memory_order_relaxed);
    return owners == 0 || s.busy.load(std::memory_order_relaxed) >= owners;
  }
  bool likely_work(int d) const noexcept { return slots_[static_cast<std::size_t>(d)].likely_work.load(std::memory_order_relaxed); }
  bool in_progress(int d) const noexcept { return slots_[static_cast<std::size_t>(d)].in_progress.load(std::memory_order_relaxed); }

  // The device to steal from, or -1. `start` rotates the scan; `probe` ignores the hint.
  int pick_victim(int own, int node, int start, bool probe) const noexcept {
    int other_node = -1;
    for (int k = 0; k < n_; ++k) {
      const int d = (start + k) % n_;
      if (d == own || in_progress(d) || !unattended(d) || !(probe || likely_work(d))) continue;
      const int dn = slots_[static_cast<std::size_t>(d)].node.load(std::memory_order_relaxed);
      if (node < 0 || dn < 0 || dn == node) return d;  // same (or unknown) node: take it
      if (other_node < 0) other_node = d;              // remote node: only if nothing local
    }
    return other_node;
  }

  // The Daps step for an idle thread whose own device is `own`. True if a progress call found work.
  template <class F>
  bool poll(int own, int node, ferry::detail::XorShift& rng, F&& progress) {
    const int mine = try_progress(own, progress);
    if (mine == 1 || n_ == 1) return mine == 1;
    const std::uint32_t r = rng.next();
    const int victim = pick_victim(own, node, static_cast<int>(r % static_cast<std::uint32_t>(n_)), (r >> 26) == 0);
    if (victim < 0) return false;
    return try_progress(victim, progress) == 1;
  }

 private:
  // One device's flags, alone on a line: stealers hammer neighbouring devices' slots.
  struct alignas(ferry::detail::cache_line) Slot {
    std::atomic<bool> in_progress{false};
    std::atomic<bool> likely_work{true};  // unknown at first: worth a look
    std::atomic<int> owners{0};
    std::atomic<int> busy{0};
    std::atomic<int> node{-1};
  };
  static_assert(sizeof(Slot) == ferry::detail::cache_line && alignof(Slot) == ferry::detail::cache_line);
  const int n_;
  std::unique_ptr<Slot[]> slots_;
};

}  // namespace ferry::parcel::detail
