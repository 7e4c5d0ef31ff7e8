// queue_impl.hpp — the queue algorithms behind a CompletionQueue (QueueKind), and the process
// default kind (FERRY_COMPLETION).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <span>

#include "ferry/completion.hpp"

namespace ferry::detail {

// The queue algorithm behind a CompletionQueue. push may fail only when the queue truly cannot
// take the entry right now (full, or a cell it needs is held by a preempted thread: see each
// algorithm's contract); pop fails only when nothing is queued or nothing queued is published
// yet. Neither blocks. A failed push leaves the entry with the caller. pop is given an empty
// optional and fills it only on success.
class QueueImpl {
 public:
  virtual ~QueueImpl() = default;
  virtual bool push(Completion&& c) noexcept = 0;
  // Pushes a prefix of `cs` in order and returns its length (moved-from entries); the rest
  // stays with the caller, as a refused push does. The default pushes one at a time.
  virtual std::size_t push_batch(std::span<Completion> cs) noexcept {
    std::size_t k = 0;
    while (k < cs.size() && push(std::move(cs[k]))) ++k;
    return k;
  }
  virtual bool pop(std::optional<Completion>& c) noexcept = 0;
  virtual std::size_t capacity() const noexcept = 0;
};

// kind must not be default_kind (resolve it with default_queue_kind() first).
std::unique_ptr<QueueImpl> make_queue(QueueKind kind, std::size_t capacity);

// The kind FERRY_COMPLETION selects for queues made with QueueKind::default_kind:
// cq -> the fastest array queue as measured, cq_ms -> ms, cq_lock -> lock. "sync" (completion
// through synchronizers) still has queues wherever a caller asks for one: they get cq's kind.
// Throws ferry::Error naming FERRY_COMPLETION, the value and the valid values.
QueueKind default_queue_kind();

// "ring", "faa", "ms", "lock" (and "default" for default_kind).
const char* queue_kind_name(QueueKind kind) noexcept;

}  // namespace ferry::detail
