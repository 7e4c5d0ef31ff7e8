// lock_model.hpp — how threads share one device (FERRY_LOCK_MODEL; [Combining], [AMT-LCI] §5.3).
//
//   lockless  the device's own synchronisation only (the default): no LockModelImpl
//             exists, the public Device handle calls the device directly (ferry's devices
//             synchronise finely; over UCX one biased lock guards the worker)
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
//   serialized no lock at all: the application promises that one thread at a time calls into a
//             device (a single-threaded program, or a device per thread); barrier() and
//             finalize() call into every device, so no other thread may be in one then. As
//             with lockless no LockModelImpl exists; unlike lockless the transports are told
//             so (UCX is the one that uses it: under lockless ferry guards its worker with a
//             biased lock, common/biased_lock.hpp; under serialized nothing does).
//             Progress threads are refused with it.
//
// A call made from inside the device by the thread that holds it (a Handler, run by progress,
// posting its reply) goes straight to the device under trylock, block and csync, whose lock
// that thread already holds; under lockq and offload it is queued as from any thread.
//
// Semantics of a deferred post (lockq on contention, offload always) are those of the direct
// call: an eager send (post_am / post_send up to the eager limit, a put up to the inject size)
// copies its payload into the descriptor and returns `done`, so the caller may reuse its
// buffer at once; everything else returns `posted` and signals its local completion object
// when performed (a receive or rendezvous keeps using the caller's buffer until then).
// Arguments are validated before a post is deferred, so bad input still throws ferry::Error
// in the caller.
//
// Ownership: the runtime owns each device's DeviceImpl and, for every model but lockless and
// serialized, a LockModelImpl next to it, destroyed first (an offload thread stops before the
// endpoint closes). The public Device handle holds both pointers and sends each call through
// the lock model when there is one, so the direct path pays one predictable branch. The lock model
// knows the device (lock_model.cpp includes device.hpp); the device never sees its lock model.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
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

// One deferred post, as data (lockq on contention, offload always).
struct OpDesc {
  using Args = std::variant<AmArgs, AmIovecArgs, SendArgs, RecvArgs, PutArgs, GetArgs, AtomicArgs>;
  Args args;
  std::vector<unsigned char> copy;  // an eager payload (and an iovec's eager part), owned
  bool returned_done = false;       // the caller was told `done`: signal nothing later
  std::atomic<OpDesc*> next{nullptr};
};

// One announced call of csync (lock_model.cpp).
struct CsyncNode;

class LockModelImpl {
 public:
  static constexpr int kMaxCombine = 64;

  // `model` is any but lockless. The device must outlive this object.
  LockModelImpl(DeviceImpl& device, LockModel model);
  ~LockModelImpl();
  LockModelImpl(const LockModelImpl&) = delete;
  LockModelImpl& operator=(const LockModelImpl&) = delete;

  LockModel model() const noexcept { return model_; }
  // A post of one of the seven argument types of OpDesc::Args (instantiated in lock_model.cpp).
  template <class A>
  Status post(const A& args);
  bool progress();
  // Runs `fn(device, ctx)` with the device held as this model holds it for a post: under the
  // coarse lock (trylock, lockq, block), as an announced call
  // (csync), or on the communication thread (offload), so a runtime-internal operation (the
  // barrier's steps) never enters a transport alongside the thread that owns it. Blocks until
  // done; returns what fn returned. Slow path only: it may spin, yield and take a mutex.
  bool exclusive(bool (*fn)(DeviceImpl&, void*), void* ctx);
  // Teardown: stops the offload thread after it drained what was queued.
  void stop();
  // Posts deferred and combined, and the largest batch (lockq, csync, offload).
  DeviceStats stats() const noexcept {
    return {deferred_.load(std::memory_order_relaxed), combined_.load(std::memory_order_relaxed),
            max_batch_.load(std::memory_order_relaxed)};
  }
  // Descriptors waiting (lockq, offload); exact when quiescent. A stuck descriptor is still counted in queued_ (it is decremented only once a descriptor
  // ran), so any thread may read this without touching stuck_, which the lock holder owns.
  std::size_t queued() const noexcept { return queued_.load(std::memory_order_relaxed); }
  // Descriptors deferred so far and run so far (lockq, offload). The queue runs in order, so
  // once performed() reaches a value deferred() had, every descriptor deferred before that
  // read has run; unlike waiting for queued() == 0, this ends while other threads keep posting.
  std::uint64_t deferred() const noexcept { return deferred_.load(std::memory_order_relaxed); }
  std::uint64_t performed() const noexcept { return performed_.load(std::memory_order_relaxed); }

 private:
  // What a csync node's call did.
  struct Outcome {
    Status status;
    bool progressed;
  };
  Status execute_deferred(OpDesc* d);  // lock held: runs a descriptor, signals it if it finished at once
  bool combine();                      // lock held: run queued descriptors, in order
  template <class A>
  Status defer(const A& args);
  Outcome csync(void (*call)(DeviceImpl&, CsyncNode&), const void* args);
  void offload_loop();
  // Whether the calling thread is inside this device (trylock, block, csync): see inside_.
  bool inside() const noexcept { return inside_.load(std::memory_order_relaxed) == std::this_thread::get_id(); }
  class Inside;  // marks inside_ for a scope (lock_model.cpp)

  DeviceImpl& dev_;
  const LockModel model_;
  SpinLock try_lock_;   // trylock, lockq
  std::mutex block_;    // block
  MpscQueue<OpDesc> queue_;     // lockq, offload
  OpDesc* stuck_ = nullptr;  // a dequeued descriptor that returned retry: first in line next time
  std::atomic<std::size_t> queued_{0};
  // Statistics: relaxed, they order nothing.
  std::atomic<std::uint64_t> deferred_{0}, combined_{0}, max_batch_{0};
  std::atomic<std::uint64_t> performed_{0};
  void note_batch(std::uint64_t n) noexcept;

  // The thread that holds the trylock or block lock, or combines for csync, while it does (else
  // no thread's id). A call of that thread into this device (a Handler, run by its progress,
  // posting an answer; also when handlers of several devices call into each other) goes
  // straight to the device instead of waiting for the lock it holds. Relaxed: only a thread
  // itself stores its own id here, so it reads its id back only after it stored it (program
  // order), and never reads another thread's store as its own id. Each holder clears it before
  // it lets the next one in (the unlock, csync's hand-off: release, and the next holder's
  // acquire), so a clear never lands after the next holder's mark.
  std::atomic<std::thread::id> inside_{};

  // csync: the announce list.
  std::atomic<CsyncNode*> tail_{nullptr};
  std::uint64_t generation_;

  std::thread offload_;
  std::atomic<bool> stop_{false};
  // offload: one exclusive() call handed to the communication thread at a time (requests_
  // serialises the callers). The caller publishes the request (release) and waits for `done`
  // (acquire); the thread reads the slot once per loop (acquire) and clears it after.
  struct Request {
    bool (*fn)(DeviceImpl&, void*);
    void* ctx;
    bool result = false;
    std::exception_ptr error;
    std::atomic<bool> done{false};
  };
  std::mutex requests_;
  std::atomic<Request*> request_{nullptr};
};

}  // namespace ferry::detail
