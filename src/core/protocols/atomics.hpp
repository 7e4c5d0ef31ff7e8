// atomics.hpp — remote atomics (Device::post_atomic) performed by the owner's progress, on
// every transport: the request goes as a control packet, the owner checks it against the
// regions registered on its device (core/atomic_wire.hpp), performs it with one CPU atomic and
// answers with the value before; the answer writes the caller's result and signals its
// completion object.
//
// Concurrency. post() by any thread; on_request(), on_reply() and fail_peer() by the poll lock
// holder. The pending table is under its own mutex (held for a few stores, never across a call
// out); a reply may be taken by one thread's progress while another thread is still inside
// the post that sent its request, so a post that cannot send takes its own entry back first
// and, when the entry is gone already, reports `posted` (its completion was signalled).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "core/atomic_wire.hpp"
#include "core/device_context.hpp"
#include "ferry/runtime.hpp"

namespace ferry::detail {

// A posted atomic awaiting its reply.
struct AtomicWait {
  void* result = nullptr;
  std::uint32_t width = 0;
  int rank = -1;
  CompletionObject* local = nullptr;
  void* context = nullptr;
};

// The posted atomics by id: a slot index and its generation, so a stale or forged id misses.
class PendingAtomics {
 public:
  std::uint64_t add(const AtomicWait& w);
  // The atomic `id` names if it went to `rank` and still waits; it leaves the table.
  bool take(std::uint64_t id, int rank, AtomicWait& out);
  // Every atomic waiting on `rank`; they leave the table.
  void take_rank(int rank, std::vector<AtomicWait>& out);

 private:
  struct Slot {
    AtomicWait wait;
    std::uint32_t generation = 0;
    bool used = false;
  };
  std::mutex mutex_;
  std::vector<Slot> slots_;
  std::vector<std::uint32_t> free_;
};

class Atomics {
 public:
  Atomics(DeviceContext& dc, const RegionSet& regions) : dc_(dc), regions_(regions) {}

  // A checked atomic (the key names `a.rank` and this device, the location fits and is
  // aligned) to another rank.
  Status post(const AtomicArgs& a);
  // One to this rank's own memory: performed now; false when the location is in no region.
  bool perform_local(const AtomicArgs& a);
  // One on a location this process maps (`at`: aligned, checked): performed now.
  static void perform_at(unsigned char* at, const AtomicArgs& a) noexcept;
  // A request and a reply that arrived (their length checked by min_length).
  void on_request(Packet* p);
  void on_reply(Packet* p);
  // `rank` failed: its atomics end with peer_failed_error.
  void fail_peer(int rank);

 private:
  bool send_reply(int rank, const AtomicReply& r);

  DeviceContext& dc_;
  const RegionSet& regions_;
  PendingAtomics pending_;
};

}  // namespace ferry::detail
