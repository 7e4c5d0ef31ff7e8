// ferry/runtime.hpp — the runtime, its devices, and the operations.
//
// Threading: every member function of Runtime, Device and MemoryRegion may be called by any
// number of threads at once, except construction and destruction. No call takes a
// process-wide lock; progress() never waits for another thread.
//
// Performance contract of the small-message path (post_am / post_send of up to
// Device::eager_limit() bytes, and progress delivering them): no allocation, no blocking lock,
// no system call beyond the provider's own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ferry/completion.hpp"
#include "ferry/datatype.hpp"
#include "ferry/options.hpp"
#include "ferry/status.hpp"

namespace ferry {

namespace detail {
class RuntimeImpl;
class DeviceImpl;
struct CoreAccess;
class LockModelImpl;
struct RegionImpl;
}  // namespace detail

// Names a completion object on a remote rank, by an id chosen by the application (see
// Runtime::expose), so ranks need not create objects in the same order.
struct RemoteTarget {
  std::uint16_t id = 0;
};

// What a peer needs to reach a registered region: trivially copyable, send it as bytes.
struct RemoteKey {
  std::uint64_t base = 0;   // the region's start address on its owner
  std::uint64_t size = 0;
  std::uint64_t key = 0;    // the provider's key
  std::int32_t rank = -1;   // the owner
  std::int32_t device = 0;  // the device the region was registered on
  // A region ferry allocated (Device::allocate_memory): how peers on the owner's host map it
  // (0 for a registered one).
  std::uint64_t shared = 0;
};

class MemoryRegion {
 public:
  MemoryRegion() noexcept;
  MemoryRegion(MemoryRegion&&) noexcept;
  MemoryRegion& operator=(MemoryRegion&&) noexcept;
  ~MemoryRegion();
  RemoteKey remote_key() const;
  void* data() const noexcept;
  std::size_t size() const noexcept;
  explicit operator bool() const noexcept { return impl_ != nullptr; }

