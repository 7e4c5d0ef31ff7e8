// lock_model.hpp — how threads share one device (FERRY_LOCK_MODEL; [Combining], [AMT-LCI] §5.3).
//
//   lockless  the device's own fine-grained synchronisation only (the default; no wrapper)
//   trylock   one coarse try-lock around every call; a post that finds it taken returns
//             retry(lock), a progress that finds it taken returns false
//   block     one coarse blocking lock around every call (the MPI-like baseline)
//   lockq     LockQ: try the lock; on failure post an operation descriptor to a wait-free
//             multi-producer single-consumer queue and return `posted`; whoever holds the
//             lock first executes up to kMaxCombine queued descriptors (in order), then its
//             own call. progress() tries the lock with exponential back-off.
//   csync     combining in the style of CC-Synch/DSM-Synch: every call is announced in a node
//             of a shared list; the thread at the head executes the announced calls (up to
//             kMaxCombine) for everyone, the others wait until theirs is done.
//   offload   a dedicated communication thread performs every network operation and all
//             progress; callers enqueue descriptors (as lockq does) and return `posted`.
//
// Semantics of a deferred post (lockq on contention, offload always) are those of the direct
// call: an eager send (post_am / post_send up to the eager limit, a put up to the inject size)
// copies its payload into the descriptor and returns `done`, so the caller may reuse its
// buffer at once; everything else returns `posted` and signals its local completion object
// when performed (a receive or rendezvous keeps using the caller's buffer until then).
// Arguments are validated before a post is deferred, so bad input still throws ferry::Error
// in the caller.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "common/mpsc_queue.hpp"
#include "common/spinlock.hpp"
#include "ferry/runtime.hpp"

namespace ferry::detail {

class DeviceImpl;

using ferry::LockModel;  // public (options.hpp): RuntimeSettings holds it, resolved from FERRY_LOCK_MODEL

// One post or a progress call, as data.
struct OpDesc {
  using Args = std::variant<std::monostate, AmArgs, AmIovecArgs, SendArgs, RecvArgs, PutArgs, GetArgs>;
  Args args;  // monostate: a progress call
  std::vector<unsigned char> copy;  // an eager payload (and an iovec's eager part), owned
  bool returned_done = false;       // the caller was told `done`: signal nothing later
  std::atomic<OpDesc*> next{nullptr};
};

class ThreadSafety {
 public:
  static constexpr int kMaxCombine = 64;

  ThreadSafety(DeviceImpl& device, LockModel model);
  ~ThreadSafety();
  ThreadSafety(const ThreadSafety&) = delete;
  ThreadSafety& operator=(const ThreadSafety&) = delete;

  LockModel model() const noexcept { return model_; }
  // For every model but lockless (the device calls itself directly then).
  Status post(OpDesc::Args&& args);
  bool progress();
  // Teardown: stops the offload thread after it drained what was queued.
  void stop();
  // Descriptors waiting (lockq, offload); exact when quiescent.
  DeviceStats stats() const noexcept {
    return {deferred_.load(std::memory_order_relaxed), combined_.load(std::memory_order_relaxed),
            max_batch_.load(std::memory_order_relaxed)};
  }
  // A stuck descriptor is still counted in queued_ (it is decremented only once a descriptor
  // ran), so any thread may read this without touching stuck_, which the lock holder owns.
  std::size_t queued() const noexcept { return queued_.load(std::memory_order_relaxed); }

 private:
  Status execute(const OpDesc::Args& args);     // runs one call on the device (lock held)
  Status execute_deferred(OpDesc* d);           // ... and signals its completion if it finished at once
  bool combine();                               // lock held: run queued descriptors, in order
  Status defer(OpDesc::Args&& args);
  Status csync(const OpDesc::Args& args, bool* progressed);
  void offload_loop();

  DeviceImpl& dev_;
  const LockModel model_;
  SpinLock try_lock_;   // trylock, lockq
  std::mutex block_;    // block
  MpscQueue<OpDesc> queue_;     // lockq, offload
  OpDesc* stuck_ = nullptr;  // a dequeued descriptor that returned retry: first in line next time
  std::atomic<std::size_t> queued_{0};
  // Statistics: relaxed, they order nothing.
  std::atomic<std::uint64_t> deferred_{0}, combined_{0}, max_batch_{0};
  void note_batch(std::uint64_t n) noexcept;

  // csync: the announce list.
  struct Node;
  std::atomic<Node*> tail_{nullptr};
  std::uint64_t generation_;

  std::thread offload_;
  std::atomic<bool> stop_{false};
};

}  // namespace ferry::detail
