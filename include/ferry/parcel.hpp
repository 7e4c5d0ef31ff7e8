// ferry/parcel.hpp — the parcel layer: what an AMT runtime needs from communication.
//
// A parcel is one nonzero-copy chunk (serialized metadata and small arguments) plus any number
// of zero-copy chunks (large arguments). send() may be called by any thread; it never blocks
// and never fails for lack of resources (the parcelport queues what it cannot start yet).
// Idle threads call background_work(). Delivery is by upcall:
//
//   sender                                      receiver
//   send(dest, parcel, on_sent) ──header──────▶ (nzc piggybacked if it fits)
//                               ──nzc chunk──▶ allocate_zc_chunks(source, nzc, sizes)
//                               ──zc chunks──▶ handle_parcel(source, parcel)
//   on_sent() once every chunk has left
//
// Chunks of one parcel travel in order; different parcels travel concurrently. Every parcel is
// delivered exactly once and on_sent is called exactly once per parcel.
//
// Implementations (ParcelportOptions::kind):
//   ferry  header by active message into a completion queue, follow-ups by tagged send/recv
//          (or one iovec active message with `iovec`), one device per thread, no lock on the
//          message path.
// The MPI kinds are the baseline ferry is measured against, in the separate ferry::parcel_mpi
// library (parcel_mpi.hpp; see "Choosing a parcelport by name" below):
//   mpi    HPX's MPI parcelport: MPI_THREAD_MULTIPLE, header tag 0 with one pre-posted
//          MPI_Irecv(ANY_SOURCE), per-parcel tags, connection deques under try-locks, one
//          connection advanced per background_work() with MPI_Test.
//   mpi_a  mpi with aggregation: per-destination parcel queues, merged by the sender.
//   mpix   mpi with several duplicated communicators and a static thread→communicator map.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ferry/completion.hpp"
#include "ferry/options.hpp"

namespace ferry::parcel {

struct Chunk {
  std::byte* data = nullptr;
  std::size_t size = 0;
};

struct Parcel {
  Chunk nzc;
  std::vector<Chunk> zc;
  // On the receiving side: owns the memory behind `nzc` (the caller may keep it or drop it).
  // On the sending side: unused; the sender keeps its chunks alive until on_sent.
  ferry::Buffer nzc_storage;
  // On the receiving side, when the parcelport allocated the zero-copy chunks itself (the
  // ferry parcelport's iovec mode): owns the memory behind `zc`, and allocate_zc_chunks was
  // not called. Empty otherwise.
  std::vector<ferry::Buffer> zc_storage;
};

// Provided by the layer above; called from inside background_work(), on any thread.
class Upcalls {
 public:
  virtual ~Upcalls() = default;
  // Receiver: return one destination buffer per zero-copy chunk, of exactly zc_sizes[i] bytes.
  // The buffers belong to the layer above; they are handed back in handle_parcel(). Returning
  // another number of chunks is a contract violation: that parcel is dropped and the
  // background_work() call that made the upcall throws ferry::Error naming both counts.
  virtual std::vector<Chunk> allocate_zc_chunks(int source, const Chunk& nzc,
                                                const std::vector<std::size_t>& zc_sizes) = 0;
  virtual void handle_parcel(int source, Parcel&& parcel) = 0;

