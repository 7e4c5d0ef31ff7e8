// target_table.cpp — the remote-target table's slow paths: expose (with the hand-over of
// parked messages), delivery to an id not exposed yet, and the parked messages' end.
#include "core/target_table.hpp"

#include <string>

#include "common/log.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {

TargetTable::TargetTable(std::size_t max_targets, int rank)
    : max_targets_(max_targets), rank_(rank), targets_(std::make_unique<std::atomic<std::uintptr_t>[]>(max_targets)) {
  for (std::size_t i = 0; i < max_targets_; ++i) targets_[i].store(0, std::memory_order_relaxed);
}

void TargetTable::expose(CompletionObject& object, std::uint16_t id) {
  if (id >= max_targets_) {
    throw Error("expose: id=" + std::to_string(id) + " is out of range; FERRY_MAX_TARGETS=" + std::to_string(max_targets_));
  }
  static_assert(alignof(CompletionObject) > kAtOnce, "targets_ keeps a flag in the address's low bit");
  const std::uintptr_t entry = reinterpret_cast<std::uintptr_t>(&object) | (object.batches() ? 0 : kAtOnce);
  std::uintptr_t expected = 0;
  // Release: a progress thread that loads the entry (acquire) sees a constructed object.
  if (!targets_[id].compare_exchange_strong(expected, entry, std::memory_order_release, std::memory_order_relaxed)) {
    throw Error("expose: id=" + std::to_string(id) + " is already exposed");
  }
  hand_over(object, id);
}

void TargetTable::expose_collectives(CompletionObject& object) {
  const std::uintptr_t entry = reinterpret_cast<std::uintptr_t>(&object) | (object.batches() ? 0 : kAtOnce);
  std::uintptr_t expected = 0;
  // Release, as expose's.
  if (!collectives_.compare_exchange_strong(expected, entry, std::memory_order_release, std::memory_order_relaxed)) {
    throw Error("expose: the collectives' target is already exposed");
  }
  hand_over(object, kCollectiveTarget);
}

void TargetTable::hand_over(CompletionObject& object, std::uint16_t id) {
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

void TargetTable::deliver(std::uint16_t id, Completion&& completion) noexcept {
  if (CompletionObject* t = exposed(id)) {
    t->signal(std::move(completion));
    return;
  }
  if (id >= max_targets_ && id != kCollectiveTarget) {
    // No expose() can name it: parked, it would wait forever. The sender's id is not ours.
    FERRY_LOG_AT(warn, rank_, -1, "dropped a message from rank %d for target %u: FERRY_MAX_TARGETS=%zu", completion.rank,
                 id, max_targets_);
    return;
  }
  std::lock_guard<std::mutex> guard(park_mutex_);
  if (CompletionObject* t = exposed(id)) {
    t->signal(std::move(completion));
    return;
  }
  try {
    parked_.emplace_back(id, std::move(completion));
  } catch (...) {
    FERRY_LOG_AT(error, rank_, -1, "out of memory parking a message for target %u", id);
  }
}

void TargetTable::drop_parked() noexcept {
  std::lock_guard<std::mutex> guard(park_mutex_);
  for (const auto& [id, c] : parked_) {
    FERRY_LOG_AT(warn, rank_, -1,
                 "an active message from rank %d for remote target %u was never delivered: "
                 "no completion object was exposed under that id",
                 c.rank, static_cast<unsigned>(id));
  }
  parked_.clear();
}

}  // namespace ferry::detail
