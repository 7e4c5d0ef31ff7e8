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
#include "parcel/ferry_parcelport.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>

#include "common/cache_line.hpp"
#include "common/log.hpp"
#include "common/mpmc_ring.hpp"
#include "common/random.hpp"
#include "ferry/error.hpp"
#include "ferry/ferry.hpp"
#include "parcel/check_parcel.hpp"
#include "parcel/header.hpp"
#include "parcel/progress_policy.hpp"

namespace ferry::parcel::detail {

namespace {

constexpr std::uint16_t kHeaderTarget = 1;
// header=sendrecv: the tag of every header. next_tag never hands it out to follow-ups.
constexpr ferry::Tag kHeaderTag = ferry::max_tag;
constexpr int kDefaultHeaderRecvs = 4;
// completion=sync: synchronizers in the pool, and how many of them one background_work tests.
constexpr std::uint32_t kSyncSlots = 4096;
constexpr std::uint32_t kSyncWindow = 32;

using Progress = ProgressMode;  // the core's FERRY_PROGRESS
using Polling = DevicePolling;  // FERRY_DEVICE_POLLING

// What travels in front of every header (header.hpp): then zc_count sizes (u64), then the nzc
// if piggybacked.
using detail::ParcelHeader;

void release_malloc(void*, void* data) noexcept { std::free(data); }

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

// A region registered on every device (a get goes through the reading thread's device, and a
// key is checked against the device it is used on); the key is one RemoteKey per device.
class FerryExposedMemory final : public ExposedMemory {
 public:
  explicit FerryExposedMemory(std::vector<MemoryRegion> regions) : regions_(std::move(regions)) {
    key_.resize(regions_.size() * sizeof(RemoteKey));
    for (std::size_t d = 0; d < regions_.size(); ++d) {
      const RemoteKey k = regions_[d].remote_key();
      std::memcpy(key_.data() + d * sizeof k, &k, sizeof k);
    }
  }
  const std::vector<std::byte>& key() const noexcept override { return key_; }

 private:
  std::vector<MemoryRegion> regions_;
  std::vector<std::byte> key_;
};

class FerryParcelport final : public Parcelport {
  // The options' own ranges, checked before the runtime's collective set-up starts.
  static const ParcelportOptions& checked(const ParcelportOptions& options) {
    if (options.max_header != 0 && options.max_header < sizeof(ParcelHeader) + 8) {
      throw Error("ParcelportOptions::max_header=" + std::to_string(options.max_header) + " is too small: 0 (the " +
                  "device's eager limit) or at least " + std::to_string(sizeof(ParcelHeader) + 8) + " bytes");
    }
    if (options.header_recvs < 0 || options.header_recvs > 1024) {
      throw Error("ParcelportOptions::header_recvs=" + std::to_string(options.header_recvs) + " is out of range: 0 (default " +
                  std::to_string(kDefaultHeaderRecvs) + ") to 1024");
    }
    return options;
  }

 public:
  FerryParcelport(const ParcelportOptions& options, Upcalls& upcalls)
      : upcalls_(upcalls),
        settings_(option_table().resolve(checked(options)).settings),
        rt_(RuntimeOptions{.devices = options.devices}),
        iovec_(options.iovec),
        tags_(static_cast<std::size_t>(rt_.device_count())) {
    const RuntimeSettings& core = rt_.options().settings;
    if (core.lock_model == LockModel::serialized) {
      throw Error("FERRY_LOCK_MODEL=serialized: the parcel layer's worker threads share its devices, which that "
                  "model does not allow (choose another lock model)");
    }
    progress_ = core.progress.value;
    polling_ = settings_.device_polling;
    sendrecv_ = settings_.header == HeaderPrimitive::sendrecv;
    sync_ = core.completion == CompletionMechanism::sync;
    per_device_ = settings_.parcel_queues == ParcelQueues::device && rt_.device_count() > 1;
    for (int d = 0; d < rt_.device_count(); ++d) devs_.push_back(&rt_.device(d));
    if (progress_ == Progress::steal) policy_ = std::make_unique<StealPolicy>(rt_.device_count());
    if (sync_) pool_ = std::make_unique<SyncPool>();

    for (int q = 0; q < (per_device_ ? rt_.device_count() : 1); ++q) {
      cqs_.push_back(std::make_unique<CompletionQueue>());
      exposures_.push_back(rt_.expose(*cqs_.back(), static_cast<std::uint16_t>(kHeaderTarget + q)));
    }
    max_header_ = rt_.device(0).eager_limit();
    if (max_header_ < sizeof(ParcelHeader) + 8) {
      throw Error("the parcel header needs " + std::to_string(sizeof(ParcelHeader) + 8) + " bytes but the device's eager " +
                  "limit is " + std::to_string(max_header_) + " (FERRY_PACKET_SIZE=" +
                  std::to_string(core.packet_size) + ", FERRY_RDV_THRESHOLD=" + std::to_string(core.rdv_threshold) + ")");
    }
    if (options.max_header != 0 && options.max_header < max_header_) max_header_ = options.max_header;
    for (auto& t : tags_) t.store(1, std::memory_order_relaxed);
    if (sendrecv_) {
      const int k = options.header_recvs != 0 ? options.header_recvs : kDefaultHeaderRecvs;
      for (int d = 0; d < rt_.device_count(); ++d) {
        for (int i = 0; i < k; ++i) {
          auto hs = std::make_unique<HeaderSlot>();
          hs->kind = StateKind::header;
          hs->device = d;
          // The whole eager limit: a peer with a larger max_header still fits.
          hs->buffer.resize(rt_.device(d).eager_limit());
          header_slots_.push_back(std::move(hs));
        }
      }
      for (auto& hs : header_slots_) repost_header(hs.get());
    }
    rt_.barrier();  // every rank listens before anyone sends
  }

