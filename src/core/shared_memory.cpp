#include "core/shared_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>

#include "ferry/error.hpp"

namespace ferry::detail {

namespace {

// RemoteKey::shared: the owner's pid (22 bits), the region's number in its process (22 bits,
// so a new region at a freed one's address, with its descriptor number, still differs) and its
// descriptor (20 bits). 0 when a pid or descriptor does not fit: the region is then reached by
// message only.
constexpr int kPidBits = 22, kSerialBits = 22, kFdBits = 20;
std::uint64_t encode_shared(std::uint64_t pid, std::uint64_t serial, std::uint64_t fd) {
  if (pid >= (1u << kPidBits) || fd >= (1u << kFdBits)) return 0;
  return pid << (kSerialBits + kFdBits) | (serial & ((1u << kSerialBits) - 1)) << kFdBits | fd;
}
std::uint64_t shared_pid(std::uint64_t s) { return s >> (kSerialBits + kFdBits); }
std::uint64_t shared_serial(std::uint64_t s) { return (s >> kFdBits) & ((1u << kSerialBits) - 1); }
std::uint64_t shared_fd(std::uint64_t s) { return s & ((1u << kFdBits) - 1); }

std::atomic<std::uint64_t> next_serial{1};

std::string region_name(int rank, std::uint64_t serial, std::uint64_t base, std::uint64_t size) {
  char name[128];
  std::snprintf(name, sizeof name, "ferry-region-%d-%" PRIu64 "-%" PRIx64 "-%" PRIu64, rank, serial, base, size);
  return name;
}

std::size_t page_round(std::size_t size) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return (size + page - 1) / page * page;
}

}  // namespace

SharedBlock allocate_shared(std::size_t size, int rank) {
  SharedBlock b;
  b.size = size;
  const std::size_t bytes = page_round(size);
  // The name is set once the address is known: a memfd is named at creation, so a first one
  // reserves the address and the named one replaces its mapping there.
  const int scratch = ::memfd_create("ferry-region", MFD_CLOEXEC);
  if (scratch < 0) throw Error(std::string("allocate_memory: memfd_create: ") + std::strerror(errno));
  if (::ftruncate(scratch, static_cast<off_t>(bytes)) != 0) {
    const int e = errno;
    ::close(scratch);
    throw Error("allocate_memory: size=" + std::to_string(size) + ": ftruncate: " + std::strerror(e));
  }
  void* at = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, scratch, 0);
  ::close(scratch);
  if (at == MAP_FAILED) throw Error("allocate_memory: size=" + std::to_string(size) + ": mmap: " + std::strerror(errno));
  // Relaxed: a count that names regions, it orders nothing.
  const std::uint64_t serial = next_serial.fetch_add(1, std::memory_order_relaxed) & ((1u << kSerialBits) - 1);
  const std::string name = region_name(rank, serial, reinterpret_cast<std::uint64_t>(at), size);
  const int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      ::mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
    const int e = errno;
    if (fd >= 0) ::close(fd);
    ::munmap(at, bytes);
    throw Error("allocate_memory: size=" + std::to_string(size) + ": " + std::strerror(e));
  }
  b.data = at;
  b.fd = fd;
  b.shared = encode_shared(static_cast<std::uint64_t>(::getpid()), serial, static_cast<std::uint64_t>(fd));
  return b;
}

void free_shared(const SharedBlock& b) noexcept {
  if (b.data != nullptr) ::munmap(b.data, page_round(b.size));
  if (b.fd >= 0) ::close(b.fd);
}

PeerMappings::~PeerMappings() {
  for (const auto& e : entries_) {
    if (e->mapped != nullptr) ::munmap(e->mapped, page_round(e->size));
  }
}

unsigned char* PeerMappings::find_slow(const RemoteKey& k) noexcept {
  std::lock_guard<std::mutex> guard(mutex_);
  std::size_t of_rank = 0;
  for (const auto& e : entries_) {
    if (e->rank != k.rank) continue;
    ++of_rank;
    if (e->shared == k.shared && e->base == k.base && e->size == k.size) {
      slots_[static_cast<std::size_t>(k.rank)].store(e.get(), std::memory_order_release);
      return e->mapped;
    }
  }
  if (of_rank >= kMaxPerRank) return nullptr;
  auto e = std::make_unique<Entry>(Entry{k.rank, k.shared, k.base, k.size, nullptr});
  const std::string path = "/proc/" + std::to_string(shared_pid(k.shared)) + "/fd/" + std::to_string(shared_fd(k.shared));
  const std::string want = "/memfd:" + region_name(k.rank, shared_serial(k.shared), k.base, k.size);
  char link[256];
  const ssize_t n = ::readlink(path.c_str(), link, sizeof link - 1);
  if (n > 0) {
    link[n] = '\0';
    // readlink shows a memfd as "/memfd:NAME (deleted)".
    if (std::strncmp(link, want.c_str(), want.size()) == 0 && (link[want.size()] == '\0' || link[want.size()] == ' ')) {
      const int f = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
      struct stat st {};
      if (f >= 0 && ::fstat(f, &st) == 0 && static_cast<std::uint64_t>(st.st_size) >= k.size) {
        void* at = ::mmap(nullptr, page_round(k.size), PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
        if (at != MAP_FAILED) e->mapped = static_cast<unsigned char*>(at);
      }
      if (f >= 0) ::close(f);
    }
  }
  unsigned char* mapped = e->mapped;
  slots_[static_cast<std::size_t>(k.rank)].store(e.get(), std::memory_order_release);
  entries_.push_back(std::move(e));
  return mapped;
}

}  // namespace ferry::detail
