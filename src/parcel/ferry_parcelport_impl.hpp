// ferry_parcelport_impl.hpp — the ferry parcelport's private declarations: the FerryParcelport
// class and its state, the records that name a parcel's operations (State and its kinds), and
// the synchronizer pool of completion=sync. The member functions live with what they own:
//   ferry_parcelport.cpp           set-up (options, queues, header receives), teardown, failure reports
//   ferry_parcelport_send.cpp      the send path: the header built and posted, follow-up sends
//   ferry_parcelport_recv.cpp      the receive path: header receives, completion dispatch, header
//                                  decoding, follow-up receives, delivery
//   ferry_parcelport_progress.cpp  background_work: progress modes, device polling, stealing, the
//                                  completion drain, the deferred list
//   ferry_parcelport_get.cpp       one-sided reads: exposed memory and gets
// A header on the wire is header.hpp's ParcelHeader, then zc_count sizes (u64), then the nzc
// if piggybacked. A SendState or RecvState lives on the heap from its parcel's first post (or
// header) until its last follow-up finishes; whoever finishes it last frees it (or discard,
// after finalize). Header slots and the synchronizer pool live as long as the parcelport.
//
// The ferry parcelport: header by active message (or by send/recv), follow-ups by tagged
// send/recv (or one iovec active message), completions through one completion queue (or a pool
// of synchronizers).
//
// Paths
//  - small parcel (no zero-copy chunk, nzc fits in the header): send() is one post_am; on the
//    receiver, one pop from the completion queue and handle_parcel with the nzc pointing into
//    ferry's packet (no copy, no allocation). No lock anywhere.
//  - parcel with follow-ups: one state record per parcel (heap) on each side; follow-ups are
//    posted all at once on the parcel's tag — ferry's matching is non-overtaking per (source,
//    tag), so they are received in order — and completions arrive through the same queue.
//  - back-pressure: a post that returns retry goes onto a deferred list (mutex, slow path)
//    that background_work drains, one thread at a time; send() never blocks.
//
// The design space (FERRY_HEADER, FERRY_DEVICE_POLLING and FERRY_PARCEL_QUEUES from the parcel
// layer's option_table(); FERRY_COMPLETION and FERRY_PROGRESS from the core's Runtime::options();
// [AMT-LCI] §5, [MPI-AMT] §5.2, [Daps] §IV; docs/references.md):
//  - FERRY_HEADER=sendrecv: headers are post_send on kHeaderTag; each device keeps K
//    (ParcelportOptions::header_recvs, default 4) post_recv(any_source, kHeaderTag) posted,
//    each into its own buffer, re-posted as soon as the header is copied out. K > 1 lets
//    several threads process headers of one device at once ([AMT-LCI] blames the single
//    pre-posted MPI_Irecv for serializing them); 4 covers the workers per device we run with
//    and costs 4 packets of receive buffer per device. The copy (one malloc of the header
//    size) is the price of owning the buffer: the upcall may keep the nzc.
//    With ParcelportOptions::iovec a parcel with follow-ups is still one active message (the
//    header is its eager part, [LCI-PP]'s iovec put); only parcels without follow-ups use the
//    header send.
//  - FERRY_COMPLETION=sync: every operation the parcelport posts completes into a Synchronizer
//    from a pool that background_work polls a window at a time (the HPX MPI parcelport's request
//    pool) — follow-ups always, header receives too with header=sendrecv; with header=am the
//    headers still arrive through the completion queue ([AMT-LCI] Fig 7 "sync").
//  - FERRY_PROGRESS: explicit (background_work progresses the devices the polling policy
//    picks), implicit (only when it found no completion to handle), thread:N (the core's
//    progress threads do it; background_work never progresses), steal (Daps: own device, else
//    a busy owner's device likely to have work; progress_policy.hpp).
//  - FERRY_DEVICE_POLLING (explicit and implicit): local (own device), random (one uniformly
//    random device per call), global (every device per call).
//  - FERRY_PARCEL_QUEUES: shared (one completion queue; an idle worker handles a parcel whichever
//    device brought it) or device (a queue per device, exposed as AM target kHeaderTarget + d;
//    a thread drains only the queues of the devices it polls — [MPI-AMT]'s devices, and with
//    them its attentiveness problem).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/cache_line.hpp"
#include "common/mpmc_ring.hpp"
#include "common/random.hpp"
#include "ferry/ferry.hpp"
#include "ferry/parcel.hpp"
#include "parcel/progress_policy.hpp"