  ~FerryParcelport() override {
    try {
      rt_.finalize();
    } catch (const PeerFailed&) {
      // Closed all the same; the failure reached the layer above through peer_failed.
    }
    // Follow-ups the runtime completed while it shut down (a rendezvous whose FIN came during
    // finalize's drain) left their completions in the queues: their records are freed here.
    // No callback runs — the layer above is shutting down and must not be called back into.
    for (auto& q : cqs_) {
      while (auto c = q->pop()) discard(std::move(*c));
    }
    while (auto c = gets_cq_.pop()) delete static_cast<GetOp*>(c->context);
  }

  int rank() const noexcept override { return rt_.rank(); }
  int size() const noexcept override { return rt_.size(); }
  std::string name() const override { return iovec_ ? "ferry(iovec)" : "ferry"; }
  std::string transport() const override { return rt_.transport(); }
  std::uint64_t parcels_sent() const noexcept override { return sent_.load(std::memory_order_relaxed); }
  std::uint64_t parcels_delivered() const noexcept override { return delivered_.load(std::memory_order_relaxed); }
  std::uint64_t parcels_malformed() const noexcept override { return malformed_.load(std::memory_order_relaxed); }

  void send(int dest, Parcel&& parcel, SentCallback on_sent) override {
    if (dest < 0 || dest >= size()) {
      throw Error("parcel send: destination=" + std::to_string(dest) + " is out of range; the job has " +
                  std::to_string(size()) + " ranks (0.." + std::to_string(size() - 1) + ")");
    }
    check_parcel_chunks("parcel send", parcel);
    const int dev_index = thread_index() % rt_.device_count();
    Device& dev = *devs_[static_cast<std::size_t>(dev_index)];
    const std::size_t table = sizeof(ParcelHeader) + parcel.zc.size() * sizeof(std::uint64_t);
    if (table > max_header_ || parcel.zc.size() > 0xFFFF) {
      throw Error("parcel send: " + std::to_string(parcel.zc.size()) + " zero-copy chunks need a " +
                  std::to_string(table) + "-byte header; the limit is " + std::to_string(max_header_));
    }
    // In iovec mode the header shares its packet with the rendezvous descriptor of every part.
    const std::size_t room = iovec_ ? std::min(max_header_, dev.iovec_eager_limit(parcel.zc.size() + 1)) : max_header_;
    if (table > room) {
      throw Error("parcel send: " + std::to_string(parcel.zc.size()) + " zero-copy chunks need a " +
                  std::to_string(table) + "-byte header; the limit is " + std::to_string(room));
    }
    const bool piggyback = table + parcel.nzc.size <= room;
    const bool follow_ups = !piggyback || !parcel.zc.empty();
    sent_.fetch_add(1, std::memory_order_relaxed);

    // The header is built in a per-thread buffer: no allocation after the first parcel.
    thread_local std::vector<std::byte> scratch;
    if (scratch.size() < max_header_) scratch.resize(max_header_);
    ParcelHeader h{};
    h.nzc_size = static_cast<std::uint32_t>(parcel.nzc.size);
    h.zc_count = static_cast<std::uint16_t>(parcel.zc.size());
    h.piggyback = piggyback ? 1 : 0;
    h.device = static_cast<std::uint8_t>(dev_index);
    if (follow_ups) h.tag = next_tag(dev_index);
    if (parcel.nzc.size > 0xFFFFFFFFu) throw Error("parcel send: nzc.size=" + std::to_string(parcel.nzc.size) + " exceeds 4 GiB");
    std::byte* at = scratch.data() + sizeof(ParcelHeader);
    for (const Chunk& c : parcel.zc) {
      const std::uint64_t s = c.size;
      std::memcpy(at, &s, sizeof s);
      at += sizeof s;
    }
    if (piggyback && parcel.nzc.size != 0) {
      std::memcpy(at, parcel.nzc.data, parcel.nzc.size);
      at += parcel.nzc.size;
    }
    std::memcpy(scratch.data(), &h, sizeof h);
    const std::size_t header_size = static_cast<std::size_t>(at - scratch.data());

    if (!follow_ups) {
      post_header(dev, dest, scratch.data(), header_size, true);
      if (on_sent) on_sent();
      return;
    }
    auto* st = new SendState{};
    st->kind = StateKind::send;
    st->on_sent = std::move(on_sent);
    st->dest = dest;
    if (iovec_) {
      // One call: header as the eager part, then the nzc (if not piggybacked) and every zc chunk.
      AmIovecArgs args;
      args.rank = dest;
      args.eager = {scratch.data(), header_size};
      if (!piggyback) args.parts.push_back({parcel.nzc.data, parcel.nzc.size});
      for (const Chunk& c : parcel.zc) args.parts.push_back({c.data, c.size});
      args.target = {header_target(dev_index)};
      args.context = static_cast<State*>(st);
      st->remaining.store(1, std::memory_order_relaxed);
      // The header bytes live in `scratch`: a deferred post needs its own copy.
      post_deferrable(dev_index, [this, &dev, dev_index, args, copy = std::vector<std::byte>(scratch.data(), scratch.data() + header_size)]() mutable {
        args.eager = {copy.data(), copy.size()};
        return post_op(dev_index, [&](CompletionObject* local) {
          args.local = local;
          return dev.post_am_iovec(args);
        });
      }, st);
      return;
    }
    std::vector<Chunk> chunks;
    chunks.reserve(parcel.zc.size() + 1);
    if (!piggyback) chunks.push_back(parcel.nzc);
    chunks.insert(chunks.end(), parcel.zc.begin(), parcel.zc.end());
    st->remaining.store(chunks.size(), std::memory_order_relaxed);
    post_header(dev, dest, scratch.data(), header_size, false);
    const ferry::Tag tag = h.tag;
    post_in_order(dev_index, std::move(chunks), st, [this, &dev, dev_index, dest, tag, st](const Chunk& c) {
      return post_op(dev_index, [&](CompletionObject* local) {
        return dev.post_send({.rank = dest, .buffer = c.data, .size = c.size, .tag = tag, .local = local,
                              .context = static_cast<State*>(st)});
      });
    });
  }

