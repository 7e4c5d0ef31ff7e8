// target_table.hpp — the remote-target table: which completion object each id names, and the
// messages that arrived for an id before anything was exposed under it.
//
// Contract: targets_[id] holds the address of the completion object exposed under id, or 0;
// its low bit (free: the object is at least pointer-aligned) is set when the object does not
// batch (CompletionObject::batches(), read once by expose()), so the fast path that signals
// such an object at once needs no virtual call to ask. Delivery (inside a device's progress,
// any thread) loads it with acquire, pairing with the release store in expose(), so the object
// is fully constructed when signalled. A message for an id that is not exposed yet is parked
// under park_mutex_ (a slow path: it only happens when a sender is ahead of the receiver's
// setup) and handed over by expose(). Devices hold the table itself, not the runtime: the
// receive path's lookups (exposed, exposed_at_once) are inline here.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/extension.hpp"
#include "ferry/completion.hpp"

namespace ferry::detail {

class TargetTable {
 public:
  // `max_targets`: FERRY_MAX_TARGETS; `rank`: this process's, for the log lines.
  TargetTable(std::size_t max_targets, int rank);
  TargetTable(const TargetTable&) = delete;
  TargetTable& operator=(const TargetTable&) = delete;

  // The collectives' id (extension.hpp): messages for it that arrive before their engine
  // exists (a peer posted its first collective before this rank made a team) are parked.
  static constexpr std::uint16_t kCollectiveTarget = detail::kCollectiveTarget;

  // Throws Error when `id` is out of range or already exposed; hands over what was parked.
  void expose(CompletionObject& object, std::uint16_t id);
  // The collectives' engine: exposes `object` under kCollectiveTarget (once per table).
  void expose_collectives(CompletionObject& object);
  void unexpose_collectives() noexcept { collectives_.store(0, std::memory_order_release); }
  void unexpose(std::uint16_t id) noexcept { targets_[id].store(0, std::memory_order_release); }
  // Signals the object exposed under `id`, else parks the completion (or drops it, with a
  // warning, when no expose() could ever name `id`).
  void deliver(std::uint16_t id, Completion&& completion) noexcept;
  // The object exposed under `id`, or null (not exposed yet, or out of range): deliver's
  // fast path, for a caller that signals the object itself.
  CompletionObject* exposed(std::uint16_t id) const noexcept {
    return id < max_targets_ ? object_at(targets_[id].load(std::memory_order_acquire)) : beyond(id);
  }
  // The object exposed under `id` if it does not batch (it is signalled at once), else null.
  CompletionObject* exposed_at_once(std::uint16_t id) const noexcept {
    const std::uintptr_t v = id < max_targets_ ? targets_[id].load(std::memory_order_acquire) : entry_beyond(id);
    return (v & kAtOnce) != 0 ? object_at(v) : nullptr;
  }
  std::size_t max_targets() const noexcept { return max_targets_; }
  // Finalize: warns of each message still parked (nothing was ever exposed for it) and drops it.
  void drop_parked() noexcept;

 private:
  static constexpr std::uintptr_t kAtOnce = 1;  // targets_'s low bit: the object does not batch
  static CompletionObject* object_at(std::uintptr_t v) noexcept {
    return reinterpret_cast<CompletionObject*>(v & ~kAtOnce);
  }
  // An id past the application's: the collectives' entry, or nothing. Acquire, as above.
  std::uintptr_t entry_beyond(std::uint16_t id) const noexcept {
    return id == kCollectiveTarget ? collectives_.load(std::memory_order_acquire) : 0;
  }
  CompletionObject* beyond(std::uint16_t id) const noexcept { return object_at(entry_beyond(id)); }
  // Hands the messages parked for `id` to `object`.
  void hand_over(CompletionObject& object, std::uint16_t id);

  const std::size_t max_targets_;
  const int rank_;
  std::unique_ptr<std::atomic<std::uintptr_t>[]> targets_;
  std::atomic<std::uintptr_t> collectives_{0};  // kCollectiveTarget's entry, as targets_'s
  std::mutex park_mutex_;
  std::vector<std::pair<std::uint16_t, Completion>> parked_;  // under park_mutex_
};

}  // namespace ferry::detail
