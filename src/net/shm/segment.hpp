// segment.hpp — one POSIX shared-memory segment of the shm transport: a header that says what
// it is and whose it is, then its owner's receive queue (see cell_queue.hpp).
//
// Lifetime. The owner creates the segment ("/ferry-<pid>-<device>-<random hex>", so the
// launcher can remove a killed rank's leftovers by pid), peers open and map it during connect,
// and the owner unlinks the name once every peer has mapped it; the mappings live on until
// each process unmaps (destructor). A Segment is move-only and owns its mapping.
//
// Trust. Every field of a mapped segment can be written by another process at any time.
// validate() checks the header once at connect; the transport then keeps its own copy of the
// geometry and never rereads it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "net/shm/cell_queue.hpp"

namespace ferry::net::shm {

inline constexpr std::uint64_t kSegmentMagic = 0x316d6873'79727265ULL;  // the bytes "erryshm1" (little-endian)
inline constexpr std::uint32_t kSegmentVersion = 3;  // 3: claim words after the cells
// Each shared counter and the cells start on a 128-byte boundary of their own: the adjacent-line
// prefetcher fetches lines in pairs, and the producers' tail, the consumer's head and the first
// cell are written by different parties.
inline constexpr std::size_t kTailOffset = 128;   // the tail's line, apart from the read-mostly header
inline constexpr std::size_t kHeadOffset = 256;   // the consumer's shared head
inline constexpr std::size_t kCellsOffset = 384;
// The claim words follow the cells (cells * stride is a multiple of 128).
constexpr std::size_t claims_offset(std::uint64_t cells, std::size_t stride) noexcept {
  return kCellsOffset + static_cast<std::size_t>(cells) * stride;
}

struct SegmentHeader {
  std::uint64_t magic;
  std::uint32_t version;
  std::uint32_t cells_offset;
  std::int32_t owner_pid;
  std::int32_t rank;
  std::int32_t device;
  std::int32_t size;
  std::uint64_t cell_payload;
  std::uint64_t cells;
  std::uint64_t stride;
  std::uint64_t total_bytes;
  std::uint64_t probe;  // a random word peers read with process_vm_readv to detect cross-memory attach
};
static_assert(sizeof(SegmentHeader) <= kTailOffset);

// What the opener expects of a peer's segment.
struct SegmentExpect {
  int pid;
  int rank;
  int device;
  std::size_t cell_payload;
};

class Segment {
 public:
  Segment() = default;
  Segment(Segment&& o) noexcept;
  Segment& operator=(Segment&& o) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();

  // Creates, sizes and maps a new segment with an empty queue. Throws ferry::Error.
  static Segment create(int rank, int size, int device, std::size_t cell_payload, std::size_t cells);
  // Maps an existing segment read-write and checks its header against `expect`. Throws
  // ferry::Error naming the segment and what is wrong with it.
  static Segment open(const std::string& name, const SegmentExpect& expect);

  const std::string& name() const noexcept { return name_; }
  unsigned char* base() const noexcept { return base_; }
  std::size_t bytes() const noexcept { return bytes_; }
  const SegmentHeader* header() const noexcept { return reinterpret_cast<const SegmentHeader*>(base_); }
  // The queue view, from the geometry checked at create/open (never from the live header).
  CellQueue queue() const noexcept;
  std::uint64_t cells() const noexcept { return cells_; }
  // The probe word's value as seen through this mapping, and its address in this process.
  std::uint64_t probe_value() const noexcept;
  const void* probe_address() const noexcept { return base_ + offsetof(SegmentHeader, probe); }

  // Removes the name (owner only; idempotent). Errors are ignored: the name may be gone already.
  void unlink() noexcept;
  bool linked() const noexcept { return linked_; }

 private:
  void unmap() noexcept;

  std::string name_;
  unsigned char* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::uint64_t cells_ = 0;
  std::size_t stride_ = 0;
  bool linked_ = false;  // owner: the name still exists
};

// "/ferry-<pid>-": every segment of process pid starts with it (the launcher's cleanup key).
std::string segment_prefix(int pid);

}  // namespace ferry::net::shm
