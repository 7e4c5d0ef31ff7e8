// The MPI baseline parcelports: a faithful model of HPX's MPI parcelport, which ferry is measured
// against. It is slow by design — the point is to reproduce the baseline, not to improve on it.
//
// Message sequence per parcel (all on one communicator):
//   header    MPI_Isend on tag 0 to one pre-posted MPI_Irecv(ANY_SOURCE, tag 0) of max_header
//             bytes; carries the parcel's tag, the nzc size, the zc size table and, when it fits,
//             the nzc itself.
//   nzc       MPI_Isend on the parcel's tag, unless it was piggybacked.
//   zc[i]     MPI_Isend on the parcel's tag, one after another.
// Each side has at most one request outstanding per parcel and posts the next chunk only once
// MPI_Test reported the previous one complete, as HPX does; since the receiver posts in the same
// order, MPI's non-overtaking rule for one (source, tag, communicator) pairs the chunks up.
//
// Progress: pending parcels sit in connection deques (one for sends, one for receives) behind
// spinlocks. Each background_work() tests the header request under a try-lock, then pops ONE
// sender and ONE receiver connection, tests its single request and moves it on as far as it
// goes; an unfinished connection goes back to the end of its deque. A connection popped from a
// deque is owned by one thread, which is what keeps two threads from testing one request.
//
// Variants
//   mpi    one communicator.
//   mpi_a  mpi plus HPX-style opportunistic aggregation per destination (see Aggregator).
//   mpix   N communicators, each with its own header receive and deques; threads are mapped
//          statically with thread_index() % N. Follow-ups use the communicator the header used.
//          MPICH gives each communicator its own VCI (its own lock and network resources) only
//          when built with several (--with-ch4-max-vcis, per-VCI critical sections) and run with
//          MPIR_CVAR_CH4_NUM_VCIS=N; the parcelport does not set it, since an MPICH built with one
//          VCI aborts in MPI_Init when asked for more. Otherwise the communicators share one VCI.
//
// send() posts the header and queues the connection; unlike HPX it does not test it at once, so
// on_sent always runs inside background_work() and never re-enters the caller of send().
#include <mpi.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/log.hpp"
#include "ferry/error.hpp"
#include "ferry/parcel.hpp"
#include "ferry/parcel_mpi.hpp"
#include "parcel/check_parcel.hpp"
#include "parcel/mpi_header.hpp"

namespace ferry::parcel::detail {

namespace {

constexpr int kHeaderTag = 0;
constexpr std::size_t kDefaultMaxHeader = 512;

std::string mpi_error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, static_cast<std::size_t>(len));
}

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw Error(std::string(what) + " failed: " + mpi_error_string(rc));
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown thread level";
  }
}

// Chunks can exceed INT_MAX bytes; MPI-4's large-count calls take them whole.
int isend(const void* data, std::size_t size, int dest, int tag, MPI_Comm comm, MPI_Request* req) {
#if MPI_VERSION >= 4
  return MPI_Isend_c(data, static_cast<MPI_Count>(size), MPI_BYTE, dest, tag, comm, req);
#else
  if (size > static_cast<std::size_t>(INT_MAX)) {
    throw Error("chunk of " + std::to_string(size) + " bytes exceeds INT_MAX");
  }
  return MPI_Isend(data, static_cast<int>(size), MPI_BYTE, dest, tag, comm, req);
#endif
}

int irecv(void* data, std::size_t size, int source, int tag, MPI_Comm comm, MPI_Request* req) {
#if MPI_VERSION >= 4
  return MPI_Irecv_c(data, static_cast<MPI_Count>(size), MPI_BYTE, source, tag, comm, req);
#else
  if (size > static_cast<std::size_t>(INT_MAX)) {
    throw Error("chunk of " + std::to_string(size) + " bytes exceeds INT_MAX");
  }
  return MPI_Irecv(data, static_cast<int>(size), MPI_BYTE, source, tag, comm, req);
#endif
}