  bool background_work() override {
    // One relaxed-cost load per call: the core's failure count (see report_failures).
    if (__builtin_expect(rt_.failure_count() != failures_reported_.load(std::memory_order_relaxed), 0)) report_failures();
    bool any = false;
    switch (progress_) {
      case Progress::explicit_calls:
        any = poll_devices();
        any |= run_deferred();
        any |= drain_completions();
        break;
      case Progress::implicit:
        // MPI's way: the progress engine runs only when testing found nothing to do.
        any = run_deferred();
        any |= drain_completions();
        if (!any) {
          any = poll_devices();
          any |= drain_completions();
        }
        break;
      case Progress::thread:  // the core's progress threads progress; the workers only consume
        any = run_deferred();
        any |= drain_completions();
        break;
      case Progress::steal:
        any = steal();
        any |= run_deferred();
        any |= drain_completions();
        break;
    }
    return any;
  }

  void worker_busy(bool busy) noexcept override {
    if (progress_ != Progress::steal) return;
    PerThread& t = per_thread();
    const int d = thread_index() % rt_.device_count();
    if (t.owner_of != generation_) {  // first report from this thread: it owns its device
      t.owner_of = generation_;
      policy_->add_owner(d, t.numa_node());
    }
    policy_->owner_busy(d, busy);
  }

  void barrier() override { rt_.barrier(); }

  // ---- one-sided reads ----
  bool has_get() const noexcept override { return true; }

  std::unique_ptr<ExposedMemory> expose_memory(void* data, std::size_t size) override {
    std::vector<MemoryRegion> regions;
    for (Device* d : devs_) regions.push_back(d->register_memory(data, size));
    return std::make_unique<FerryExposedMemory>(std::move(regions));
  }

