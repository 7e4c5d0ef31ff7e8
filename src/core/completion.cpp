#include <rdma/fi_errno.h>

#include <mutex>
#include <string>

#include "core/config.hpp"
#include "core/mpmc_ring.hpp"
#include "ferry/completion.hpp"
#include "ferry/error.hpp"
#include "ferry/status.hpp"

namespace ferry {

const char* to_string(StatusKind kind) noexcept {
  switch (kind) {
    case StatusKind::done: return "done";
    case StatusKind::posted: return "posted";
    case StatusKind::retry: return "retry";
  }
  return "?";
}

const char* to_string(RetryReason reason) noexcept {
  switch (reason) {
#define FERRY_X(name, text) \
  case RetryReason::name: return #name;
    FERRY_RETRY_REASONS(FERRY_X)
#undef FERRY_X
  }
  return "?";
}

const char* to_string(OpKind kind) noexcept {
  switch (kind) {
    case OpKind::am: return "am";
    case OpKind::send: return "send";
    case OpKind::recv: return "recv";
    case OpKind::put: return "put";
    case OpKind::get: return "get";
    case OpKind::remote_put: return "remote_put";
    case OpKind::remote_am: return "remote_am";
  }
  return "?";
}

std::string Completion::error_string() const {
  if (error == 0) return "success";
  return std::string(fi_strerror(-error)) + " (" + std::to_string(error) + ") with rank " + std::to_string(rank);
}

namespace detail {

// The queue algorithm behind a CompletionQueue. Implementations follow MpmcRing's contract:
// push may fail only when full, pop only when empty, neither blocks.
class QueueImpl {
 public:
  virtual ~QueueImpl() = default;
  virtual bool push(Completion&& c) noexcept = 0;
  virtual bool pop(Completion& c) noexcept = 0;
  virtual std::size_t capacity() const noexcept = 0;
};

namespace {

class RingQueue final : public QueueImpl {
 public:
  explicit RingQueue(std::size_t capacity) : ring_(capacity) {}
  bool push(Completion&& c) noexcept override { return ring_.try_push(std::move(c)); }
  bool pop(Completion& c) noexcept override { return ring_.try_pop(c); }
  std::size_t capacity() const noexcept override { return ring_.capacity(); }

 private:
  MpmcRing<Completion> ring_;
};

}  // namespace
}  // namespace detail

CompletionQueue::CompletionQueue(CompletionQueueOptions options) {
  const std::size_t cap = options.capacity != 0 ? options.capacity : detail::default_cq_capacity();
  switch (options.kind) {
    case QueueKind::ring: impl_ = std::make_unique<detail::RingQueue>(cap); break;
  }
  if (!impl_) throw Error("CompletionQueueOptions::kind=" + std::to_string(static_cast<int>(options.kind)) + " is unknown");
}

CompletionQueue::~CompletionQueue() = default;

void CompletionQueue::signal(Completion&& completion) noexcept {
  if (impl_->push(std::move(completion))) return;
  // Full: the consumer has fallen a whole capacity behind. signal() runs inside progress and
  // must neither drop the entry nor wait (the consumer may be this very thread), so the entry
  // spills into an unbounded overflow list. This slow path allocates and locks; the fast path
  // never touches it but for one relaxed load in pop().
  std::lock_guard<std::mutex> guard(overflow_mutex_);
  overflow_.push_back(std::move(completion));
  overflow_size_.store(overflow_.size(), std::memory_order_relaxed);
}

std::optional<Completion> CompletionQueue::pop() noexcept {
  Completion c;
  if (impl_->pop(c)) return std::optional<Completion>(std::move(c));
  // Relaxed is enough: a stale zero only delays the spilled entry to a later pop, and the
  // entry itself is read under the mutex.
  if (overflow_size_.load(std::memory_order_relaxed) != 0) {
    std::lock_guard<std::mutex> guard(overflow_mutex_);
    if (!overflow_.empty()) {
      c = std::move(overflow_.front());
      overflow_.pop_front();
      overflow_size_.store(overflow_.size(), std::memory_order_relaxed);
      return std::optional<Completion>(std::move(c));
    }
  }
  return std::nullopt;
}

std::size_t CompletionQueue::capacity() const noexcept { return impl_->capacity(); }

Synchronizer::Synchronizer(std::size_t n) : n_(n), slots_(n) {
  if (n == 0) throw Error("Synchronizer: n=0; a synchronizer counts at least one signal");
}

void Synchronizer::signal(Completion&& completion) noexcept {
  // The slot index is a ticket (relaxed); the release increment of arrived_ publishes the
  // slot's contents to the thread that sees test() == true through its acquire load.
  const std::size_t i = claimed_.fetch_add(1, std::memory_order_relaxed);
  if (i < n_) slots_[i] = std::move(completion);
  arrived_.fetch_add(1, std::memory_order_release);
}

void Synchronizer::reset() noexcept {
  for (auto& s : slots_) s = Completion{};
  claimed_.store(0, std::memory_order_relaxed);
  arrived_.store(0, std::memory_order_release);
}

void Handler::signal(Completion&& completion) noexcept { fn_(std::move(completion)); }

}  // namespace ferry