// HPX guards its deques with a spinlock; send() locks it, background_work() only try-locks.
class Spinlock {
 public:
  bool try_lock() noexcept {
    return !locked_.load(std::memory_order_relaxed) && !locked_.exchange(true, std::memory_order_acquire);
  }
  void lock() noexcept {
    for (unsigned spins = 0; !try_lock(); ++spins) {
      // Yield after a while: ranks and threads may outnumber cores.
      if (spins >= 64) std::this_thread::yield();
    }
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

void release_free(void* /*owner*/, void* data) noexcept { std::free(data); }

void* checked_malloc(std::size_t size, const char* what) {
  void* p = std::malloc(size != 0 ? size : 1);  // non-null even for an empty nzc
  if (p == nullptr) throw Error(std::string(what) + ": cannot allocate " + std::to_string(size) + " bytes");
  return p;
}

// One receive buffer holding the nzcs of an aggregate; each delivered parcel holds a reference.
struct SharedNzc {
  std::atomic<std::size_t> refs;
  void* base;
};

void release_shared(void* owner, void* /*data*/) noexcept {
  auto* shared = static_cast<SharedNzc*>(owner);
  if (shared->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    std::free(shared->base);
    delete shared;
  }
}

struct FreeDeleter {
  void operator()(void* p) const noexcept { std::free(p); }
};

enum class Step { idle, progressed, finished };

struct Device;

struct SenderConnection {
  Device* device = nullptr;
  int destination = -1;
  int tag = 0;
  std::vector<std::byte> header;
  Chunk nzc;
  bool nzc_followup = false;  // false once sent, or when piggybacked
  std::vector<Chunk> zc;
  std::size_t next_zc = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<SentCallback> on_sent;                // one per original parcel
  std::unique_ptr<void, FreeDeleter> owned_nzc;     // an aggregate's merged nzc
};

struct ReceiverConnection {
  struct Part {
    Chunk nzc;
    std::size_t zc_count = 0;
  };
  Device* device = nullptr;
  int source = -1;
  int tag = 0;
  bool aggregate = false;
  bool nzc_followup = false;
  bool zc_ready = false;  // allocate_zc_chunks ran
  std::vector<std::size_t> zc_sizes;
  std::unique_ptr<void, FreeDeleter> nzc;  // malloc'ed; handed to the parcels on delivery
  std::size_t nzc_size = 0;
  std::vector<Chunk> zc;
  std::size_t next_zc = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<Part> parts;  // aggregate only
};

// One communicator with everything HPX keeps per parcelport: the pre-posted header receive and
// the two connection deques.
struct Device {
  MPI_Comm comm = MPI_COMM_NULL;

  Spinlock header_lock;
  MPI_Request header_request = MPI_REQUEST_NULL;
  std::vector<std::byte> header_buffer;

  Spinlock senders_lock;
  std::deque<std::unique_ptr<SenderConnection>> senders;

  Spinlock receivers_lock;
  std::deque<std::unique_ptr<ReceiverConnection>> receivers;
};

// MPI can be initialized once per process only, so the parcelport that initialized it cannot
// finalize it when destroyed (a second parcelport in the same process, e.g. the next variant in a
// test, would then be impossible). It finalizes at process exit instead.
void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void ensure_mpi_initialized() {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) throw Error("MPI parcelport: MPI has already been finalized in this process");
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    std::atexit(finalize_at_exit);
  } else {
    check(MPI_Query_thread(&provided), "MPI_Query_thread");
  }
  if (provided != MPI_THREAD_MULTIPLE) {
    throw Error(std::string("MPI parcelport needs MPI_THREAD_MULTIPLE but MPI provides ") +
                thread_level_name(provided) + " (provided=" + std::to_string(provided) + ")");
  }
}