  void get(int rank, const std::vector<std::byte>& key, std::size_t offset, void* dst, std::size_t bytes,
           GetCallback done) override {
    if (rank < 0 || rank >= size()) {
      throw Error("parcel get: rank=" + std::to_string(rank) + " is out of range; the job has " + std::to_string(size()) +
                  " ranks");
    }
    if (key.size() != devs_.size() * sizeof(RemoteKey)) {
      throw Error("parcel get: a key of " + std::to_string(key.size()) + " bytes; this parcelport's keys have " +
                  std::to_string(devs_.size() * sizeof(RemoteKey)) + " (one per device: is FERRY_DEVICES the same on every rank?)");
    }
    const int d = thread_index() % static_cast<int>(devs_.size());
    RemoteKey k;
    std::memcpy(&k, key.data() + static_cast<std::size_t>(d) * sizeof k, sizeof k);
    if (k.rank != rank || k.device != d) {
      throw Error("parcel get: the key is rank " + std::to_string(k.rank) + "'s (device " + std::to_string(k.device) +
                  "), not rank=" + std::to_string(rank) + "'s (device " + std::to_string(d) + ")");
    }
    if (offset > k.size || bytes > k.size - offset) {
      throw Error("parcel get: offset=" + std::to_string(offset) + " + size=" + std::to_string(bytes) +
                  " is outside rank " + std::to_string(rank) + "'s region of " + std::to_string(k.size) + " bytes");
    }
    if (bytes == 0) {
      done(0);
      return;
    }
    auto* op = new GetOp{std::move(done)};
    gets_in_flight_.fetch_add(1, std::memory_order_relaxed);
    auto post = [this, d, rank, dst, bytes, k, offset, op]() -> bool {
      const Status s = devs_[static_cast<std::size_t>(d)]->post_get(
          GetArgs{.rank = rank, .buffer = dst, .size = bytes, .remote = k, .offset = offset, .local = &gets_cq_, .context = op});
      if (s.is_retry()) return false;
      if (!s.is_posted()) finish_get(op, s.is_done() ? 0 : peer_failed_error);
      return true;
    };
    if (!post()) defer(std::move(post));
  }

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
  static PerThread& per_thread() {
    thread_local PerThread t;
    return t;
  }

  bool progress_device(int d) { return devs_[static_cast<std::size_t>(d)]->progress(); }

  // Tells the layer above of each rank that failed since the last report, once per rank. A
  // slow path under a mutex; the count is stored after the upcalls, so a thread that reads
  // it equal knows every failure up to it has been reported.
  void report_failures() {
    std::unique_lock<std::mutex> g(failure_mutex_, std::try_to_lock);
    if (!g.owns_lock()) return;
    const std::uint32_t count = rt_.failure_count();
    for (int r : rt_.failed_ranks()) {
      if (reported_ranks_.size() < static_cast<std::size_t>(size())) reported_ranks_.assign(static_cast<std::size_t>(size()), 0);
      if (reported_ranks_[static_cast<std::size_t>(r)] != 0) continue;
      reported_ranks_[static_cast<std::size_t>(r)] = 1;
      upcalls_.peer_failed(r);
    }
    failures_reported_.store(count, std::memory_order_relaxed);
  }

  CompletionQueue& cq_of(int d) noexcept { return *cqs_[per_device_ ? static_cast<std::size_t>(d) : 0]; }
  std::uint16_t header_target(int d) const noexcept {
    return static_cast<std::uint16_t>(kHeaderTarget + (per_device_ ? d : 0));
  }

  // parcel_queues=device: what "polling device d" means: progress it (unless progress threads
  // do that) and handle what its own queue holds. Nobody else takes d's completions, so a
  // parcel on a busy worker's device waits for a poller, as [MPI-AMT] §5.2 describes.
  bool service(int d, bool progress) {
    bool any = progress && progress_device(d);
    any |= drain_queue(cq_of(d));
    return any;
  }

  // explicit / implicit: progress the devices FERRY_DEVICE_POLLING picks.
  bool poll_devices() {
    return for_polled_devices([this](int d) { return per_device_ ? service(d, true) : progress_device(d); });
  }

  // Applies visit to the devices FERRY_DEVICE_POLLING picks for this call; true if any visit was.
  template <class Visit>
  bool for_polled_devices(Visit&& visit) {
    const int n = static_cast<int>(devs_.size());
    if (n == 1) return visit(0);
    const int own = thread_index() % n;
    PerThread& t = per_thread();
    switch (polling_) {
      case Polling::local: {
        bool any = visit(own);
        // Starvation guard: a device no thread maps to (fewer pollers than devices, or a
        // poller that left) would never progress. One idle call in 4096 also polls another
        // device, which keeps "local" live (a worker's idle loop makes that call within about
        // a millisecond) without making it "global": a parcel on a busy worker's device still
        // waits for that worker's task to end, as [MPI-AMT] §5.2 describes, unless the task
        // is long. (One in 256 answered within tens of microseconds and hid that cost.)
        if (!any && (++t.misses & 4095u) == 0) any = visit((own + 1 + t.rng.below(n - 1)) % n);
        return any;
      }
      case Polling::random:
        return visit(t.rng.below(n));
      case Polling::global: {
        bool any = false;
        for (int k = 0; k < n; ++k) any |= visit((own + k) % n);  // own first
        return any;
      }
    }
    return false;
  }

