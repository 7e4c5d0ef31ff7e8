// biased_lock.hpp — a lock that the first thread to use it takes without an atomic
// read-modify-write or a memory fence, until another thread needs it.
//
// Why: a single-threaded program (or a device one thread drives) still pays a lock per call
// under a lock model that lets any thread in. On x86 the lock's atomic exchange drains the
// store buffer first, and right after a send's store into a peer's queue (a line the peer's
// core holds) that means waiting for the line: ferry over UCX lost a quarter of its 8 B rate
// to UCX's own per-call lock that way. The bias moves that cost to the rare thread that
// arrives second, once.
//
// Contract.
//  - lock() and unlock() give mutual exclusion among all threads of the process; not
//    recursive (a debug build asserts that the owner's fast path is not re-entered). lock()
//    waits by spinning, then yielding: critical sections are calls into a library that do not
//    block, but some take long (a progress call that runs completions, a close that flushes).
//    lock() returns a token that the matching unlock() takes back.
//  - The lock is biased to one thread at a time, its owner: the first thread to lock. The
//    owner's lock() is a relaxed load, an acquire load and a store of its tenure's `inside_` flag around a
//    compiler fence, its unlock() a release store. Another thread that locks takes the bias
//    over (a tenure: it revokes the owner's, with one membarrier(2) system call, and becomes
//    the owner), so a program whose device one thread drives after another set it up gets
//    the bias too. After kTenures tenures the lock is revoked for good (threads that take
//    turns would pay a system call per turn): every thread then takes the spin lock.
//  - Without expedited membarrier (an older kernel, a sandbox) and under TSan, which models
//    neither membarrier nor compiler fences, the lock starts revoked: a plain spin lock.
//
// Memory orders. The owner stores its tenure's inside_ flag then reloads bias_; a revoker
// (holding spin_, so one at a time) stores bias_ then, after membarrier, loads the flag. One
// of the two must see the other's store (store buffering), which needs a full barrier on
// both sides; the revoker's membarrier makes every running thread of the process execute one
// (a descheduled thread's context switch is one). So either the owner's flag store is visible
// to the revoker, which then waits for the owner's release store at unlock (acquire: the
// owner's critical section happens before the revoker's), or the owner's reload comes after
// the barrier, sees bias_ changed, and the owner backs out before touching anything. The
// acquire on the reload keeps the critical section after it (a compiler fence alone would
// not stop a load from being hoisted above a relaxed load). Each tenure has its own flag: a
// thread that read a stale bias_ naming it sets and clears only its old tenure's flag, never
// the current owner's. A new owner's first fast entry is ordered after its revocation by
// program order and spin_ (it sets bias_ while holding spin_). Owner identity is a per-thread
// number that is never reused (a reused thread-local address would let a new thread
// inherit a dead owner's bias).
#pragma once

#include <atomic>
#include <cassert>
#include <cstdint>

#include "common/cache_line.hpp"
#include "common/spinlock.hpp"

namespace ferry::detail {

namespace biased_detail {
// This thread's number, 0 until biased_detail::self() assigns one. constinit and initial-exec:
// the owner's check is one %fs-relative load.
extern constinit thread_local std::uint64_t tls_id __attribute__((tls_model("initial-exec")));
std::uint64_t assign_id() noexcept;  // biased_lock.cpp
inline std::uint64_t self() noexcept {
  const std::uint64_t id = tls_id;
  return __builtin_expect(id != 0, 1) ? id : assign_id();
}
}  // namespace biased_detail

class alignas(detail::cache_line) BiasedLock {
 public:
  static constexpr unsigned kTenures = 8;

  // How lock() got the lock (the spin lock, or the fast path of tenure t); unlock() needs it.
  struct Held {
    bool fast = false;
    unsigned tenure = 0;
  };

  BiasedLock() noexcept;
  BiasedLock(const BiasedLock&) = delete;
  BiasedLock& operator=(const BiasedLock&) = delete;

  // Inlined: a call costs as much as the fast path itself (callgrind).
  [[gnu::always_inline]] Held lock() noexcept {
    // Relaxed: a stale value naming this thread is caught by the reload below; one naming
    // another thread sends this one to the slow path, which reads it again under spin_.
    const std::uint64_t b = bias_.load(std::memory_order_relaxed);
    if (__builtin_expect((b >> 8) == biased_detail::self(), 1)) {
      const unsigned t = static_cast<unsigned>(b & 0xff);
      assert(!inside_[t].load(std::memory_order_relaxed) && "BiasedLock is not recursive");
      inside_[t].store(true, std::memory_order_relaxed);  // made visible by a revoker's membarrier
      std::atomic_signal_fence(std::memory_order_seq_cst);
      if (__builtin_expect(bias_.load(std::memory_order_acquire) == b, 1)) return Held{true, t};
      inside_[t].store(false, std::memory_order_release);
    }
    return lock_slow();
  }
  void unlock(Held how) noexcept {
    if (how.fast) inside_[how.tenure].store(false, std::memory_order_release); else spin_.unlock();
  }

  // Whether the bias still stands (for tests and logs).
  bool biased() const noexcept { return bias_.load(std::memory_order_relaxed) != kRevoked; }

 private:
  // bias_: owner's thread number << 8 | tenure; 0 before the first lock; kRevoked for good
  // (or while a revoker holds spin_).
  static constexpr std::uint64_t kRevoked = 0xff;
  Held lock_slow() noexcept;

  std::atomic<std::uint64_t> bias_;
  std::atomic<bool> inside_[kTenures] = {};  // by tenure: its owner is inside by the fast path
  detail::SpinLock spin_;
};

// RAII: holds a BiasedLock for a scope, or nothing when given null (a lock model that lets
// one thread at a time in needs none).
class BiasedGuard {
 public:
  explicit BiasedGuard(BiasedLock* lock) noexcept : lock_(lock) {
    if (lock_ != nullptr) how_ = lock_->lock();
  }
  ~BiasedGuard() {
    if (lock_ != nullptr) lock_->unlock(how_);
  }
  BiasedGuard(const BiasedGuard&) = delete;
  BiasedGuard& operator=(const BiasedGuard&) = delete;

 private:
  BiasedLock* lock_;
  BiasedLock::Held how_;
};

}  // namespace ferry::detail
