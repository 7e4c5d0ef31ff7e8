// mpi_parcelport_impl.hpp — the MPI baseline parcelports' private declarations: MpiParcelport,
// its communicators (Device: header receive and connection deques) and the connections that
// carry one parcel (or one mpi_a aggregate) each, and the MPI helpers every file uses.
// A connection belongs to whichever thread popped it from its deque (or made it), and only
// that thread tests its request; a device's header request is tested only under header_lock.
// The member functions live with what they own:
//   mpi_parcelport.cpp           MPI initialization, the communicators' set-up and teardown,
//                                registration of the three variants
//   mpi_parcelport_send.cpp      the send path: header encoding, mpi_a aggregation, sender connections
//   mpi_parcelport_recv.cpp      the receive path: the header receive, header decoding, receiver
//                                connections, zero-copy allocation, delivery
//   mpi_parcelport_progress.cpp  background_work (which communicator a thread works on), barrier
// The wire format is mpi_header.hpp's.
//
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
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ferry/parcel.hpp"

namespace ferry::parcel::detail {

inline constexpr int kHeaderTag = 0;
inline constexpr std::size_t kDefaultMaxHeader = 512;

// Throws ferry::Error naming `what` and MPI's message when rc is not MPI_SUCCESS.
void check(int rc, const char* what);

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

// malloc of at least one byte (non-null even for an empty nzc); throws ferry::Error naming `what`.
void* checked_malloc(std::size_t size, const char* what);

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

class MpiParcelport final : public Parcelport {
 public:
  MpiParcelport(const ParcelportOptions& options, Upcalls& upcalls);
  ~MpiParcelport() override;

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::string name() const override { return kind_; }
  std::string transport() const override { return "mpi"; }

  void send(int destination, Parcel&& parcel, SentCallback on_sent) override;
  bool background_work() override;
  void barrier() override;

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

  // mpi_parcelport_send.cpp
  int next_tag() noexcept;
  void start_send(Device& dev, int destination, Chunk nzc, std::vector<Chunk> zc, std::uint32_t flags,
                  std::vector<SentCallback> callbacks, std::unique_ptr<void, FreeDeleter> owned);
  void enqueue(int destination, Parcel&& parcel, SentCallback&& on_sent);
  std::vector<Pending> take_batch(Destination& d);
  void send_batch(int destination, std::vector<Pending> batch);
  Step advance(SenderConnection& c);

  // mpi_parcelport_recv.cpp
  void post_header_receive(Device& dev);
  std::unique_ptr<ReceiverConnection> accept(Device& dev);
  std::unique_ptr<ReceiverConnection> parse_header(Device& dev, int source, const std::byte* data, std::size_t len);
  Step advance(ReceiverConnection& c);
  std::vector<Chunk> allocate_checked(int source, const Chunk& nzc, const std::vector<std::size_t>& sizes);
  bool allocate_zc(ReceiverConnection& c);
  void deliver(ReceiverConnection& c);

  // mpi_parcelport_progress.cpp
  bool work(Device& dev);

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

}  // namespace ferry::parcel::detail