class MpiParcelport final : public Parcelport {
 public:
  // Made only by make_mpi_parcelport, which the registry calls under "mpi", "mpi_a" and "mpix".
  MpiParcelport(const ParcelportOptions& options, Upcalls& upcalls) : upcalls_(upcalls), kind_(options.kind) {
    max_header_ = options.max_header != 0 ? options.max_header : kDefaultMaxHeader;
    if (max_header_ < sizeof(MpiParcelHeader) || max_header_ > static_cast<std::size_t>(INT_MAX)) {
      throw Error("MPI parcelport: max_header=" + std::to_string(options.max_header) + " must lie in [" +
                  std::to_string(sizeof(MpiParcelHeader)) + ", " + std::to_string(INT_MAX) + "] bytes");
    }
    int device_count = 1;
    if (kind_ == "mpix") {
      if (options.devices < 0) {
        throw Error("MPI parcelport: devices=" + std::to_string(options.devices) + " must be >= 0");
      }
      device_count = options.devices != 0 ? options.devices : 2;
    }
    aggregate_ = kind_ == "mpi_a";

    ensure_mpi_initialized();
    check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
    void* attr = nullptr;
    int found = 0;
    check(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &attr, &found), "MPI_Comm_get_attr(MPI_TAG_UB)");
    tag_ub_ = found ? *static_cast<int*>(attr) : 32767;  // 32767: the least the standard allows

    for (int i = 0; i < device_count; ++i) {
      auto dev = std::make_unique<Device>();
      check(MPI_Comm_dup(MPI_COMM_WORLD, &dev->comm), "MPI_Comm_dup");
      // Errors come back as codes so they can become ferry::Error instead of aborting the job.
      check(MPI_Comm_set_errhandler(dev->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
      dev->header_buffer.resize(max_header_);
      post_header_receive(*dev);
      devices_.push_back(std::move(dev));
    }
    if (aggregate_) {
      for (int i = 0; i < size_; ++i) destinations_.push_back(std::make_unique<Destination>());
    }
  }

  ~MpiParcelport() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;  // the application finalized MPI first; nothing can be released now
    // Whatever is still pending here was abandoned by the caller (no barrier before teardown);
    // receives are cancelled, sends are left to complete on their own.
    for (auto& dev : devices_) {
      if (dev->header_request != MPI_REQUEST_NULL) {
        MPI_Cancel(&dev->header_request);
        MPI_Wait(&dev->header_request, MPI_STATUS_IGNORE);
      }
      for (auto& c : dev->receivers) {
        if (c->request != MPI_REQUEST_NULL) {
          MPI_Cancel(&c->request);
          MPI_Wait(&c->request, MPI_STATUS_IGNORE);
        }
      }
      for (auto& c : dev->senders) {
        if (c->request != MPI_REQUEST_NULL) MPI_Request_free(&c->request);
      }
      MPI_Comm_free(&dev->comm);
    }
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::string name() const override { return kind_; }
  std::string transport() const override { return "mpi"; }

  void send(int destination, Parcel&& parcel, SentCallback on_sent) override {
    if (destination < 0 || destination >= size_) {
      throw Error("MPI parcelport send: destination=" + std::to_string(destination) + " is out of range; the job has " +
                  std::to_string(size_) + " ranks (0.." + std::to_string(size_ - 1) + ")");
    }
    const std::size_t table = sizeof(MpiParcelHeader) + 8 * parcel.zc.size();
    if (table > max_header_) {
      throw Error("send: the header needs " + std::to_string(table) + " bytes for " +
                  std::to_string(parcel.zc.size()) + " zero-copy chunk sizes but max_header is " +
                  std::to_string(max_header_));
    }
    check_parcel_chunks("MPI parcelport send", parcel);
    sent_.fetch_add(1, std::memory_order_relaxed);
    if (aggregate_) {
      enqueue(destination, std::move(parcel), std::move(on_sent));
      return;
    }
    std::vector<SentCallback> callbacks;
    callbacks.push_back(std::move(on_sent));
    start_send(my_device(), destination, parcel.nzc, std::move(parcel.zc), 0, std::move(callbacks), nullptr);
  }

  // mpix polling choice: a thread first works on its own communicator (thread_index() % N), as
  // HPX's "local" strategy does; only when that found nothing to do does it visit one other
  // communicator, round-robin. Without that fallback a communicator whose threads are busy — or
  // that no thread maps to, as when fewer threads than communicators poll, or a single thread
  // sits in barrier() — would never advance (the attentiveness problem, taken to a hang); the
  // fallback costs nothing on the busy path, which stays on the thread's own communicator.
  bool background_work() override {
    const std::size_t n = devices_.size();
    if (n == 1) return work(*devices_[0]);
    const std::size_t mine = my_device_index();
    if (work(*devices_[mine])) return true;
    thread_local std::size_t cursor = 0;
    const std::size_t other = (mine + 1 + (cursor++ % (n - 1))) % n;
    return work(*devices_[other]);
  }

  // One thread per rank at a time: concurrent collectives on one communicator are erroneous.
  void barrier() override {
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ibarrier(devices_[0]->comm, &request), "MPI_Ibarrier");
    for (;;) {
      int done = 0;
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test(barrier)");
      if (done) return;
      if (!background_work()) std::this_thread::yield();
    }
  }