 private:
  friend class detail::DeviceImpl;
  explicit MemoryRegion(std::unique_ptr<detail::RegionImpl> impl) noexcept;
  std::unique_ptr<detail::RegionImpl> impl_;
};

// Arguments of the operations. `local` is signalled when a post returned `posted`;
// `context` comes back in the Completion.
struct AmArgs {
  int rank = -1;
  const void* buffer = nullptr;
  std::size_t size = 0;
  RemoteTarget target{};
  Tag tag = 0;
  CompletionObject* local = nullptr;
  void* context = nullptr;
};

struct IoPart {
  const void* buffer = nullptr;
  std::size_t size = 0;
};

// One eager part plus several zero-copy parts in one active message.
struct AmIovecArgs {
  int rank = -1;
  IoPart eager{};
  std::vector<IoPart> parts;
  RemoteTarget target{};
  Tag tag = 0;
  CompletionObject* local = nullptr;
  void* context = nullptr;
};

struct SendArgs {
  int rank = -1;
  const void* buffer = nullptr;
  std::size_t size = 0;
  Tag tag = 0;
  CompletionObject* local = nullptr;
  void* context = nullptr;
};

struct RecvArgs {
  int rank = any_source;
  void* buffer = nullptr;
  std::size_t size = 0;
  Tag tag = any_tag;
  CompletionObject* local = nullptr;
  void* context = nullptr;
};

struct PutArgs {
  int rank = -1;
  const void* buffer = nullptr;
  std::size_t size = 0;
  RemoteKey remote{};
  std::size_t offset = 0;           // into the remote region
  CompletionObject* local = nullptr;
  void* context = nullptr;
  bool notify = false;              // also signal `notify_target` on the target rank
  RemoteTarget notify_target{};
  Tag notify_tag = 0;               // at most 0xFFFF
};

struct GetArgs {
  int rank = -1;
  void* buffer = nullptr;
  std::size_t size = 0;
  RemoteKey remote{};
  std::size_t offset = 0;
  CompletionObject* local = nullptr;
  void* context = nullptr;
};

// Remote atomics (Device::post_atomic): one read-modify-write of one naturally aligned 32- or
// 64-bit integer (or a double, for fetch_add and add) in a region registered on its owner.
//
// Atomicity. The owner performs each atomic as one sequentially consistent CPU atomic on the
// location (its progress does, when the request arrives; a post to this rank's own memory, at
// once), on every transport. So ferry atomics on one location are atomic with respect to each
// other, from any thread of any rank, and with respect to the owner's own atomic accesses to it
// (std::atomic_ref, __atomic builtins) of the same width. Plain loads and stores of the
// location, and puts and gets that cover it, are not atomic with respect to them. Atomics are
// not ordered with each other or with other operations, except that one completes only after
// it was performed.
enum class AtomicOp : std::uint8_t {
  fetch_add,     // result = old; old + operand (integers wrap)
  add,           // old + operand; nothing fetched
  swap,          // result = old; operand
  compare_swap,  // result = old; operand if old == compare
  fetch_and,     // result = old; old & operand
  fetch_or,      // result = old; old | operand
  fetch_xor,     // result = old; old ^ operand
};
const char* to_string(AtomicOp op) noexcept;

struct AtomicArgs {
  int rank = -1;            // the region's owner (remote.rank)
  RemoteKey remote{};
  std::size_t offset = 0;   // into the region: a multiple of the type's size
  AtomicOp op = AtomicOp::fetch_add;
  DataType type = DataType::u64;  // i32, u32, i64, u64; f64 for fetch_add and add
  // The values, read during the post (the caller may reuse them at once): an integer's value
  // converted to 64 bits (a 32-bit type uses the low 32), a double's bits (std::bit_cast).
  std::uint64_t operand = 0;
  std::uint64_t compare = 0;  // compare_swap: the value expected
  // Where the value before the operation goes (size_of(type) bytes, any alignment), when the
  // atomic completes; may be null (nothing written). Ferry's from the post until completion.
  void* result = nullptr;
  CompletionObject* local = nullptr;
  void* context = nullptr;
};

// What the device did so far: its lock model's work (all zero for lockless, serialized,
// trylock and block), and the messages from the wire it dropped as malformed.
struct DeviceStats {
  std::uint64_t deferred = 0;           // posts handed to another thread (lockq, offload)
  std::uint64_t combined = 0;           // calls performed on behalf of other threads (lockq, csync)
  std::uint64_t max_combined_batch = 0; // the most calls one lock holder performed in one pass
  // Packets, fragments, rendezvous requests and FINs whose bytes did not check out (each also
  // logged at `warn` with the sender's rank): dropped, never used.
  std::uint64_t malformed = 0;
  // Messages a transport handed to the device from inside its own receive callback rather
  // than through its poll (UCX, under every lock model but lockless).
  std::uint64_t delivered_inline = 0;
};

// What a device holds now (Device::footprint, Runtime::footprint): the memory that grows with
// use, and the peers it has endpoints to.
struct DeviceFootprint {
  std::size_t packets_made = 0;        // packets made so far: made on demand, up to packets_max
  std::size_t packets_max = 0;         // FERRY_PACKETS
  std::size_t packet_bytes = 0;        // bytes of the packets made (headers and payloads)
  std::size_t descriptors_made = 0;    // descriptors of posted receives made so far
  std::size_t descriptor_bytes = 0;
  // Peers with an endpoint over the device's transports: every peer at start-up, or, where a
  // transport connects on first use (FERRY_CONNECT=lazy), those operations went to so far.
  std::size_t peers_connected = 0;
  // Times the device gave its free packets' pages back (trim_memory, FERRY_TRIM_IDLE_MS), and
  // the bytes of address range it gave back in all.
  std::size_t trims = 0;
  std::size_t trimmed_bytes = 0;
};

// The runtime's footprint: each device's, and what start-up read and the keepalive connected.
struct Footprint {
  std::vector<DeviceFootprint> devices;
  std::size_t bootstrap_reads = 0;    // the runtime's own bootstrap get()s (kv_get not counted)
  // Of those, the reads of peers' addresses (the devices' and the keepalive's): at start-up,
  // and by each connect on first use since.
  std::size_t address_reads = 0;
  std::size_t keepalive_links = 0;    // peers of the keepalive's channel (its ring's links)
  // Bytes of large receive buffers the process keeps for reuse now (FERRY_RECV_CACHE; one
  // cache per process, whichever runtime filled it).
  std::size_t recv_cache_bytes = 0;
};

class Device {
 public:
  [[nodiscard]] Status post_am(const AmArgs& args);
  [[nodiscard]] Status post_am_iovec(const AmIovecArgs& args);
  [[nodiscard]] Status post_send(const SendArgs& args);
  [[nodiscard]] Status post_recv(const RecvArgs& args);
  [[nodiscard]] Status post_put(const PutArgs& args);
  [[nodiscard]] Status post_get(const GetArgs& args);
  // A remote atomic (AtomicArgs): done when it was performed in the post (`result` written,
  // nothing signalled): the region is this rank's, or one a peer on this host allocated
  // (allocate_memory) and this process maps; posted, when the request went to the owner, whose
  // progress performs it: then `local` is signalled once with OpKind::atomic, the rank,
  // size_of(type) and `context`, and error 0, -EFAULT (the owner has no such region: it was
  // freed) or peer_failed_error (the owner failed first: `result` is not written and the
  // atomic may or may not have been performed); retry when the device is short of packets or
  // credits; failed when the owner had failed.
  // Throws ferry::Error naming the argument for an operation the type does not take, an
  // offset out of the region or not aligned, or a key of another rank or device.
  [[nodiscard]] Status post_atomic(const AtomicArgs& args);
  // Polls the network once. True if anything happened. Returns false at once when another
  // thread is polling this device.
  bool progress();

