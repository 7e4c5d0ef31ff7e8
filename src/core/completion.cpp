#include <algorithm>
#include <cstring>

#include <mutex>
#include <span>
#include <string>

#include "core/config.hpp"
#include "common/mpmc_ring.hpp"
#include "common/faa_ring.hpp"
#include "common/ms_queue.hpp"
#include "core/queues/queue_impl.hpp"
#include "ferry/completion.hpp"
#include "ferry/datatype.hpp"
#include "ferry/runtime.hpp"
#include "ferry/error.hpp"
#include "ferry/status.hpp"

namespace ferry {

const char* to_string(StatusKind kind) noexcept {
  switch (kind) {
    case StatusKind::done: return "done";
    case StatusKind::posted: return "posted";
    case StatusKind::retry: return "retry";
    case StatusKind::failed: return "failed";
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
    case OpKind::coll: return "coll";
    case OpKind::atomic: return "atomic";
  }
  return "?";
}

const char* to_string(DataType type) noexcept {
  switch (type) {
    case DataType::i8: return "i8";
    case DataType::u8: return "u8";
    case DataType::i16: return "i16";
    case DataType::u16: return "u16";
    case DataType::i32: return "i32";
    case DataType::u32: return "u32";
    case DataType::i64: return "i64";
    case DataType::u64: return "u64";
    case DataType::f32: return "f32";
    case DataType::f64: return "f64";
  }
  return "?";
}

std::size_t size_of(DataType type) noexcept {
  switch (type) {
    case DataType::i8:
    case DataType::u8: return 1;
    case DataType::i16:
    case DataType::u16: return 2;
    case DataType::i32:
    case DataType::u32:
    case DataType::f32: return 4;
    case DataType::i64:
    case DataType::u64:
    case DataType::f64: return 8;
  }
  return 0;
}

const char* to_string(AtomicOp op) noexcept {
  switch (op) {
    case AtomicOp::fetch_add: return "fetch_add";
    case AtomicOp::add: return "add";
    case AtomicOp::swap: return "swap";
    case AtomicOp::compare_swap: return "compare_swap";
    case AtomicOp::fetch_and: return "fetch_and";
    case AtomicOp::fetch_or: return "fetch_or";
    case AtomicOp::fetch_xor: return "fetch_xor";
  }
  return "?";
}

std::string Completion::error_string() const {
  if (error == 0) return "success";
  if (error == peer_failed_error) return "rank " + std::to_string(rank) + " failed";
  return std::string(std::strerror(-error)) + " (" + std::to_string(error) + ") with rank " + std::to_string(rank);
}

namespace detail {

// What FERRY_COMPLETION=cq (the default) selects: the faster array queue in ferry-bench cq.
// Measured on the 2-core development machine (medians of interleaved runs, 1-8 threads): ring
// was as fast as faa or faster (the two are within noise at 4 and 8 threads) and costs fewer
// instructions per push+pop (callgrind: about 150 vs 210 in the queue itself). FAA's edge over
// CAS ([AMT-LCI] Figure 7) grows with the core count: re-measure on a many-core node and flip
// this to QueueKind::faa if it wins there.
constexpr QueueKind kCqQueueKind = QueueKind::ring;

namespace {

// The lock-free kinds: each algorithm's try_push/try_pop already has QueueImpl's contract.
template <class Queue>
class LockFreeQueue final : public QueueImpl {
 public:
  explicit LockFreeQueue(std::size_t capacity) : queue_(capacity) {}
  bool push(Completion&& c) noexcept override { return queue_.try_push(std::move(c)); }
  std::size_t push_batch(std::span<Completion> cs) noexcept override {
    if constexpr (requires { queue_.try_push_batch(cs.data(), cs.size()); }) {
      return queue_.try_push_batch(cs.data(), cs.size());
    } else {
      return QueueImpl::push_batch(cs);
    }
  }
  bool pop(std::optional<Completion>& c) noexcept override { return queue_.try_pop(c); }
  std::size_t capacity() const noexcept override { return queue_.capacity(); }
  Queue& queue() noexcept { return queue_; }

