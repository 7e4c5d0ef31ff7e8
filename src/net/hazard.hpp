// hazard.hpp — hazard slots: many threads say cheaply "I am using this handle", and a rare
// retiring thread waits until none says so before it destroys the handle.
//
// Contract.
//  - HazardHold(src) (any thread) loads src and keeps the value it returns (get()) from being
//    retired while the hold lives. get() is null when src is null. HazardHold(src, false) is a
//    plain load, for a caller that knows no retire overlaps it. One hold per thread at a
//    time (one slot per thread): a hold taken inside another is a programming error.
//  - retire_wait(p) (any thread, rare) is called after p was replaced (by null, say) in every
//    atomic it can be loaded from, each by a seq_cst store or read-modify-write; it returns
//    once no hold that got p is still alive, so p can then be destroyed. A hold taken after
//    the replacement never gets p.
//  - Slots belong to threads: a thread's first hold takes one (reusing one a finished thread
//    gave back, else allocating one that lives to the end of the process) and its exit gives
//    it back. Only that first hold allocates (and, out of memory, gets nothing: starved());
//    later holds touch no shared line but their own.
//
// Memory orders. A hold stores p into its thread's slot, then reloads src; the retiring
// thread replaced p first, then reads every slot. Of those two store-then-load sequences one
// must see the other's store (store buffering), which needs a full barrier on both sides.
// Where the kernel offers expedited membarrier(2) the hold's barrier is a compiler fence and
// retire_wait's membarrier call makes every running thread of the process execute a full
// barrier (an asymmetric fence: the cost moves to the rare side). Otherwise the hold's store
// and reload are seq_cst, as are the replacement and retire_wait's reads of the slots, so
// all four sit in one total order and the argument holds. The slot's release store at the
// end of a hold, read by retire_wait (seq_cst, so acquire), makes what the holder did with p
// happen before what follows retire_wait (the destruction). Under TSan, which models neither
// membarrier nor fences, the seq_cst path is used.
#pragma once

#include <atomic>
#include <cstddef>

#include "common/cache_line.hpp"

namespace ferry::net {

struct alignas(detail::cache_line) HazardSlot {
  std::atomic<const void*> held{nullptr};
  std::atomic<bool> owned{false};  // a thread has this slot
  bool light = false;              // expedited() as computed once: the holder's fence is a compiler fence
  HazardSlot* next = nullptr;      // the process's list of slots, written before publication
};
static_assert(sizeof(HazardSlot) == detail::cache_line, "one slot per cache line");

namespace hazard_detail {
HazardSlot* take_slot() noexcept;  // this thread's slot, taken on first use (hazard.cpp)
bool expedited() noexcept;         // expedited membarrier registered for this process
// A full barrier in every running thread of the process (expedited membarrier; call only
// when expedited()). Registered, the call cannot fail; if the kernel says otherwise the
// asymmetric fences' argument is void, and the process stops with a message (hazard.cpp).
void barrier_all() noexcept;
std::size_t slot_count() noexcept; // slots made so far (the tests check that exits give them back)
// This thread's slot, or null before its first hold. constinit (no TLS wrapper call) and
// initial-exec: one %fs-relative load.
extern constinit thread_local HazardSlot* tls_slot __attribute__((tls_model("initial-exec")));
}  // namespace hazard_detail

void retire_wait(const void* p) noexcept;

template <class T>
class HazardHold {
 public:
  // protect false: a plain relaxed load, for callers that know no retire can overlap.
  explicit HazardHold(const std::atomic<T*>& src, bool protect = true) noexcept {
    T* p = src.load(std::memory_order_relaxed);
    if (!protect || p == nullptr) {
      value_ = p;
      return;
    }
    slot_ = hazard_detail::tls_slot;
    if (__builtin_expect(slot_ == nullptr, 0)) {
      slot_ = hazard_detail::take_slot();
      if (slot_ == nullptr) {  // this thread's first hold, and no memory for its slot
        starved_ = true;
        return;
      }
    }
    const bool light = slot_->light;
    for (;;) {
      T* q;
      if (light) {
        // Release (free on x86-64): a retire_wait that reads this value rather than the null
        // that ended this thread's previous hold still synchronises with everything before it
        // (a plain store after a release one does not extend its release sequence). The
        // compiler fence keeps the store before the reload; retire_wait's membarrier does
        // the rest.
        slot_->held.store(p, std::memory_order_release);
        std::atomic_signal_fence(std::memory_order_seq_cst);
        q = src.load(std::memory_order_acquire);
      } else {
        slot_->held.store(p, std::memory_order_seq_cst);
        q = src.load(std::memory_order_seq_cst);
      }
      if (q == p) break;
      p = q;  // replaced meanwhile: protect the new value (or none)
      if (p == nullptr) {
        slot_->held.store(nullptr, std::memory_order_release);
        slot_ = nullptr;
        return;
      }
    }
    value_ = p;
  }
  ~HazardHold() {
    if (slot_ != nullptr) slot_->held.store(nullptr, std::memory_order_release);
  }
  HazardHold(const HazardHold&) = delete;
  HazardHold& operator=(const HazardHold&) = delete;

  T* get() const noexcept { return value_; }
  // get() is null because this thread could not get a slot (out of memory), not because src
  // was null: the caller should retry later.
  bool starved() const noexcept { return starved_; }

 private:
  HazardSlot* slot_ = nullptr;
  T* value_ = nullptr;
  bool starved_ = false;
};

}  // namespace ferry::net
