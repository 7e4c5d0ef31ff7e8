// hazard.cpp — the process's hazard slots and the retiring side (see hazard.hpp).
#include "net/hazard.hpp"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include "common/log.hpp"
#include "common/tsan.hpp"

namespace ferry::net {
namespace hazard_detail {

constinit thread_local HazardSlot* tls_slot __attribute__((tls_model("initial-exec"))) = nullptr;

namespace {

// Every slot ever made, newest first; slots are never freed (a finished thread's is reused).
std::atomic<HazardSlot*> g_slots{nullptr};

// Gives the thread's slot back when the thread ends. Only constructed by take_slot, so the
// hold's fast path reads the trivial tls_slot and never this object's guard.
struct SlotReturn {
  HazardSlot* slot = nullptr;
  ~SlotReturn() {
    if (slot == nullptr) return;
    slot->held.store(nullptr, std::memory_order_release);
    tls_slot = nullptr;
    slot->owned.store(false, std::memory_order_release);
  }
};
thread_local SlotReturn t_return;

}  // namespace

HazardSlot* take_slot() noexcept {
  HazardSlot* s = nullptr;
  for (HazardSlot* c = g_slots.load(std::memory_order_acquire); c != nullptr; c = c->next) {
    bool free = false;
    if (!c->owned.load(std::memory_order_relaxed)) {  // relaxed: a hint; the exchange below decides
      // Acquire: pairs with the release that gave the slot back.
      if (c->owned.compare_exchange_strong(free, true, std::memory_order_acquire)) {
        s = c;
        break;
      }
    }
  }
  if (s == nullptr) {
    s = new (std::nothrow) HazardSlot;
    if (s == nullptr) return nullptr;  // out of memory: the hold reports it, its caller retries
    // Relaxed, both: the slot is published by the release exchange below, and a stale head
    // only costs the exchange a retry.
    s->owned.store(true, std::memory_order_relaxed);
    s->light = expedited();
    HazardSlot* head = g_slots.load(std::memory_order_relaxed);
    do {
      s->next = head;
      // Release: a scanner that reaches s sees its next and its fields.
    } while (!g_slots.compare_exchange_weak(head, s, std::memory_order_release, std::memory_order_relaxed));
  }
  tls_slot = s;
  t_return.slot = s;
  return s;
}

std::size_t slot_count() noexcept {
  std::size_t n = 0;
  for (HazardSlot* c = g_slots.load(std::memory_order_acquire); c != nullptr; c = c->next) ++n;
  return n;
}

bool expedited() noexcept {
#ifdef FERRY_TSAN
  return false;
#else
  // Registered once, before any caller can act on the answer (a function-local static:
  // its initialisation happens before every read of it).
  static const bool registered =
      syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0) == 0;
  return registered;
#endif
}

void barrier_all() noexcept {
  if (syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) == 0) return;
  const int err = errno;
  FERRY_LOG(error, "membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) failed after registration: %s (%d); "
                   "ferry's asymmetric fences cannot order memory without it",
            std::strerror(err), err);
  std::abort();
}

}  // namespace hazard_detail

void retire_wait(const void* p) noexcept {
  if (p == nullptr) return;
  // After the caller's seq_cst replacement of p. The membarrier is a full barrier here and in
  // every running thread of the process, the light holds' missing half.
  if (hazard_detail::expedited()) hazard_detail::barrier_all();
  for (HazardSlot* c = hazard_detail::g_slots.load(std::memory_order_acquire); c != nullptr; c = c->next) {
    // A hold lasts one post: a short wait, yielding to a preempted holder.
    while (c->held.load(std::memory_order_seq_cst) == p) std::this_thread::yield();
  }
}

}  // namespace ferry::net