namespace ferry::parcel::detail {

inline constexpr std::uint16_t kHeaderTarget = 1;
// header=sendrecv: the tag of every header. next_tag never hands it out to follow-ups.
inline constexpr ferry::Tag kHeaderTag = ferry::max_tag;
inline constexpr int kDefaultHeaderRecvs = 4;
// completion=sync: synchronizers in the pool, and how many of them one background_work tests.
inline constexpr std::uint32_t kSyncSlots = 4096;
inline constexpr std::uint32_t kSyncWindow = 32;

using Progress = ProgressMode;  // the core's FERRY_PROGRESS
using Polling = DevicePolling;  // FERRY_DEVICE_POLLING

// One synchronizer that completes one operation, claimed by exactly one poller.
//
// Contract: `ticket` is odd while an operation that names `sync` is (about to be) under way.
// The thread that owns the slot (it took it from the pool, or it claimed it last) arms it —
// even -> odd — before posting, and disarms it — odd -> even — if the post left nothing under
// way (done or retry: no signal will come). Any thread may claim(): it needs an odd ticket and
// test() == true, and wins the slot with one CAS odd -> even; the winner owns the slot again.
// The ticket only grows, so a poller that read a ticket before the slot was claimed, reset and
// re-armed fails its CAS (an ABA needs 2^31 reuses in between).
// Orders: test() is acquire and pairs with signal()'s release, so the winner reads the
// Completion the signaller wrote; the CAS is acq_rel so two claimers are totally ordered on
// the ticket. arm() is a release store (the post that follows publishes nothing through it;
// it only keeps the arming ordered before anything the owner does next).
struct alignas(ferry::detail::cache_line) SyncSlot {
  Synchronizer sync{1};
  std::atomic<std::uint32_t> ticket{0};