  // Registers [data, data+size) for RMA through this device.
  MemoryRegion register_memory(void* data, std::size_t size);
  // Allocates `size` bytes (zeroed, page-aligned) for RMA and atomics and registers them like
  // register_memory; freed when the region goes (MemoryRegion::data is the memory). Peers on
  // this rank's host map them: their atomics on it are CPU atomics performed in the post
  // (`done`, no message), on every transport. Throws ferry::Error naming the size when the
  // system refuses the memory.
  MemoryRegion allocate_memory(std::size_t size);

  int index() const noexcept;
  DeviceStats stats() const noexcept;
  DeviceFootprint footprint() const noexcept;
  // Gives the memory of the device's free packets back to the system and returns its bytes:
  // the pages inside their payloads, which fault in again (as zeros) when next used. For a
  // device at rest, between an application's phases say: packets taken meanwhile may be made
  // anew. Returns 0 and changes nothing where one of the device's transports pins registered
  // memory (verbs-style providers, UCX), as the packets' slab is registered with each. Any
  // thread; not on the fast path (a system call per free packet).
  std::size_t trim_memory();
  // Largest post_am / post_send that goes eagerly (larger ones use rendezvous).
  std::size_t eager_limit() const noexcept;
  // Largest eager part of a post_am_iovec with `parts` zero-copy parts.
  std::size_t iovec_eager_limit(std::size_t parts) const noexcept;

 private:
  friend class detail::RuntimeImpl;
  friend struct detail::CoreAccess;  // core/extension.cpp: the layers above the core reach the device
  Device(detail::DeviceImpl* impl, detail::LockModelImpl* lock_model) noexcept : impl_(impl), lock_model_(lock_model) {}
  detail::DeviceImpl* impl_;
  // The lock model in force (FERRY_LOCK_MODEL), or null for lockless and serialized: calls
  // then go straight to impl_. Both are owned by the runtime.
  detail::LockModelImpl* lock_model_;
};

// RAII registration of a remote target id; unregisters on destruction.
class Exposure {
 public:
  Exposure() noexcept = default;
  Exposure(Exposure&& other) noexcept : rt_(other.rt_), id_(other.id_) { other.rt_ = nullptr; }
  Exposure& operator=(Exposure&& other) noexcept;
  Exposure(const Exposure&) = delete;
  Exposure& operator=(const Exposure&) = delete;
  ~Exposure();
  RemoteTarget target() const noexcept { return {id_}; }