  // Peer failure (ferry::Runtime::failed_ranks; the MPI parcelports never report one: MPI ends
  // the job). All three are called from inside background_work(), on any thread.
  // `rank` failed: called once per failed rank, as soon as the parcelport learns of it.
  virtual void peer_failed(int rank) { (void)rank; }
  // A parcel to `destination` could not be delivered (`error`: ferry::peer_failed_error when
  // the destination failed). Called once for that parcel; its on_sent is still called after.
  virtual void send_failed(int destination, int error) { (void)destination, (void)error; }
  // A parcel from `source` could not be completed (`error` as above): it never reaches
  // handle_parcel. `parcel` holds what was received or allocated for it, zero-copy chunks from
  // allocate_zc_chunks included, so the layer above can free them.
  virtual void receive_failed(int source, Parcel&& parcel, int error) { (void)source, (void)parcel, (void)error; }
};

using SentCallback = std::function<void()>;

// Memory this rank exposed for one-sided reads (Parcelport::expose_memory); deregistered when
// destroyed, which must happen before the parcelport is destroyed.
class ExposedMemory {
 public:
  virtual ~ExposedMemory() = default;
  // What another rank passes to Parcelport::get to read this region: send it as it is.
  virtual const std::vector<std::byte>& key() const noexcept = 0;
};

// get()'s completion: 0, or a ferry error code (ferry::peer_failed_error when the rank failed).
using GetCallback = std::function<void(int error)>;

struct ParcelportOptions {
  std::string kind = "ferry";     // ferry, mpi, mpi_a, mpix
  int devices = 0;                // ferry: devices (0: FERRY_DEVICES); mpix: communicators (0: 2)
  int header_recvs = 0;           // ferry with FERRY_HEADER=sendrecv: pre-posted header receives per device (0: 4)
  bool iovec = false;             // ferry: follow-ups as one iovec active message
  std::size_t max_header = 0;     // bytes of header incl. piggybacked nzc (0: the parcelport's eager limit)
  // The ferry parcelport's design space (parcel::option_table(); empty: environment, else default).
  std::string header{};          // am, sendrecv
  std::string device_polling{};  // local, random, global
  std::string parcel_queues{};   // shared, device
};

enum class HeaderPrimitive : std::uint8_t { am, sendrecv };
enum class DevicePolling : std::uint8_t { local, random, global };
enum class ParcelQueues : std::uint8_t { shared, device };

// The parcel layer's options, resolved and typed. FERRY_PROGRESS and FERRY_COMPLETION are the
// core's (Runtime::options()): the parcelport carries out their explicit, implicit, steal and
// sync values on the core's resolved settings.
struct Settings {
  HeaderPrimitive header = HeaderPrimitive::am;
  DevicePolling device_polling = DevicePolling::local;
  ParcelQueues parcel_queues = ParcelQueues::shared;
};

using ParcelOptionTable = OptionTable<ParcelportOptions, Settings>;

// The parcel layer's table, in declaration order.
const ParcelOptionTable& option_table();

class Parcelport {
 public:
  virtual ~Parcelport() = default;
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  virtual std::string name() const = 0;
  // What carries the parcels: the core runtime's transports for the ferry parcelport ("shm",
  // "ofi/tcp;ofi_rxm", ...), the MPI library for the baselines.
  virtual std::string transport() const = 0;
  // Any thread. `parcel`'s chunks must stay valid until on_sent runs.
  // Throws ferry::Error for an invalid destination, an oversize header, or a chunk with a size
  // but no data.
  virtual void send(int destination, Parcel&& parcel, SentCallback on_sent) = 0;
  // Any thread, typically idle workers. True if anything progressed.
  virtual bool background_work() = 0;
  // The layer above's worker threads report when they start (true) and finish (false) running a
  // task, outermost task only. A parcelport that steals progress (FERRY_PROGRESS=steal) uses it
  // to tell a device whose owners are all busy from one that is attended; others ignore it.
  // Called from the worker itself; must be cheap and never block.
  virtual void worker_busy(bool busy) noexcept { (void)busy; }
  // Collective; keeps progressing while it waits. For setup and teardown only.
  virtual void barrier() = 0;
  // Parcels sent / delivered so far by this rank (for termination detection).
  virtual std::uint64_t parcels_sent() const noexcept = 0;
  virtual std::uint64_t parcels_delivered() const noexcept = 0;
  // Headers from the wire this rank dropped as malformed (each also logged with its sender's
  // rank at FERRY_LOG=warn). A parcelport that checks nothing reports 0.
  virtual std::uint64_t parcels_malformed() const noexcept { return 0; }

  // One-sided reads, for the layer above's gets of remote data (a block-sparse multiply's
  // blocks). True when this parcelport reads remote memory without the owner's CPU (ferry: the
  // core's RMA get); the MPI baselines have none, and the layer above reads with messages.
  virtual bool has_get() const noexcept { return false; }
  // Registers [data, data + size) for get() by the other ranks. Any thread. Throws
  // ferry::Error when this parcelport has no get, or the registration fails.
  virtual std::unique_ptr<ExposedMemory> expose_memory(void* data, std::size_t size);
  // Reads `size` bytes at `offset` of `rank`'s region named by `key` into `dst`, which must stay
  // valid until `done` runs. `done` runs exactly once: inside get() or a later
  // background_work(), on any thread. Any thread; never blocks; a get the network cannot take
  // now is queued. Throws ferry::Error for a rank out of range, a key that is not a key of
  // `rank` from this kind of parcelport, or a range outside the region.
  virtual void get(int rank, const std::vector<std::byte>& key, std::size_t offset, void* dst, std::size_t size,
                   GetCallback done);
};

// ---- Choosing a parcelport by name (FERRY_PARCELPORT, ParcelportOptions::kind) ----------------
//
// make_parcelport looks the kind up in a registry of names. "ferry" is always there. The MPI
// baselines live in their own library, so that this one does not depend on MPI: a program that
// wants them links ferry::parcel_mpi (pkg-config ferry-parcel-mpi) and calls
// ferry::parcel::register_mpi_parcelports() (ferry/parcel_mpi.hpp) before it asks for one.
// Registration is an explicit call, not a static initialiser: the call is what makes the linker
// keep the library, and the registry is complete before anyone reads it.

// Makes a parcelport of options.kind (the name it was registered under); collective, like the
// parcelports' constructors.
using ParcelportFactory = std::unique_ptr<Parcelport> (*)(const ParcelportOptions& options, Upcalls& upcalls);

// Adds `name` to the registry. Any thread. Registering the same factory under the same name
// again does nothing, so register functions may be called more than once. Throws ferry::Error
// for an empty name, a null factory, or a name already registered with another factory.
void register_parcelport(const std::string& name, ParcelportFactory factory);

// The names make_parcelport accepts in this process, in registration order ("ferry" first).
std::vector<std::string> parcelport_kinds();

// Throws ferry::Error for a kind that is not registered, naming FERRY_PARCELPORT and the value
// and listing the registered kinds; for an MPI baseline kind it also says how to get it.
std::unique_ptr<Parcelport> make_parcelport(const ParcelportOptions& options, Upcalls& upcalls);

// Which device or communicator the calling thread uses: set by the runtime for its workers;
// threads that never set it get one round-robin on first use.
void set_thread_index(int index) noexcept;
int thread_index() noexcept;

}  // namespace ferry::parcel