  void arm() noexcept { ticket.store(ticket.load(std::memory_order_relaxed) + 1, std::memory_order_release); }
  void disarm() noexcept { ticket.store(ticket.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
  bool claim(Completion& out) noexcept {
    std::uint32_t t = ticket.load(std::memory_order_acquire);
    if ((t & 1) == 0 || !sync.test()) return false;
    if (!ticket.compare_exchange_strong(t, t + 1, std::memory_order_acq_rel, std::memory_order_relaxed)) return false;
    out = std::move(sync.results()[0]);
    sync.reset();
    return true;
  }
};
// Pollers of neighbouring slots must not share a line: each slot is whole lines.
static_assert(alignof(SyncSlot) == ferry::detail::cache_line && sizeof(SyncSlot) % ferry::detail::cache_line == 0);

// The synchronizer pool of completion=sync.
//
// Contract: acquire() hands a free slot to one thread (the free-index ring's release/acquire
// orders the previous owner's reset before the new owner's use); release() returns a slot
// its owner holds. poll() claims signalled slots in a window of kSyncWindow slots that rotates
// over [0, high water mark) — the request-pool scan: a completion waits until the window
// passes it. hwm_ and cursor_ are relaxed: they only choose which slots to test; a slot
// acquired past a stale hwm_ is tested on a later call.
class SyncPool {
 public:
  SyncPool() : slots_(new SyncSlot[kSyncSlots]), free_(kSyncSlots) {
    for (std::uint32_t i = 0; i < kSyncSlots; ++i) (void)free_.try_push(i);
  }
  SyncSlot* acquire() noexcept {
    std::uint32_t i = 0;
    if (!free_.try_pop(i)) return nullptr;
    std::uint32_t h = hwm_.load(std::memory_order_relaxed);
    while (h < i + 1 && !hwm_.compare_exchange_weak(h, i + 1, std::memory_order_relaxed)) {
    }
    return &slots_[i];
  }
  void release(SyncSlot* s) noexcept {
    const auto i = static_cast<std::uint32_t>(s - slots_.get());
    (void)free_.try_push(i);  // never full: only taken indices come back
  }
  template <class F>
  bool poll(F&& on_completion) {
    const std::uint32_t h = hwm_.load(std::memory_order_relaxed);
    if (h == 0) return false;
    const std::uint32_t n = std::min(h, kSyncWindow);
    const std::uint32_t start = cursor_.fetch_add(n, std::memory_order_relaxed) % h;
    bool any = false;
    for (std::uint32_t k = 0; k < n; ++k) {
      SyncSlot& s = slots_[(start + k) % h];
      Completion c;
      if (!s.claim(c)) continue;
      release(&s);
      any = true;
      on_completion(std::move(c));
    }
    return any;
  }

 private:
  std::unique_ptr<SyncSlot[]> slots_;
  ferry::detail::MpmcRing<std::uint32_t> free_;
  std::atomic<std::uint32_t> hwm_{0};
  std::atomic<std::uint32_t> cursor_{0};
};

// Per-parcel state, the context of every follow-up completion of that parcel; or a header
// receive slot (header=sendrecv).
enum class StateKind : std::uint8_t { send, recv, header };
struct State {
  StateKind kind;
};

// One pre-posted header receive: its buffer, its device, and (completion=sync) its synchronizer.
struct HeaderSlot : State {
  int device = 0;
  std::vector<std::byte> buffer;
  SyncSlot slot;
};

// `error`: the first error of any follow-up (0: none); relaxed, read by the last finisher
// after its acq_rel decrement of `remaining`, which orders every finisher's store before it.
struct SendState : State {
  std::atomic<std::size_t> remaining;
  SentCallback on_sent;
  int dest = -1;
  std::atomic<int> error{0};
};

struct RecvState : State {
  int source;
  ferry::Tag tag;
  int device;
  bool awaiting_nzc;  // the nzc arrives as a follow-up; zc receives are posted after it
  std::vector<std::size_t> sizes;
  Parcel parcel;
  std::atomic<std::size_t> remaining;
  std::atomic<int> error{0};  // as SendState::error
};

// A get of the layer above, from post to completion: the context of its completion in the
// parcelport's get queue.
struct GetOp {
  GetCallback done;
};

class FerryParcelport final : public Parcelport {
  // The options' own ranges, checked before the runtime's collective set-up starts.
  static const ParcelportOptions& checked(const ParcelportOptions& options);

 public:
  FerryParcelport(const ParcelportOptions& options, Upcalls& upcalls);
  ~FerryParcelport() override;

  int rank() const noexcept override { return rt_.rank(); }
  int size() const noexcept override { return rt_.size(); }
  std::string name() const override { return iovec_ ? "ferry(iovec)" : "ferry"; }
  std::string transport() const override { return rt_.transport(); }
  std::uint64_t parcels_sent() const noexcept override { return sent_.load(std::memory_order_relaxed); }
  std::uint64_t parcels_delivered() const noexcept override { return delivered_.load(std::memory_order_relaxed); }
  std::uint64_t parcels_malformed() const noexcept override { return malformed_.load(std::memory_order_relaxed); }

  void send(int dest, Parcel&& parcel, SentCallback on_sent) override;
  bool background_work() override;
  void worker_busy(bool busy) noexcept override;

  void barrier() override { rt_.barrier(); }

  // ---- one-sided reads ----
  bool has_get() const noexcept override { return true; }

  std::unique_ptr<ExposedMemory> expose_memory(void* data, std::size_t size) override;
  void get(int rank, const std::vector<std::byte>& key, std::size_t offset, void* dst, std::size_t bytes,
           GetCallback done) override;

 private:
  // What each thread keeps for the polling policies: its random numbers, its local-polling
  // miss count, its NUMA node, and which parcelport (by generation) it registered as an owner in.
  struct PerThread {
    ferry::detail::XorShift rng{static_cast<std::uint32_t>(thread_index()) * 0x9E3779B1u + 0x7F4A7C15u};
    unsigned misses = 0;
    int node = -2;  // -2: not asked yet
    std::uint64_t owner_of = 0;
    int numa_node() {
      if (node == -2) node = current_numa_node();
      return node;
    }
  };
  static PerThread& per_thread();

  // Shared by the paths, and inline: the send and receive fast paths call them.
  bool progress_device(int d) { return devs_[static_cast<std::size_t>(d)]->progress(); }
  CompletionQueue& cq_of(int d) noexcept { return *cqs_[per_device_ ? static_cast<std::size_t>(d) : 0]; }
  std::uint16_t header_target(int d) const noexcept {
    return static_cast<std::uint16_t>(kHeaderTarget + (per_device_ ? d : 0));
  }

  // An operation that completes on device d is under way: d likely has work (steal's hint).
  void expect(int d) noexcept {
    if (policy_) policy_->expect_work(d);
  }

  // Posts one operation whose local completion is the completion queue or, with
  // completion=sync, a synchronizer from the pool. `post` receives the completion object.
  // A pool that is empty is a retry like any other shortage.
  template <class Post>
  Status post_op(int d, Post&& post) {
    if (!sync_) {
      const Status s = post(static_cast<CompletionObject*>(&cq_of(d)));
      if (s.is_posted()) expect(d);
      return s;
    }
    SyncSlot* slot = pool_->acquire();
    if (slot == nullptr) {
      // The pool is exhausted: this operation completes through the completion queue instead.
      // Waiting for a slot could wait forever: the slots may all be held by operations whose
      // peers wait, in turn, for slots of their own (a flood of 20000 zero-copy parcels did
      // that: sends held the sender's slots, receives the receiver's, each waiting for the
      // other's missing half). From the first overflow on, every drain also drains the queue.
      cq_overflow_.store(true, std::memory_order_relaxed);
      const Status s = post(static_cast<CompletionObject*>(&cq_of(d)));
      if (s.is_posted()) expect(d);
      return s;
    }
    slot->arm();
    Status s;
    try {
      s = post(static_cast<CompletionObject*>(&slot->sync));
    } catch (...) {
      slot->disarm();
      pool_->release(slot);
      throw;
    }
    if (s.is_posted()) {
      expect(d);
    } else {  // done or retry: no signal will come
      slot->disarm();
      pool_->release(slot);
    }
    return s;
  }

  // ferry_parcelport.cpp
  void report_failures();
  void discard(Completion&& c) noexcept;
  static std::uint64_t next_generation() noexcept;

  // ferry_parcelport_send.cpp
  ferry::Tag next_tag(int dev);
  Status post_header_once(Device& dev, int dest, const std::byte* data, std::size_t size);
  void post_header(Device& dev, int dest, const std::byte* data, std::size_t size, bool report);
  void post_in_order(int d, std::vector<Chunk> chunks, State* st, std::function<Status(const Chunk&)> post_one);
  template <class Post>
  void post_deferrable(int d, Post post, State* st);
  void finish_send(SendState* s);

  // ferry_parcelport_recv.cpp
  Status post_header_recv(HeaderSlot* hs);
  bool try_repost_header(HeaderSlot* hs);
  void repost_header(HeaderSlot* hs);
  static Buffer copy_header(const HeaderSlot* hs, std::size_t size);
  void on_header_recv(HeaderSlot* hs, Completion&& c);
  void handle(Completion&& c);
  static void set_error(State* st, int error) noexcept;
  void finish_one(State* st, const Status& s);
  [[gnu::noinline]] void finish_recv(RecvState* r);
  void on_header(int source, Buffer header, std::vector<Buffer> parts);
  void start_zc(RecvState* r);
  void post_recvs(RecvState* r, std::vector<Chunk> into);
  void deliver(RecvState* r);

  // ferry_parcelport_progress.cpp
  bool service(int d, bool progress);
  bool poll_devices();
  template <class Visit>
  bool for_polled_devices(Visit&& visit);
  bool steal();
  bool drain_completions();
  bool drain_queue(CompletionQueue& q);

  // With sync and sendrecv nothing completes into the queue — except in iovec mode, whose
  // parcels with follow-ups travel as one active message (header and parts) to the queue.
  bool use_cq() const noexcept { return !(sync_ && sendrecv_) || iovec_; }

  void defer(std::function<bool()> step);
  bool run_deferred();
  void put_back(std::function<bool()> step);

  // ferry_parcelport_get.cpp
  void finish_get(GetOp* op, int error);
  bool drain_gets();

  Upcalls& upcalls_;
  std::mutex failure_mutex_;
  std::vector<std::uint8_t> reported_ranks_;  // under failure_mutex_
  std::atomic<std::uint32_t> failures_reported_{0};
  // completion=sync: an operation found the synchronizer pool empty and completes through the
  // completion queue (see post_op); the queues are drained from then on.
  std::atomic<bool> cq_overflow_{false};  // relaxed: a hint; the mutex guards the reporting
  const Settings settings_;  // resolved before rt_: a bad value throws before the collective setup
  Runtime rt_;
  bool iovec_;
  Progress progress_ = Progress::explicit_calls;
  Polling polling_ = Polling::local;
  bool sendrecv_ = false;
  bool sync_ = false;
  std::vector<Device*> devs_;
  std::size_t max_header_ = 0;
  bool per_device_ = false;  // parcel_queues=device (with more than one device)
  // One completion queue, or one per device (per_device_), each exposed as the AM target
  // kHeaderTarget + its device: a header lands in the queue of the device it arrived on.
  std::vector<std::unique_ptr<CompletionQueue>> cqs_;
  std::vector<Exposure> exposures_;
  // The layer above's gets: their completions, and how many are posted or queued (relaxed
  // throughout: the count only lets drain_completions skip an empty queue).
  CompletionQueue gets_cq_;
  std::atomic<std::size_t> gets_in_flight_{0};
  std::vector<std::atomic<std::uint32_t>> tags_;
  // Which parcelport a thread registered as an owner in (PerThread::owner_of): never 0.
  const std::uint64_t generation_ = next_generation();
  std::unique_ptr<StealPolicy> policy_;          // progress=steal
  std::unique_ptr<SyncPool> pool_;               // completion=sync
  std::vector<std::unique_ptr<HeaderSlot>> header_slots_;  // header=sendrecv
  // Counters for termination detection. Relaxed: read only as sums, after quiescence.
  std::atomic<std::uint64_t> sent_{0};
  std::atomic<std::uint64_t> delivered_{0};
  std::atomic<std::uint64_t> malformed_{0};
  std::mutex deferred_mutex_;
  std::deque<std::function<bool()>> deferred_;
  std::atomic<std::size_t> deferred_count_{0};
  std::atomic<bool> deferred_running_{false};
};

}  // namespace ferry::parcel::detail
