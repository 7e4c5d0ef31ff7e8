// ferry/completion.hpp — how ferry tells the caller an operation finished.
//
// A completion object is anything derived from CompletionObject. ferry calls signal() exactly
// once per `posted` operation that names it as the local completion, and once per incoming
// active message or notifying put that names it as the remote target (see Runtime::expose).
// signal() is called from inside progress(), on whatever thread runs progress. Several
// completions for one object that a progress call finds together may come through one call of
// signal_batch() instead, in order; its default signals each in turn.
//
// Kinds:
//  - CompletionQueue: a lock-free multi-producer multi-consumer queue of Completion records.
//    Past 1024 entries it is two queues, a small hot one in front of one of the full
//    capacity; when both are full it spills into an overflow list rather than drop or wait.
//    The entries one producer signals are popped in that order (spilled ones included).
//  - Synchronizer: counts to n (like an MPI request when n == 1); test() / wait().
//  - Handler: runs a callback inside progress (keep it short, it must not block; it may
//    post, but a barrier from there is an error: see Runtime::barrier).
#pragma once

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ferry {

using Tag = std::uint32_t;
inline constexpr Tag any_tag = 0xFFFFFFFFu;   // post_recv only
inline constexpr Tag max_tag = 0x7FFFFFFFu;   // largest tag a send may use
inline constexpr int any_source = -1;         // post_recv only

// coll: a collective of a Team (ferry/coll.hpp) finished; atomic: a remote atomic
// (Device::post_atomic).
enum class OpKind : std::uint8_t { am, send, recv, put, get, remote_put, remote_am, coll, atomic };

const char* to_string(OpKind kind) noexcept;

// A buffer ferry hands to the caller, who then owns it (the payload of an active message).
// Move-only; returns its memory to ferry (or frees it) when destroyed. An eager payload
// normally stays in the device's receive packet until then (no copy); while the application
// holds so many that the device could not keep its receives posted, ferry delivers further
// payloads in heap memory instead, so a slow consumer never stalls its senders.
class Buffer {
 public:
  using Release = void (*)(void* owner, void* data) noexcept;
  Buffer() noexcept = default;
  Buffer(void* data, std::size_t size, Release release, void* owner) noexcept
      : data_(data), size_(size), release_(release), owner_(owner) {}
  // A completion moves through a few hands on its way to the application: a move is four
  // loads and three stores, with no release to check.
  Buffer(Buffer&& other) noexcept
      : data_(other.data_), size_(other.size_), release_(other.release_), owner_(other.owner_) {
    other.data_ = nullptr;
    other.size_ = 0;
    other.release_ = nullptr;
  }
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = other.data_;
      size_ = other.size_;
      release_ = other.release_;
      owner_ = other.owner_;
      other.data_ = nullptr;
      other.size_ = 0;
      other.release_ = nullptr;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  explicit operator bool() const noexcept { return release_ != nullptr; }
  void reset() noexcept {
    if (release_ != nullptr) release_(owner_, data_);
    data_ = nullptr;
    size_ = 0;
    release_ = nullptr;
  }

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
  Release release_ = nullptr;
  void* owner_ = nullptr;
};

// Completion::error of an operation that could not finish because its peer (Completion::rank)
// failed: a pending send, receive, rendezvous, put or get to or from that rank. Such a
// remote_am carries no payload or parts. The buffer of a receive or get that ends this way
// stays allocated until finalize() returns: a transfer the transport gave up on may still
// land in it (README, "Peer failure").
inline constexpr int peer_failed_error = -EHOSTDOWN;

// One finished operation.
struct Completion {
  OpKind op = OpKind::am;
  int rank = -1;              // the peer
  Tag tag = 0;
  std::size_t size = 0;       // bytes moved (a receive: bytes delivered)
  void* context = nullptr;    // the caller's context pointer from the post
  int error = 0;              // 0, or a negative errno value (-EMSGSIZE: truncated, peer_failed_error, -EIO, ...)
  Buffer buffer;              // remote_am: the eager payload, now owned by the caller
  std::vector<Buffer> parts;  // remote_am from post_am_iovec: the zero-copy parts

  bool ok() const noexcept { return error == 0; }
  std::string error_string() const;
};

class CompletionObject {
 public:
  virtual ~CompletionObject() = default;
  // Called exactly once per completed operation; never blocks.
  virtual void signal(Completion&& completion) noexcept = 0;
  // The completions in order, as if signal() were called on each; they are left moved-from.
  // ferry calls it with the active messages for this object that one progress call received
  // together; a CompletionQueue takes the whole run with a single claim on its ring.
  virtual void signal_batch(Completion* completions, std::size_t count) noexcept {
    for (std::size_t i = 0; i < count; ++i) signal(std::move(completions[i]));
  }
  // Whether this object gains from taking active messages in runs (signal_batch) rather than
  // each as soon as it is in. A transport that delivers inside its own receive callback (UCX)
  // then hands ferry one message at a time: an object that says false (the default, and a
  // Handler) is signalled at once, so a handler's reply leaves before the transport's poll
  // goes on; one that says true (a CompletionQueue) gets the poll's messages as one run.
  // Asked once, when the object is exposed (Runtime::expose): the answer must not change.
  virtual bool batches() const noexcept { return false; }
};

namespace detail {
class QueueImpl;
template <class T>
class MpmcRing;
}

// Which queue algorithm backs a CompletionQueue ([AMT-LCI] §5.2, Figure 7).
//  - ring: bounded array queue, CAS on head/tail tickets with per-cell sequence numbers.
//  - faa: bounded array queue in the LCRQ class: fetch-and-add tickets, no CAS loop on the
//    counters (one CRQ of LCRQ on 64-bit atomics).
//  - ms: Michael-Scott linked queue (CAS on head/tail) over a fixed per-queue node pool.
//  - lock: a std::deque under a mutex (the locked baseline; never full).
//  - default_kind: whatever FERRY_COMPLETION selects (cq: the faster array queue as measured,
//    currently ring; cq_ms: ms; cq_lock: lock; sync: as cq), read when the queue is made.
// The bounded kinds hold `capacity` entries; past that, and when a push is refused for another
// reason their contract allows, entries spill into the CompletionQueue's overflow list.
enum class QueueKind : std::uint8_t { ring, faa, ms, lock, default_kind };

// "ring", "faa", "ms", "lock", "default".
const char* to_string(QueueKind kind) noexcept;

// The kind QueueKind::default_kind stands for now (from FERRY_COMPLETION; throws ferry::Error
// on an invalid value).
QueueKind default_queue_kind();

struct CompletionQueueOptions {
  std::size_t capacity = 0;        // 0: FERRY_CQ_CAPACITY
  QueueKind kind = QueueKind::default_kind;
};

class CompletionQueue final : public CompletionObject {
 public:
  explicit CompletionQueue(CompletionQueueOptions options = {});
  ~CompletionQueue() override;
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  void signal(Completion&& completion) noexcept override;
  void signal_batch(Completion* completions, std::size_t count) noexcept override;
  bool batches() const noexcept override { return true; }
  // Any thread. Empty optional when nothing is ready.
  std::optional<Completion> pop() noexcept;
  std::size_t capacity() const noexcept;

 private:
  void spill(Completion* completions, std::size_t count) noexcept;
  std::optional<Completion> pop_later() noexcept;
  // Two tiers of the same algorithm: a hot queue of at most kHotEntries, then (for larger
  // capacities) a cold one of `capacity` entries that takes what the hot one refuses. A ring
  // cycles through all its cells whatever its depth, so one ring of 65536 ~100-byte cells
  // would stream 6 MiB through the cache and miss on every push; the hot tier stays in L2,
  // and the cold one is touched only while the consumer lags by more than kHotEntries.
  static constexpr std::size_t kHotEntries = 1024;
  std::unique_ptr<detail::QueueImpl> impl_;
  std::unique_ptr<detail::QueueImpl> cold_;  // null when capacity <= kHotEntries
  // impl_'s ring when the kind is ring (the default), else null: signal and pop reach it with
  // direct calls, and pop builds its result straight from the cell.
  detail::MpmcRing<Completion>* hot_ring_ = nullptr;
  // Entries in cold_, counted before each push and uncounted after each pop, so it is never
  // below the true number (see signal()).
  std::atomic<std::size_t> cold_count_{0};
  // Entries that found the queue full (see signal()); never dropped.
  std::atomic<std::size_t> overflow_size_{0};
  std::mutex overflow_mutex_;
  std::deque<Completion> overflow_;
};

// Counts signals up to n. Any thread may signal; one thread at a time should test/wait/reset.
class Synchronizer final : public CompletionObject {
 public:
  explicit Synchronizer(std::size_t n = 1);
  void signal(Completion&& completion) noexcept override;
  bool test() const noexcept { return arrived_.load(std::memory_order_acquire) >= n_; }
  std::size_t count() const noexcept { return arrived_.load(std::memory_order_acquire); }
  // The completions, in arrival order; valid after test() returned true.
  std::vector<Completion>& results() noexcept { return slots_; }
  void reset() noexcept;

 private:
  std::size_t n_;
  std::atomic<std::size_t> claimed_{0};
  std::atomic<std::size_t> arrived_{0};
  std::vector<Completion> slots_;
};

class Handler final : public CompletionObject {
 public:
  explicit Handler(std::function<void(Completion&&)> fn) : fn_(std::move(fn)) {}
  void signal(Completion&& completion) noexcept override;

 private:
  std::function<void(Completion&&)> fn_;
};

}  // namespace ferry