 private:
  Queue queue_;
};

// The locked baseline: never full (capacity() is only reported, as for the other kinds, rounded
// up to a power of two). push can throw std::bad_alloc inside the deque; signal() is noexcept,
// so that ends the process, as it would for the overflow list.
class LockQueue final : public QueueImpl {
 public:
  explicit LockQueue(std::size_t capacity) {
    while (capacity_ < capacity) capacity_ <<= 1;
  }
  bool push(Completion&& c) noexcept override {
    std::lock_guard<std::mutex> guard(mutex_);
    queue_.push_back(std::move(c));
    return true;
  }
  bool pop(std::optional<Completion>& c) noexcept override {
    std::lock_guard<std::mutex> guard(mutex_);
    if (queue_.empty()) return false;
    c.emplace(std::move(queue_.front()));
    queue_.pop_front();
    return true;
  }
  std::size_t capacity() const noexcept override { return capacity_; }

 private:
  std::size_t capacity_ = 2;
  std::mutex mutex_;
  std::deque<Completion> queue_;
};

}  // namespace

std::unique_ptr<QueueImpl> make_queue(QueueKind kind, std::size_t capacity) {
  switch (kind) {
    case QueueKind::ring: return std::make_unique<LockFreeQueue<MpmcRing<Completion>>>(capacity);
    case QueueKind::faa: return std::make_unique<LockFreeQueue<FaaRing<Completion>>>(capacity);
    case QueueKind::ms: return std::make_unique<LockFreeQueue<MsQueue<Completion>>>(capacity);
    case QueueKind::lock: return std::make_unique<LockQueue>(capacity);
    case QueueKind::default_kind: break;
  }
  return nullptr;
}

const char* queue_kind_name(QueueKind kind) noexcept {
  switch (kind) {
    case QueueKind::ring: return "ring";
    case QueueKind::faa: return "faa";
    case QueueKind::ms: return "ms";
    case QueueKind::lock: return "lock";
    case QueueKind::default_kind: return "default";
  }
  return "?";
}

// cq (and sync, the ferry parcelport's mechanism) map to kCqQueueKind (above). Resolved like
// FERRY_CQ_CAPACITY, at every queue creation, so a test or benchmark can change it between queues.
QueueKind default_queue_kind() {
  RuntimeSettings s;
  runtime_option_table().resolve_one("completion", s);
  switch (s.completion) {
    case CompletionMechanism::cq_ms: return QueueKind::ms;
    case CompletionMechanism::cq_lock: return QueueKind::lock;
    case CompletionMechanism::cq:
    case CompletionMechanism::sync: break;
  }
  return kCqQueueKind;
}

}  // namespace detail

const char* to_string(QueueKind kind) noexcept { return detail::queue_kind_name(kind); }

QueueKind default_queue_kind() { return detail::default_queue_kind(); }

CompletionQueue::CompletionQueue(CompletionQueueOptions options) {
  std::size_t cap = options.capacity;
  if (cap == 0) {
    RuntimeSettings s;
    runtime_option_table().resolve_one("cq_capacity", s);
    cap = s.cq_capacity;
  }
  if (cap > (std::size_t{1} << 28)) {
    throw Error("CompletionQueueOptions::capacity=" + std::to_string(cap) + " is out of range: at most 268435456");
  }
  const QueueKind kind = options.kind == QueueKind::default_kind ? detail::default_queue_kind() : options.kind;
  impl_ = detail::make_queue(kind, std::min(cap, kHotEntries));
  if (impl_ && cap > kHotEntries) cold_ = detail::make_queue(kind, cap);
  if (impl_ && kind == QueueKind::ring) {
    hot_ring_ = &static_cast<detail::LockFreeQueue<detail::MpmcRing<Completion>>&>(*impl_).queue();
  }
  if (!impl_) throw Error("CompletionQueueOptions::kind=" + std::to_string(static_cast<int>(options.kind)) + " is unknown");
}

CompletionQueue::~CompletionQueue() = default;

void CompletionQueue::signal(Completion&& completion) noexcept {
  // Order: pop() drains the hot queue, then the cold one, then the overflow list, so once an
  // entry has gone to a later tier everything after it must go there too until that tier is
  // empty; otherwise a later entry that found room earlier would overtake it.
  //  - The producer's loads of overflow_size_ and cold_count_ are relaxed: a producer ordered
  //    after the spill (the same thread, or one that took the progress lock after it) sees
  //    the count; producers that race with each other have no order to keep.
  //  - cold_count_ is raised before the push into the cold queue and lowered only after a pop
  //    from it, so it is never below the number of entries there: a thread that pushed into
  //    the cold queue sees a count above zero until that entry is popped, and so sends its
  //    next entries there too.
  //  - Raising either count is a release, for pop(): a consumer that sees the count also sees
  //    every hot (and, for the overflow, cold) entry signalled before it.
  if (overflow_size_.load(std::memory_order_relaxed) == 0) {
    if (cold_count_.load(std::memory_order_relaxed) == 0 &&
        (hot_ring_ != nullptr ? hot_ring_->try_push(std::move(completion)) : impl_->push(std::move(completion)))) {
      return;
    }
    if (cold_ != nullptr) {
      cold_count_.fetch_add(1, std::memory_order_release);  // after the hot entries: see pop()
      if (cold_->push(std::move(completion))) return;
      cold_count_.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  spill(&completion, 1);
}

void CompletionQueue::signal_batch(Completion* completions, std::size_t count) noexcept {
  // As signal() on each: a run the hot queue takes whole costs one claim of its ring.
  std::size_t k = 0;
  if (overflow_size_.load(std::memory_order_relaxed) == 0 && cold_count_.load(std::memory_order_relaxed) == 0) {
    k = hot_ring_ != nullptr ? hot_ring_->try_push_batch(completions, count)
                             : impl_->push_batch(std::span<Completion>(completions, count));
  }
  for (; k < count; ++k) signal(std::move(completions[k]));
}

// Full (the consumer has fallen the whole capacity behind, or a preempted consumer still holds
// the cell a push needs), or spilled entries wait. signal() runs inside progress and must
// neither drop the entry nor wait (the consumer may be this very thread), so the entry goes to
// an unbounded overflow list. This slow path allocates and locks.
void CompletionQueue::spill(Completion* completions, std::size_t count) noexcept {
  std::lock_guard<std::mutex> guard(overflow_mutex_);
  for (std::size_t i = 0; i < count; ++i) overflow_.push_back(std::move(completions[i]));
  overflow_size_.store(overflow_.size(), std::memory_order_release);  // after the earlier tiers' entries: see pop()
}

std::optional<Completion> CompletionQueue::pop() noexcept {
  // The result is built in place from the cell (one move), and nothing is constructed when the
  // queue is empty: a default-constructed std::optional<Completion> that escapes into a call is
  // zeroed whole by GCC's libstdc++ (104 bytes, a `rep stos`), which cost more than the rest of
  // the pop. The Taken's destructor frees the cell after the return value is built.
  if (hot_ring_ != nullptr) {
    if (auto taken = hot_ring_->try_take()) return std::optional<Completion>(std::in_place, std::move(*taken));
    if (cold_count_.load(std::memory_order_relaxed) == 0 && overflow_size_.load(std::memory_order_relaxed) == 0) {
      return std::nullopt;
    }
  }
  return pop_later();
}

std::optional<Completion> CompletionQueue::pop_later() noexcept {
  std::optional<Completion> c;  // one object all the way: the queue constructs into it (NRVO)
  if (impl_->pop(c)) return c;
  // The hot queue looked empty. Whatever waits in a later tier was signalled after everything
  // the hot queue holds, and while a later tier holds entries nothing new enters an earlier
  // one (see signal()); until a consumer takes such an entry, its count stays above zero
  // (consumers that race with each other have no order between them). So: read the counts,
  // then look at the hot queue again, then at the tiers the counts name. Without the second
  // look, a consumer preempted between its first look and the counts would find the cold (or
  // spilled) entry of a burst that filled the hot queue meanwhile, and return it ahead of the
  // whole hot queue. Acquire pairs with the release raise in signal() and spill(): the
  // entries signalled before the raise are visible here. The fast path above is unchanged.
  const std::size_t cold = cold_count_.load(std::memory_order_acquire);
  const std::size_t spilled = overflow_size_.load(std::memory_order_acquire);
  if (cold == 0 && spilled == 0) return c;
  if (impl_->pop(c)) return c;
  // A cold entry whose push is still under way (counted, not yet published) is older than
  // any spilled entry: a spill comes after that push in signal order, so when both counts
  // were seen, a cold queue that still looks empty holds nothing older than the overflow.
  if (cold != 0 && cold_->pop(c)) {
    cold_count_.fetch_sub(1, std::memory_order_relaxed);  // only lowers: see signal()
    return c;
  }
  if (spilled != 0) {
    std::lock_guard<std::mutex> guard(overflow_mutex_);
    if (!overflow_.empty()) {
      c.emplace(std::move(overflow_.front()));
      overflow_.pop_front();
      overflow_size_.store(overflow_.size(), std::memory_order_relaxed);
    }
  }
  return c;
}

std::size_t CompletionQueue::capacity() const noexcept { return cold_ != nullptr ? cold_->capacity() : impl_->capacity(); }

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
