// segment.cpp — creating, opening, checking and removing shm transport segments.
#include "net/shm/segment.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

#include "ferry/error.hpp"

namespace ferry::net::shm {

namespace {

std::string errno_text(int e) { return std::string(std::strerror(e)) + " (" + std::to_string(e) + ")"; }

std::uint64_t random_word() {
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
}

std::size_t total_bytes(std::size_t cells, std::size_t stride) {
  return claims_offset(cells, stride) + CellQueue::claims_bytes(cells);
}

}  // namespace

std::string segment_prefix(int pid) { return "/ferry-" + std::to_string(pid) + "-"; }

Segment::Segment(Segment&& o) noexcept
    : name_(std::move(o.name_)), base_(std::exchange(o.base_, nullptr)), bytes_(std::exchange(o.bytes_, 0)),
      cells_(o.cells_), stride_(o.stride_), linked_(std::exchange(o.linked_, false)) {}

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    unmap();
    name_ = std::move(o.name_);
    base_ = std::exchange(o.base_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    cells_ = o.cells_;
    stride_ = o.stride_;
    linked_ = std::exchange(o.linked_, false);
  }
  return *this;
}

Segment::~Segment() { unmap(); }

void Segment::unmap() noexcept {
  if (base_ != nullptr) munmap(base_, bytes_);
  base_ = nullptr;
  bytes_ = 0;
  unlink();
}

void Segment::unlink() noexcept {
  if (!linked_) return;
  shm_unlink(name_.c_str());
  linked_ = false;
}

CellQueue Segment::queue() const noexcept {
  return CellQueue(reinterpret_cast<std::atomic<std::uint64_t>*>(base_ + kTailOffset),
                   reinterpret_cast<std::atomic<std::uint64_t>*>(base_ + kHeadOffset), base_ + kCellsOffset,
                   reinterpret_cast<std::atomic<std::uint64_t>*>(base_ + claims_offset(cells_, stride_)), cells_, stride_);
}

std::uint64_t Segment::probe_value() const noexcept {
  // Written once by the owner before the name was handed out; read as a plain word.
  std::uint64_t v;
  std::memcpy(&v, base_ + offsetof(SegmentHeader, probe), sizeof v);
  return v;
}

Segment Segment::create(int rank, int size, int device, std::size_t cell_payload, std::size_t cells) {
  const std::size_t stride = CellQueue::stride_for(cell_payload);
  const std::size_t bytes = total_bytes(cells, stride);
  const int pid = static_cast<int>(getpid());
  Segment s;
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(random_word()));
    s.name_ = segment_prefix(pid) + std::to_string(device) + "-" + hex;
    fd = shm_open(s.name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) throw Error("shm_open(\"" + s.name_ + "\") failed: " + errno_text(errno));
  s.linked_ = true;  // from here on the destructor removes the name if anything below throws
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int e = errno;
    close(fd);
    throw Error("ftruncate of shm segment \"" + s.name_ + "\" to " + std::to_string(bytes) + " bytes failed: " +
                errno_text(e) + " (is /dev/shm large enough?)");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  close(fd);
  if (p == MAP_FAILED) throw Error("mmap of shm segment \"" + s.name_ + "\" failed: " + errno_text(e));
  s.base_ = static_cast<unsigned char*>(p);
  s.bytes_ = bytes;
  s.cells_ = cells;
  s.stride_ = stride;

  auto* h = new (s.base_) SegmentHeader{};
  h->magic = kSegmentMagic;
  h->version = kSegmentVersion;
  h->cells_offset = static_cast<std::uint32_t>(kCellsOffset);
  h->owner_pid = pid;
  h->rank = rank;
  h->device = device;
  h->size = size;
  h->cell_payload = cell_payload;
  h->cells = cells;
  h->stride = stride;
  h->total_bytes = bytes;
  h->probe = random_word() | 1;  // never 0, so a read of zeroed memory cannot pass the probe
  CellQueue::initialize(s.base_ + kTailOffset, s.base_ + kHeadOffset, s.base_ + kCellsOffset,
                        s.base_ + claims_offset(cells, stride), cells, stride, /*zeroed=*/true);
  // Peers learn the name only through the bootstrap's exchange, which orders these writes
  // before their mapping (a system call and a message in between).
  return s;
}

Segment Segment::open(const std::string& name, const SegmentExpect& expect) {
  const auto bad = [&](const std::string& what) {
    return Error("shm segment \"" + name + "\" of rank " + std::to_string(expect.rank) + " is not usable: " + what);
  };
  if (name.rfind("/ferry-", 0) != 0 || name.size() > 200 || name.find('/', 1) != std::string::npos) {
    throw bad("not a ferry segment name");
  }
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) throw bad("shm_open failed: " + errno_text(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    close(fd);
    throw bad("fstat failed: " + errno_text(e));
  }
  const auto bytes = static_cast<std::size_t>(st.st_size);
  if (bytes < kCellsOffset) {
    close(fd);
    throw bad("only " + std::to_string(bytes) + " bytes, smaller than a header");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  close(fd);
  if (p == MAP_FAILED) throw bad("mmap failed: " + errno_text(e));
  Segment s;
  s.name_ = name;
  s.base_ = static_cast<unsigned char*>(p);
  s.bytes_ = bytes;  // unmapped by ~Segment if a check below throws

  // One snapshot of the header; everything below checks the copy, not the live memory.
  SegmentHeader h;
  std::memcpy(&h, s.base_, sizeof h);
  if (h.magic != kSegmentMagic) throw bad("wrong magic number (not a ferry shm segment)");
  if (h.version != kSegmentVersion) {
    throw bad("version " + std::to_string(h.version) + ", this ferry speaks " + std::to_string(kSegmentVersion));
  }
  if (h.owner_pid != expect.pid) {
    throw bad("owned by pid " + std::to_string(h.owner_pid) + ", its address says " + std::to_string(expect.pid));
  }
  if (h.rank != expect.rank) throw bad("belongs to rank " + std::to_string(h.rank));
  if (h.device != expect.device) {
    throw bad("belongs to device " + std::to_string(h.device) + ", expected " + std::to_string(expect.device));
  }
  if (h.cell_payload != expect.cell_payload) {
    throw bad("cell payload " + std::to_string(h.cell_payload) + " bytes, this process uses " +
              std::to_string(expect.cell_payload) + " (all ranks must use the same packet size)");
  }
  if (h.cells < 2 || h.cells > (std::uint64_t{1} << 24) || (h.cells & (h.cells - 1)) != 0) {
    throw bad("cell count " + std::to_string(h.cells) + " is not a power of two in [2, 2^24]");
  }
  if (h.cells_offset != kCellsOffset || h.stride != CellQueue::stride_for(h.cell_payload) ||
      h.total_bytes != total_bytes(h.cells, h.stride) || h.total_bytes > bytes) {
    throw bad("inconsistent geometry (stride " + std::to_string(h.stride) + ", " + std::to_string(h.total_bytes) +
              " of " + std::to_string(bytes) + " bytes)");
  }
  s.cells_ = h.cells;
  s.stride_ = h.stride;
  return s;
}

}  // namespace ferry::net::shm