  std::uint64_t parcels_sent() const noexcept override { return sent_.load(std::memory_order_relaxed); }
  std::uint64_t parcels_delivered() const noexcept override { return delivered_.load(std::memory_order_relaxed); }
  std::uint64_t parcels_malformed() const noexcept override { return malformed_.load(std::memory_order_relaxed); }

 private:
  // mpi_a: HPX's per-destination parcel queue. The thread that enqueues tries to become the
  // destination's sender; the winner drains the queue and ships it as one parcel. A thread that
  // loses the race leaves its parcel to the winner, who re-checks the queue after stepping down,
  // so nothing is stranded waiting for a later send().
  struct Pending {
    Parcel parcel;
    SentCallback on_sent;
  };
  struct Destination {
    std::mutex mutex;
    std::deque<Pending> queue;
    std::atomic<bool> sending{false};
  };

  std::size_t my_device_index() const noexcept {
    return static_cast<std::size_t>(thread_index()) % devices_.size();
  }
  Device& my_device() noexcept { return *devices_[my_device_index()]; }

  int next_tag() noexcept {
    // Tag 0 is the header's. Wrapping is safe as long as fewer than tag_ub parcels from one
    // rank are in flight at once, which HPX assumes as well.
    const std::uint64_t n = tag_counter_.fetch_add(1, std::memory_order_relaxed);
    return 1 + static_cast<int>(n % static_cast<std::uint64_t>(tag_ub_));
  }

  void post_header_receive(Device& dev) {
    check(MPI_Irecv(dev.header_buffer.data(), static_cast<int>(max_header_), MPI_BYTE, MPI_ANY_SOURCE, kHeaderTag,
                    dev.comm, &dev.header_request),
          "MPI_Irecv(header)");
  }

  void start_send(Device& dev, int destination, Chunk nzc, std::vector<Chunk> zc, std::uint32_t flags,
                  std::vector<SentCallback> callbacks, std::unique_ptr<void, FreeDeleter> owned) {
    auto c = std::make_unique<SenderConnection>();
    c->device = &dev;
    c->destination = destination;
    c->tag = next_tag();
    c->nzc = nzc;
    c->zc = std::move(zc);
    c->on_sent = std::move(callbacks);
    c->owned_nzc = std::move(owned);

    const std::size_t table = sizeof(MpiParcelHeader) + 8 * c->zc.size();
    const bool piggyback = table + nzc.size <= max_header_;
    c->nzc_followup = !piggyback;
    c->header.resize(piggyback ? table + nzc.size : table);
    MpiParcelHeader h{kMpiSignature, c->tag, flags | (piggyback ? kFlagPiggyback : 0u),
                 static_cast<std::uint32_t>(c->zc.size()), nzc.size};
    std::byte* out = c->header.data();
    std::memcpy(out, &h, sizeof h);
    for (std::size_t i = 0; i < c->zc.size(); ++i) {
      const std::uint64_t s = c->zc[i].size;
      std::memcpy(out + sizeof h + 8 * i, &s, 8);
    }
    if (piggyback && nzc.size != 0) std::memcpy(out + table, nzc.data, nzc.size);

    check(isend(c->header.data(), c->header.size(), destination, kHeaderTag, dev.comm, &c->request),
          "MPI_Isend(header)");
    std::lock_guard<Spinlock> lock(dev.senders_lock);
    dev.senders.push_back(std::move(c));
  }