  bool steal() {
    PerThread& t = per_thread();
    // With queues per device, the queues of the devices progressed here are drained after the
    // policy dropped its in_progress flag: a parcel handled here may run its task inline, and
    // a device must not look taken (unstealable) for the length of a task. StealPolicy::poll
    // progresses at most two devices per call (its own, then one victim), hence two slots.
    int visited[2];
    int nvisited = 0;
    bool any = policy_->poll(thread_index() % static_cast<int>(devs_.size()), t.numa_node(), t.rng, [&](int d) {
      if (nvisited < 2) visited[nvisited++] = d;
      return progress_device(d);
    });
    if (per_device_) {
      for (int i = 0; i < nvisited; ++i) any |= drain_queue(cq_of(visited[i]));
    }
    return any;
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

  ferry::Tag next_tag(int dev) {
    // Relaxed: a tag only has to differ from the tags of this device's other parcels in flight.
    // Never 0 (no follow-ups) and never the header tag.
    for (;;) {
      const ferry::Tag t = tags_[static_cast<std::size_t>(dev)].fetch_add(1, std::memory_order_relaxed) & ferry::max_tag;
      if (t != 0 && t != kHeaderTag) return t;
    }
  }

  Status post_header_once(Device& dev, int dest, const std::byte* data, std::size_t size) {
    if (sendrecv_) return dev.post_send({.rank = dest, .buffer = data, .size = size, .tag = kHeaderTag});
    return dev.post_am({.rank = dest, .buffer = data, .size = size, .target = {header_target(dev.index())}});
  }

  // `report`: a header-only parcel, whose failure the header reports (send_failed); a parcel
  // with follow-ups reports it once, through them (they go to the same failed rank).
  void post_header(Device& dev, int dest, const std::byte* data, std::size_t size, bool report) {
    for (int attempt = 0; attempt < 64; ++attempt) {
      const Status s = post_header_once(dev, dest, data, size);
      if (s.is_failed() && report) upcalls_.send_failed(dest, peer_failed_error);
      if (!s.is_retry()) return;  // eager: done
      dev.progress();
    }
    std::vector<std::byte> copy(data, data + size);
    defer([this, &dev, dest, report, copy = std::move(copy)] {
      const Status s = post_header_once(dev, dest, copy.data(), copy.size());
      if (s.is_failed() && report) upcalls_.send_failed(dest, peer_failed_error);
      return !s.is_retry();
    });
  }

  // header=sendrecv: posts hs's receive (armed, with completion=sync).
  Status post_header_recv(HeaderSlot* hs) {
    CompletionObject* local = &cq_of(hs->device);
    if (sync_) {
      hs->slot.arm();
      local = &hs->slot.sync;
    }
    const Status s = devs_[static_cast<std::size_t>(hs->device)]->post_recv(
        {.rank = any_source, .buffer = hs->buffer.data(), .size = hs->buffer.size(), .tag = kHeaderTag, .local = local,
         .context = static_cast<State*>(hs)});
    if (sync_ && !s.is_posted()) hs->slot.disarm();
    return s;
  }

  // Posts hs again; a header that was already waiting is taken and processed on the way.
  // False when the device asked for a retry.
  bool try_repost_header(HeaderSlot* hs) {
    for (;;) {
      const Status s = post_header_recv(hs);
      if (s.is_posted()) return true;
      if (s.is_retry()) return false;
      on_header(s.rank, copy_header(hs, s.size), {});
    }
  }

  void repost_header(HeaderSlot* hs) {
    if (!try_repost_header(hs)) defer([this, hs] { return try_repost_header(hs); });
  }

  // The header's bytes in a buffer of their own, so the slot can receive the next one at once.
  static Buffer copy_header(const HeaderSlot* hs, std::size_t size) {
    void* p = std::malloc(size != 0 ? size : 1);
    if (p == nullptr) throw Error("parcel receive: cannot allocate a " + std::to_string(size) + "-byte header");
    std::memcpy(p, hs->buffer.data(), std::min(size, hs->buffer.size()));
    return Buffer(p, size, &release_malloc, nullptr);
  }

  void on_header_recv(HeaderSlot* hs, Completion&& c) {
    if (!c.ok()) {
      FERRY_LOG_AT(error, rank(), -1, "parcelport: a header receive failed: %s", c.error_string().c_str());
      repost_header(hs);
      return;
    }
    Buffer b = copy_header(hs, c.size);
    repost_header(hs);
    on_header(c.rank, std::move(b), {});
  }

  // Posts chunks in order with post_one; at the first retry the rest become one deferred step,
  // so a parcel's follow-ups (and their receives) are never posted out of order — ferry
  // matches them by (source, tag) in posting order.
  void post_in_order(int d, std::vector<Chunk> chunks, State* st, std::function<Status(const Chunk&)> post_one) {
    std::size_t i = 0;
    for (; i < chunks.size(); ++i) {
      const Status s = post_one(chunks[i]);
      if (s.is_retry()) break;
      if (s.is_done() || s.is_failed()) finish_one(st, s);
    }
    if (i == chunks.size()) return;
    progress_device(d);
    defer([this, chunks = std::move(chunks), i, st, post_one = std::move(post_one)]() mutable {
      for (; i < chunks.size(); ++i) {
        const Status s = post_one(chunks[i]);
        if (s.is_retry()) return false;
        if (s.is_done() || s.is_failed()) finish_one(st, s);
      }
      return true;
    });
  }

  // Posts now or later; a `done` result counts as an immediate completion of `st`.
  template <class Post>
  void post_deferrable(int d, Post post, State* st) {
    const Status s = post();
    if (!s.is_retry()) {
      if (s.is_done() || s.is_failed()) finish_one(st, s);
      return;
    }
    progress_device(d);
    defer([this, post = std::move(post), st]() mutable {
      const Status s2 = post();
      if (s2.is_retry()) return false;
      if (s2.is_done() || s2.is_failed()) finish_one(st, s2);
      return true;
    });
  }

  void defer(std::function<bool()> step) {
    std::lock_guard<std::mutex> g(deferred_mutex_);
    deferred_.push_back(std::move(step));
    deferred_count_.store(deferred_.size(), std::memory_order_relaxed);
  }

  // Runs the deferred steps in order, stopping at the first that still cannot go (follow-ups
  // of one parcel stay in order). One runner at a time (deferred_running_, a try-flag: acquire
  // on taking it, release on dropping it, so the next runner sees the list as this one left
  // it). The runner takes one step at a time off the front and runs it without the mutex: a
  // step may defer() again (a header re-post, an upcall that sends), which appends at the back.
  // A step that cannot go returns to the front, so a call costs the steps it runs, not the
  // length of the list (thousands of parcels may wait behind a full queue).
  bool run_deferred() {
    // Relaxed: a stale zero only postpones the work to a later call.
    if (deferred_count_.load(std::memory_order_relaxed) == 0) return false;
    if (deferred_running_.exchange(true, std::memory_order_acquire)) return false;
    struct Release {
      std::atomic<bool>& running;
      ~Release() { running.store(false, std::memory_order_release); }
    } release{deferred_running_};
    bool any = false;
    for (;;) {
      std::function<bool()> step;
      {
        std::lock_guard<std::mutex> g(deferred_mutex_);
        if (deferred_.empty()) break;
        step = std::move(deferred_.front());
        deferred_.pop_front();
        deferred_count_.store(deferred_.size(), std::memory_order_relaxed);
      }
      bool went = false;
      try {
        went = step();
      } catch (...) {
        put_back(std::move(step));
        throw;
      }
      if (!went) {
        put_back(std::move(step));
        break;
      }
      any = true;
    }
    return any;
  }
  void put_back(std::function<bool()> step) {
    std::lock_guard<std::mutex> g(deferred_mutex_);
    deferred_.push_front(std::move(step));
    deferred_count_.store(deferred_.size(), std::memory_order_relaxed);
  }

  // A get of the layer above is done: its record goes, then its callback runs.
  void finish_get(GetOp* op, int error) {
    GetCallback done = std::move(op->done);
    delete op;
    gets_in_flight_.fetch_sub(1, std::memory_order_relaxed);
    done(error);
  }
  bool drain_gets() {
    bool any = false;
    for (int i = 0; i < 16; ++i) {
      auto c = gets_cq_.pop();
      if (!c) break;
      any = true;
      finish_get(static_cast<GetOp*>(c->context), c->error);
    }
    return any;
  }

  // Everything that finished: the completion queue, and with completion=sync the header
  // slots and one window of the synchronizer pool.
  bool drain_completions() {
    bool any = false;
    // Relaxed: a stale zero leaves a finished get to the next call.
    if (__builtin_expect(gets_in_flight_.load(std::memory_order_relaxed) != 0, 0)) any = drain_gets();
    // Relaxed: a stale false only leaves an overflowed completion to the next call.
    if (use_cq() || cq_overflow_.load(std::memory_order_relaxed)) {
      // parcel_queues=device: the queues of the devices the polling policy picks. explicit and
      // steal drained them as they progressed; implicit tests them before it progresses;
      // progress threads leave the workers only the queues.
      if (!per_device_) {
        any |= drain_queue(*cqs_[0]);
      } else if (progress_ == Progress::thread || progress_ == Progress::implicit) {
        any |= for_polled_devices([this](int d) { return service(d, false); });
      }
    }
    if (sync_) {
      for (auto& hs : header_slots_) {
        Completion c;
        if (!hs->slot.claim(c)) continue;
        any = true;
        on_header_recv(hs.get(), std::move(c));
      }
      any |= pool_->poll([this](Completion&& c) { handle(std::move(c)); });
    }
    return any;
  }
  bool drain_queue(CompletionQueue& q) {
    bool any = false;
    for (int i = 0; i < 8; ++i) {
      auto c = q.pop();
      if (!c) break;
      any = true;
      handle(std::move(*c));
    }
    return any;
  }

  // With sync and sendrecv nothing completes into the queue — except in iovec mode, whose
  // parcels with follow-ups travel as one active message (header and parts) to the queue.
  bool use_cq() const noexcept { return !(sync_ && sendrecv_) || iovec_; }

  void handle(Completion&& c) {
    if (c.op == OpKind::remote_am) {
      // A header (or an iovec parcel) that failed with its sender holds nothing to decode: the
      // failure reaches the application once, through the peer_failed upcall.
      if (!c.ok()) {
        if (c.error != peer_failed_error)
          FERRY_LOG_AT(error, rank(), -1, "parcelport: a message from rank %d failed: %s", c.rank, c.error_string().c_str());
        return;
      }
      on_header(c.rank, std::move(c.buffer), std::move(c.parts));
      return;
    }
    auto* st = static_cast<State*>(c.context);
    if (st->kind == StateKind::header) {
      on_header_recv(static_cast<HeaderSlot*>(st), std::move(c));
      return;
    }
    if (!c.ok()) {
      if (c.error != peer_failed_error) {  // a failed peer is reported once, by peer_failed
        FERRY_LOG_AT(error, rank(), -1, "parcelport: a follow-up %s with rank %d failed: %s", to_string(c.op), c.rank,
                     c.error_string().c_str());
      }
      set_error(st, c.error);
    }
    finish_one(st, Status::make_done());
  }

  static void set_error(State* st, int error) noexcept {
    std::atomic<int>& e = st->kind == StateKind::send ? static_cast<SendState*>(st)->error : static_cast<RecvState*>(st)->error;
    int none = 0;
    e.compare_exchange_strong(none, error, std::memory_order_relaxed);
  }

  // A completion left after finalize: frees its record once its last follow-up is in.
  void discard(Completion&& c) noexcept {
    if (c.op == OpKind::remote_am || c.context == nullptr) return;  // a header: its buffers go with c
    auto* st = static_cast<State*>(c.context);
    if (st->kind == StateKind::send) {
      auto* s = static_cast<SendState*>(st);
      if (s->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) delete s;
    } else if (st->kind == StateKind::recv) {
      auto* r = static_cast<RecvState*>(st);
      if (r->awaiting_nzc || r->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) delete r;
    }
  }

  // One follow-up of `st` finished (a failed post finishes it with the peer's failure).
  void finish_one(State* st, const Status& s) {
    if (s.is_failed()) set_error(st, peer_failed_error);
    if (st->kind == StateKind::send) {
      finish_send(static_cast<SendState*>(st));
    } else {
      finish_recv(static_cast<RecvState*>(st));
    }
  }

  // acq_rel: the last finisher must see every other finisher's effects before it frees or
  // delivers.
  void finish_send(SendState* s) {
    if (s->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      if (const int e = s->error.load(std::memory_order_relaxed); e != 0) upcalls_.send_failed(s->dest, e);
      if (s->on_sent) s->on_sent();
      delete s;
    }
  }

  [[gnu::noinline]] void finish_recv(RecvState* r) {
    if (r->awaiting_nzc) {
      r->awaiting_nzc = false;
      if (r->error.load(std::memory_order_relaxed) != 0) {
        deliver(r);  // as failed: no zero-copy chunks are asked for
        return;
      }
      start_zc(r);
      return;
    }
    if (r->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) deliver(r);
  }

  // A header from `source`, in `header` (which the parcel may keep as its nzc storage); with
  // iovec, `parts` holds the follow-ups that came with it.
  void on_header(int source, Buffer header, std::vector<Buffer> parts) {
    const auto* base = static_cast<const std::byte*>(header.data());
    detail::HeaderView v;
    // Without iovec, follow-ups are received on the header's tag, which next_tag never makes
    // the header tag itself (such a receive could take the sender's next header) or past it.
    if (!detail::check_header(base, header.size(), parts.size(), v) || (parts.empty() && v.h.tag >= kHeaderTag)) {
      malformed_.fetch_add(1, std::memory_order_relaxed);
      FERRY_LOG_AT(warn, rank(), -1, "parcelport: dropped a malformed %zu-byte header from rank %d (%zu parts)",
                   header.size(), source, parts.size());
      return;
    }
    const ParcelHeader& h = v.h;
    const std::byte* at = v.nzc;
    std::vector<std::size_t> sizes(h.zc_count);
    for (std::size_t i = 0; i < sizes.size(); ++i) sizes[i] = detail::zc_size(v, i);
    if (!parts.empty()) {  // iovec: everything is here
      Parcel p;
      std::size_t k = 0;
      if (h.piggyback) {
        p.nzc = {const_cast<std::byte*>(at), h.nzc_size};
        p.nzc_storage = std::move(header);
      } else {
        p.nzc = {static_cast<std::byte*>(parts[0].data()), parts[0].size()};
        p.nzc_storage = std::move(parts[0]);
        k = 1;
      }
      for (; k < parts.size(); ++k) {
        p.zc.push_back({static_cast<std::byte*>(parts[k].data()), parts[k].size()});
        p.zc_storage.push_back(std::move(parts[k]));
      }
      delivered_.fetch_add(1, std::memory_order_relaxed);
      upcalls_.handle_parcel(source, std::move(p));
      return;
    }
    if (h.piggyback && h.zc_count == 0) {  // the common small parcel: hand over ferry's buffer
      Parcel p;
      p.nzc = {const_cast<std::byte*>(at), h.nzc_size};
      p.nzc_storage = std::move(header);
      delivered_.fetch_add(1, std::memory_order_relaxed);
      upcalls_.handle_parcel(source, std::move(p));
      return;
    }
    auto* r = new RecvState{};
    r->kind = StateKind::recv;
    r->source = source;
    r->tag = h.tag;
    r->device = h.device % rt_.device_count();
    r->sizes = std::move(sizes);
    if (h.piggyback) {
      // This parcel waits for its follow-ups, perhaps for long: it must not hold ferry's packet
      // meanwhile. Thousands of such parcels would drain the pool, and then the device could
      // neither repost receives nor send, so the follow-ups that free them could never arrive.
      // The nzc is small (it fit in the header): copy it out and let the packet go now.
      void* nzc = std::malloc(h.nzc_size != 0 ? h.nzc_size : 1);
      if (nzc == nullptr) throw Error("parcel receive: cannot allocate " + std::to_string(h.nzc_size) + " bytes");
      if (h.nzc_size != 0) std::memcpy(nzc, at, h.nzc_size);
      header.reset();
      r->parcel.nzc = {static_cast<std::byte*>(nzc), h.nzc_size};
      r->parcel.nzc_storage = Buffer(nzc, h.nzc_size, &release_malloc, nullptr);
      r->awaiting_nzc = false;
      start_zc(r);
      return;
    }
    void* nzc = std::malloc(h.nzc_size != 0 ? h.nzc_size : 1);
    if (nzc == nullptr) throw Error("parcel receive: cannot allocate " + std::to_string(h.nzc_size) + " bytes");
    r->parcel.nzc = {static_cast<std::byte*>(nzc), h.nzc_size};
    r->parcel.nzc_storage = Buffer(nzc, h.nzc_size, &release_malloc, nullptr);
    r->awaiting_nzc = true;
    post_recvs(r, {r->parcel.nzc});
  }

  void start_zc(RecvState* r) {
    if (r->sizes.empty()) {
      deliver(r);
      return;
    }
    // Nothing else refers to r yet: if the upcall throws or breaks its contract, the parcel is
    // dropped with it.
    std::unique_ptr<RecvState> dropped(r);
    r->parcel.zc = upcalls_.allocate_zc_chunks(r->source, r->parcel.nzc, r->sizes);
    if (r->parcel.zc.size() != r->sizes.size()) {
      throw Error("allocate_zc_chunks returned " + std::to_string(r->parcel.zc.size()) + " chunks for " +
                  std::to_string(r->sizes.size()));
    }
    dropped.release();
    r->remaining.store(r->sizes.size(), std::memory_order_relaxed);
    for (std::size_t i = 0; i < r->sizes.size(); ++i) r->parcel.zc[i].size = r->sizes[i];
    post_recvs(r, r->parcel.zc);
  }

  void post_recvs(RecvState* r, std::vector<Chunk> into) {
    const int d = r->device;
    Device& dev = *devs_[static_cast<std::size_t>(d)];
    post_in_order(d, std::move(into), r, [this, &dev, d, r](const Chunk& c) {
      return post_op(d, [&](CompletionObject* local) {
        return dev.post_recv({.rank = r->source, .buffer = c.data, .size = c.size, .tag = r->tag, .local = local,
                              .context = static_cast<State*>(r)});
      });
    });
  }

  void deliver(RecvState* r) {
    const int source = r->source;
    const int error = r->error.load(std::memory_order_relaxed);
    Parcel p = std::move(r->parcel);
    delete r;
    if (error != 0) {
      upcalls_.receive_failed(source, std::move(p), error);
      return;
    }
    delivered_.fetch_add(1, std::memory_order_relaxed);
    upcalls_.handle_parcel(source, std::move(p));
  }

  static std::uint64_t next_generation() noexcept {
    // Relaxed: only uniqueness matters.
    static std::atomic<std::uint64_t> counter{0};
    return counter.fetch_add(1, std::memory_order_relaxed) + 1;
  }

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

}  // namespace

std::unique_ptr<Parcelport> make_ferry_parcelport(const ParcelportOptions& options, Upcalls& upcalls) {
  return std::make_unique<FerryParcelport>(options, upcalls);
}

}  // namespace ferry::parcel::detail