 private:
  friend class Runtime;
  Exposure(detail::RuntimeImpl* rt, std::uint16_t id) noexcept : rt_(rt), id_(id) {}
  detail::RuntimeImpl* rt_ = nullptr;
  std::uint16_t id_ = 0;
};

class Runtime {
 public:
  // Collective over all ranks of the job: bootstraps, opens the provider, exchanges addresses.
  explicit Runtime(const RuntimeOptions& options = {});
  // Collective: drains this rank's operations, waits for all ranks, then closes. After it,
  // every call on the runtime or its devices throws ferry::Error. When a peer has failed it
  // still closes this rank (without waiting for the dead) and then throws ferry::PeerFailed
  // naming the rank; the destructor's own finalize swallows that.
  void finalize();
  // Finalizes if finalize() was not called.
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int rank() const noexcept;
  int size() const noexcept;
  int device_count() const noexcept;
  Device& device(int index = 0);
  // The libfabric provider the ofi backend uses, or "none" when no peer is reached through it.
  std::string provider() const;
  // The backends device 0 uses: "shm", "ofi/tcp;ofi_rxm", or "shm+ofi/tcp;ofi_rxm" when ranks
  // on this host talk through shared memory and the others through libfabric.
  std::string transport() const;
  // How device 0 reaches `rank`: the backend, and for UCX the transports it picked for that
  // peer ("ucx: sysv/memory (am,am_bw); posix/memory (); cma/memory (rma_bw)").
  std::string transport_of(int rank) const;
  std::string bootstrap() const;
  // The core's options in force (runtime_option_table() in options.hpp), typed
  // (`options().settings.lock_model`) and as text with their source (`options().value("progress")`).
  const Resolved<RuntimeSettings>& options() const noexcept;

  // Makes `object` reachable from every rank as RemoteTarget{id}. Messages that arrive for an
  // id before it is exposed wait for it. Throws if id is taken or >= FERRY_MAX_TARGETS.
  [[nodiscard]] Exposure expose(CompletionObject& object, std::uint16_t id);

  // Collective and blocking: returns when every rank has called it. Operations this rank
  // posted before it are performed (not necessarily completed) first. Progresses every device
  // of this rank while it waits, so peers waiting on this rank's progress are served. One
  // thread per rank at a time. Throws ferry::PeerFailed naming the rank when a peer has failed
  // (before or while waiting): a barrier cannot complete without every rank. Throws
  // ferry::Error when called from inside device 0's progress (a Handler's callback, say): the
  // barrier's steps arrive through that progress, so the wait could never end.
  void barrier();
  // The ranks this process knows to have failed, ascending (empty when all are well).
  //
  // Peer failure. A peer fails when its process dies (crash, SIGKILL, exit without finalize)
  // or its transport reports it unreachable. Every rank learns of it within a bound
  // (FERRY_PEER_CHECK_MS for ranks on its host, whose processes it watches; at once on a
  // connection error for the others). Then, on every device, as progress() runs:
  //  - every pending operation to or from that rank (a send or rendezvous awaiting its
  //    receiver, a receive naming that rank, a put or get) signals its completion object once
  //    with Completion::error == peer_failed_error and Completion::rank == the rank;
  //  - a new post naming that rank returns Status failed (kind failed, rank set) and signals
  //    nothing; a receive from any_source still matches the other ranks' messages, and
  //    messages that arrived from the rank before it failed are still delivered;
  //  - barrier() and finalize() throw ferry::PeerFailed;
  //  - traffic among the surviving ranks goes on unchanged.
  std::vector<int> failed_ranks() const;
  // Every device's footprint, the runtime's bootstrap reads so far and the keepalive's links.
  Footprint footprint() const;
  // Device::trim_memory on every device, and frees the process's cache of large receive
  // buffers (FERRY_RECV_CACHE: blocks kept for reuse, each faulted in again when next made);
  // the bytes given back.
  std::size_t trim_memory();
  // How many ranks this process knows to have failed: one relaxed load, for polling.
  std::uint32_t failure_count() const noexcept;
  // Bootstrap key-value exchange, for setup (e.g. sending RemoteKeys). Any thread, one call at a
  // time: the runtime's connects on first use share the bootstrap, so while this rank is inside
  // kv_fence it connects no new peer (an operation to one answers retry until the fence returns).
  void kv_put(const std::string& key, const std::string& value);
  void kv_fence();
  std::string kv_get(int rank, const std::string& key);

 private:
  friend struct detail::CoreAccess;  // core/extension.cpp: the layers above the core reach the runtime
  std::unique_ptr<detail::RuntimeImpl> impl_;
};

// Free-function spelling of Device::progress, for symmetry with the post calls.
inline bool progress(Device& device) { return device.progress(); }

// ferry's version, e.g. "0.1.0".
const char* version() noexcept;

}  // namespace ferry

// The tool calls this header declared before (ProviderLimits, probe_provider, ...) are in
// ferry/tools.hpp, deprecated there; included here for one release, so code that found them
// here still builds.
#include "ferry/tools.hpp"