  // --- mpi_a ---------------------------------------------------------------------------------

  void enqueue(int destination, Parcel&& parcel, SentCallback&& on_sent) {
    Destination& d = *destinations_[static_cast<std::size_t>(destination)];
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      d.queue.push_back(Pending{std::move(parcel), std::move(on_sent)});
    }
    for (;;) {
      bool expected = false;
      if (!d.sending.compare_exchange_strong(expected, true, std::memory_order_acquire)) return;
      struct StepDown {
        Destination& d;
        ~StepDown() { d.sending.store(false, std::memory_order_release); }
      };
      {
        StepDown guard{d};
        std::vector<Pending> batch = take_batch(d);
        if (!batch.empty()) send_batch(destination, std::move(batch));
      }
      std::lock_guard<std::mutex> lock(d.mutex);
      if (d.queue.empty()) return;
    }
  }

  // Everything queued, except that the merged zc size table must still fit in the header; the
  // rest waits for the next round.
  std::vector<Pending> take_batch(Destination& d) {
    const std::size_t capacity = (max_header_ - sizeof(MpiParcelHeader)) / 8;
    std::vector<Pending> batch;
    std::size_t zc_total = 0;
    std::lock_guard<std::mutex> lock(d.mutex);
    while (!d.queue.empty()) {
      const std::size_t k = d.queue.front().parcel.zc.size();
      if (!batch.empty() && zc_total + k > capacity) break;
      zc_total += k;
      batch.push_back(std::move(d.queue.front()));
      d.queue.pop_front();
    }
    return batch;
  }

  void send_batch(int destination, std::vector<Pending> batch) {
    Device& dev = *devices_[0];
    std::vector<SentCallback> callbacks;
    callbacks.reserve(batch.size());
    if (batch.size() == 1) {
      // A lone parcel goes as it is: the index would be pure overhead.
      Pending& p = batch.front();
      callbacks.push_back(std::move(p.on_sent));
      start_send(dev, destination, p.parcel.nzc, std::move(p.parcel.zc), 0, std::move(callbacks), nullptr);
      return;
    }
    std::size_t nzc_total = aggregate_index_size(batch.size());
    std::size_t zc_total = 0;
    for (const Pending& p : batch) {
      nzc_total += p.parcel.nzc.size;
      zc_total += p.parcel.zc.size();
    }
    std::unique_ptr<void, FreeDeleter> merged(checked_malloc(nzc_total, "mpi_a aggregate"));
    auto* out = static_cast<std::byte*>(merged.get());
    const std::uint64_t count = batch.size();
    std::memcpy(out, &count, 8);
    std::size_t at = aggregate_index_size(batch.size());
    std::vector<Chunk> zc;
    zc.reserve(zc_total);
    for (std::size_t i = 0; i < batch.size(); ++i) {
      Pending& p = batch[i];
      const std::uint64_t entry[2] = {p.parcel.nzc.size, p.parcel.zc.size()};
      std::memcpy(out + 8 + 16 * i, entry, 16);
      if (p.parcel.nzc.size != 0) std::memcpy(out + at, p.parcel.nzc.data, p.parcel.nzc.size);
      at += p.parcel.nzc.size;
      zc.insert(zc.end(), p.parcel.zc.begin(), p.parcel.zc.end());
      callbacks.push_back(std::move(p.on_sent));
    }
    start_send(dev, destination, Chunk{out, nzc_total}, std::move(zc), kFlagAggregate, std::move(callbacks),
               std::move(merged));
  }

  // --- progress ------------------------------------------------------------------------------

  bool work(Device& dev) {
    bool progressed = false;
    std::unique_ptr<ReceiverConnection> incoming = accept(dev);
    if (incoming) progressed = true;

    std::unique_ptr<SenderConnection> sender;
    if (dev.senders_lock.try_lock()) {
      if (!dev.senders.empty()) {
        sender = std::move(dev.senders.front());
        dev.senders.pop_front();
      }
      dev.senders_lock.unlock();
    }
    if (sender) {
      const Step step = advance(*sender);
      if (step != Step::idle) progressed = true;
      if (step == Step::finished) {
        // Out of the connection first: a callback may free the chunks or send again.
        std::vector<SentCallback> callbacks = std::move(sender->on_sent);
        sender.reset();
        for (auto& cb : callbacks) {
          if (cb) cb();
        }
      } else {
        std::lock_guard<Spinlock> lock(dev.senders_lock);
        dev.senders.push_back(std::move(sender));
      }
    }

    // As in HPX, a freshly accepted connection is this call's receiver; otherwise the next one.
    std::unique_ptr<ReceiverConnection> receiver = std::move(incoming);
    if (!receiver && dev.receivers_lock.try_lock()) {
      if (!dev.receivers.empty()) {
        receiver = std::move(dev.receivers.front());
        dev.receivers.pop_front();
      }
      dev.receivers_lock.unlock();
    }
    if (receiver) {
      const Step step = advance(*receiver);
      if (step != Step::idle) progressed = true;
      if (step != Step::finished) {
        std::lock_guard<Spinlock> lock(dev.receivers_lock);
        dev.receivers.push_back(std::move(receiver));
      }
    }
    return progressed;
  }

  // The header request is tested only under its try-lock, and re-posted before the lock is
  // dropped, so there is always exactly one header receive outstanding.
  std::unique_ptr<ReceiverConnection> accept(Device& dev) {
    if (!dev.header_lock.try_lock()) return nullptr;
    std::vector<std::byte> received;
    int source = MPI_ANY_SOURCE;
    {
      std::lock_guard<Spinlock> lock(dev.header_lock, std::adopt_lock);
      int done = 0;
      MPI_Status status;
      check(MPI_Test(&dev.header_request, &done, &status), "MPI_Test(header)");
      if (!done) return nullptr;
      int count = 0;
      check(MPI_Get_count(&status, MPI_BYTE, &count), "MPI_Get_count(header)");
      source = status.MPI_SOURCE;
      // Out of the buffer before it is re-posted for the next header.
      received.assign(dev.header_buffer.data(), dev.header_buffer.data() + count);
      post_header_receive(dev);
    }
    return parse_header(dev, source, received.data(), received.size());
  }

  // A header that does not check out is dropped and logged with its sender's rank (its
  // follow-ups, if any, are never received); nullptr then.
  std::unique_ptr<ReceiverConnection> parse_header(Device& dev, int source, const std::byte* data, std::size_t len) {
    MpiHeaderView v;
    // Follow-ups are received on the header's tag: past MPI_TAG_UB the receive would fail, and
    // on the header tag it could take the sender's next header.
    const bool ok = check_mpi_header(data, len, v);
    const bool follow_ups = ok && (v.h.zc_count != 0 || !v.piggyback());
    if (!ok || (follow_ups && (v.h.tag > tag_ub_ || v.h.tag == kHeaderTag))) {
      malformed_.fetch_add(1, std::memory_order_relaxed);
      FERRY_LOG_AT(warn, rank_, -1,
                   "MPI parcelport: dropped a malformed %zu-byte header from rank %d (is max_header the same on "
                   "every rank?)",
                   len, source);
      return nullptr;
    }
    auto c = std::make_unique<ReceiverConnection>();
    c->device = &dev;
    c->source = source;
    c->tag = v.h.tag;
    c->aggregate = v.aggregate();
    c->zc_sizes.resize(v.h.zc_count);
    for (std::size_t i = 0; i < v.h.zc_count; ++i) c->zc_sizes[i] = static_cast<std::size_t>(mpi_zc_size(v, i));
    c->nzc.reset(checked_malloc(v.h.nzc_size, "parcel receive"));
    c->nzc_size = v.h.nzc_size;
    if (v.piggyback()) {
      if (v.h.nzc_size != 0) std::memcpy(c->nzc.get(), v.nzc, v.h.nzc_size);
    } else {
      c->nzc_followup = true;
    }
    return c;
  }

  // Tests the one outstanding request and keeps posting the next chunk for as long as requests
  // complete at once, as HPX's connections do.
  Step advance(SenderConnection& c) {
    Step step = Step::idle;
    for (;;) {
      if (c.request != MPI_REQUEST_NULL) {
        int done = 0;
        check(MPI_Test(&c.request, &done, MPI_STATUS_IGNORE), "MPI_Test(send)");
        if (!done) return step;
        step = Step::progressed;
      }
      MPI_Comm comm = c.device->comm;
      if (c.nzc_followup) {
        c.nzc_followup = false;
        check(isend(c.nzc.data, c.nzc.size, c.destination, c.tag, comm, &c.request), "MPI_Isend(nzc)");
        continue;
      }
      if (c.next_zc < c.zc.size()) {
        const Chunk& z = c.zc[c.next_zc++];
        check(isend(z.data, z.size, c.destination, c.tag, comm, &c.request), "MPI_Isend(zc)");
        continue;
      }
      return Step::finished;
    }
  }

  Step advance(ReceiverConnection& c) {
    Step step = Step::idle;
    for (;;) {
      if (c.request != MPI_REQUEST_NULL) {
        int done = 0;
        check(MPI_Test(&c.request, &done, MPI_STATUS_IGNORE), "MPI_Test(recv)");
        if (!done) return step;
        step = Step::progressed;
      }
      MPI_Comm comm = c.device->comm;
      if (c.nzc_followup) {
        c.nzc_followup = false;
        check(irecv(c.nzc.get(), c.nzc_size, c.source, c.tag, comm, &c.request),
              "MPI_Irecv(nzc)");
        continue;
      }
      if (!c.zc_ready) {
        c.zc_ready = true;
        if (!allocate_zc(c)) {
          malformed_.fetch_add(1, std::memory_order_relaxed);
          // Dropped: its zero-copy follow-ups are never received.
          FERRY_LOG_AT(warn, rank_, -1, "MPI parcelport: dropped an aggregate with a malformed index from rank %d",
                       c.source);
          return Step::finished;
        }
      }
      if (c.next_zc < c.zc.size()) {
        const std::size_t i = c.next_zc++;
        check(irecv(c.zc[i].data, c.zc_sizes[i], c.source, c.tag, comm, &c.request), "MPI_Irecv(zc)");
        continue;
      }
      deliver(c);
      return Step::finished;
    }
  }

  std::vector<Chunk> allocate_checked(int source, const Chunk& nzc, const std::vector<std::size_t>& sizes) {
    std::vector<Chunk> got = upcalls_.allocate_zc_chunks(source, nzc, sizes);
    if (got.size() != sizes.size()) {
      throw Error("allocate_zc_chunks returned " + std::to_string(got.size()) + " chunks for " +
                  std::to_string(sizes.size()));
    }
    for (std::size_t i = 0; i < sizes.size(); ++i) got[i].size = sizes[i];
    return got;
  }

  // Needs the whole nzc: the upper layer reads the zc layout from it, and for an aggregate the
  // index that splits it into parcels is in there too. False when that index does not check out.
  bool allocate_zc(ReceiverConnection& c) {
    auto* base = static_cast<std::byte*>(c.nzc.get());
    const std::size_t size = c.nzc_size;
    if (!c.aggregate) {
      if (!c.zc_sizes.empty()) c.zc = allocate_checked(c.source, Chunk{base, size}, c.zc_sizes);
      return true;
    }
    std::vector<AggregatePart> index;
    if (!check_aggregate_index(base, size, c.zc_sizes.size(), index)) return false;
    c.parts.resize(index.size());
    c.zc.reserve(c.zc_sizes.size());
    std::size_t zc_at = 0;
    for (std::size_t i = 0; i < index.size(); ++i) {
      auto& part = c.parts[i];
      part.nzc = Chunk{base + index[i].nzc_offset, index[i].nzc_size};
      part.zc_count = index[i].zc_count;
      if (part.zc_count != 0) {
        std::vector<std::size_t> sizes(c.zc_sizes.begin() + static_cast<std::ptrdiff_t>(zc_at),
                                       c.zc_sizes.begin() + static_cast<std::ptrdiff_t>(zc_at + part.zc_count));
        std::vector<Chunk> got = allocate_checked(c.source, part.nzc, sizes);
        c.zc.insert(c.zc.end(), got.begin(), got.end());
      }
      zc_at += part.zc_count;
    }
    return true;
  }

  // Counted before the upcall, like the ferry parcelport, so both report the same numbers.
  void deliver(ReceiverConnection& c) {
    if (!c.aggregate) {
      Parcel p;
      p.nzc = Chunk{static_cast<std::byte*>(c.nzc.get()), c.nzc_size};
      p.zc = std::move(c.zc);
      p.nzc_storage = Buffer(c.nzc.release(), c.nzc_size, &release_free, nullptr);
      delivered_.fetch_add(1, std::memory_order_relaxed);
      upcalls_.handle_parcel(c.source, std::move(p));
      return;
    }
    if (c.parts.empty()) return;
    // Every parcel takes its reference before the first upcall, so that an upcall that throws
    // still leaves each reference with an owner that releases it.
    auto* shared = new SharedNzc{{c.parts.size()}, c.nzc.release()};
    std::vector<Parcel> parcels(c.parts.size());
    std::size_t zc_at = 0;
    for (std::size_t i = 0; i < c.parts.size(); ++i) {
      Parcel& p = parcels[i];
      p.nzc = c.parts[i].nzc;
      p.zc.assign(c.zc.begin() + static_cast<std::ptrdiff_t>(zc_at),
                  c.zc.begin() + static_cast<std::ptrdiff_t>(zc_at + c.parts[i].zc_count));
      zc_at += c.parts[i].zc_count;
      p.nzc_storage = Buffer(p.nzc.data, p.nzc.size, &release_shared, shared);
    }
    for (Parcel& p : parcels) {
      delivered_.fetch_add(1, std::memory_order_relaxed);
      upcalls_.handle_parcel(c.source, std::move(p));
    }
  }

  Upcalls& upcalls_;
  std::string kind_;
  bool aggregate_ = false;
  std::size_t max_header_ = kDefaultMaxHeader;
  int rank_ = 0;
  int size_ = 0;
  int tag_ub_ = 32767;
  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<std::unique_ptr<Destination>> destinations_;
  std::atomic<std::uint64_t> tag_counter_{0};
  std::atomic<std::uint64_t> sent_{0};
  std::atomic<std::uint64_t> delivered_{0};
  std::atomic<std::uint64_t> malformed_{0};
};

// options.kind selects the variant: "mpi", "mpi_a" (aggregation) or "mpix" (options.devices
// communicators, 0 → 2). Collective over MPI_COMM_WORLD. Throws ferry::Error when MPI cannot give
// MPI_THREAD_MULTIPLE or an option is invalid.
std::unique_ptr<Parcelport> make_mpi_parcelport(const ParcelportOptions& options, Upcalls& upcalls) {
  return std::make_unique<MpiParcelport>(options, upcalls);
}

}  // namespace
}  // namespace ferry::parcel::detail

namespace ferry::parcel {

void register_mpi_parcelports() {
  for (const char* kind : {"mpi", "mpi_a", "mpix"}) register_parcelport(kind, &detail::make_mpi_parcelport);
}

}  // namespace ferry::parcel
