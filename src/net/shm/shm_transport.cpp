// shm_transport.cpp — the shared-memory transport's setup and lifetime: parameters, the
// address, connect (each peer's segment and whether RMA to it goes by cross-memory attach or
// by copy), the copy-mode summary for ferry-info, and a peer's failure (design in
// shm_transport.hpp).
#include "net/shm/shm_transport.hpp"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdlib>
#include <cstring>

#include "common/log.hpp"
#include "ferry/error.hpp"
#include "net/util/cma.hpp"
#include "net/shm/get_slots.hpp"

namespace ferry::net {

const char* to_string(ShmCopy c) noexcept {
  switch (c) {
    case ShmCopy::automatic: return "auto";
    case ShmCopy::cma: return "cma";
    case ShmCopy::copy: return "copy";
  }
  return "?";
}

std::unique_ptr<Transport> make_shm_transport(const ShmParams& p) { return std::make_unique<shm::ShmTransport>(p); }

namespace shm {

namespace {

const ShmParams& checked(const ShmParams& p) {
  const auto bad = [](const std::string& what) { return Error("shm transport: " + what); };
  if (p.size < 1) throw bad("size " + std::to_string(p.size) + " must be at least 1");
  if (p.rank < 0 || p.rank >= p.size) {
    throw bad("rank " + std::to_string(p.rank) + " is outside [0, " + std::to_string(p.size) + ")");
  }
  if (p.device < 0) throw bad("device " + std::to_string(p.device) + " is negative");
  if (p.cell_payload < 8 || p.cell_payload > (std::size_t{1} << 24)) {
    throw bad("cell_payload " + std::to_string(p.cell_payload) + " is outside [8, 16777216] bytes");
  }
  if (p.cells < 2 || p.cells > (std::size_t{1} << 24) || (p.cells & (p.cells - 1)) != 0) {
    throw bad("cells " + std::to_string(p.cells) + " is not a power of two in [2, 16777216]");
  }
  if (p.copy != ShmCopy::automatic && p.copy != ShmCopy::cma && p.copy != ShmCopy::copy) {
    throw bad("copy mode " + std::to_string(static_cast<int>(p.copy)) + " is not auto, cma or copy");
  }
  return p;
}

// "shm1;<segment name>;<pid>;<rank>;<device>;<probe address, hex>"
struct Address {
  std::string name;
  long long pid = 0, rank = 0, device = 0;
  std::uint64_t probe = 0;
};

bool parse_address(const std::string& s, Address& a) {
  std::vector<std::string> f;
  std::size_t start = 0;
  for (;;) {
    const std::size_t semi = s.find(';', start);
    f.push_back(s.substr(start, semi == std::string::npos ? std::string::npos : semi - start));
    if (semi == std::string::npos) break;
    start = semi + 1;
  }
  if (f.size() != 6 || f[0] != "shm1") return false;
  const auto num = [](const std::string& t, int base, unsigned long long& out) {
    if (t.empty() || t.size() > 20) return false;
    char* end = nullptr;
    errno = 0;
    out = std::strtoull(t.c_str(), &end, base);
    return errno == 0 && end != nullptr && *end == '\0' && t[0] != '-';
  };
  unsigned long long pid = 0, rank = 0, device = 0, probe = 0;
  if (!num(f[2], 10, pid) || !num(f[3], 10, rank) || !num(f[4], 10, device) || !num(f[5], 16, probe)) return false;
  if (pid == 0 || pid > 0x7fffffffULL || rank > 0x7fffffffULL || device > 0x7fffffffULL) return false;
  a.name = f[1];
  a.pid = static_cast<long long>(pid);
  a.rank = static_cast<long long>(rank);
  a.device = static_cast<long long>(device);
  a.probe = probe;
  return true;
}

}  // namespace

ShmTransport::ShmTransport(const ShmParams& p)
    : rank_(checked(p).rank),
      size_(p.size),
      device_(p.device),
      cell_payload_(p.cell_payload),
      copy_(p.copy),
      own_(Segment::create(p.rank, p.size, p.device, p.cell_payload, p.cells)),
      rx_(own_.queue()),
      peers_(new Peer[static_cast<std::size_t>(p.size)]),
      gets_(new GetSlot[kGetSlots]) {
  caps_.name = "shm";
  caps_.inject_size = cell_payload_;
  caps_.max_msg_size = cell_payload_;
  caps_.max_rma_size = std::size_t{1} << 40;
  caps_.remote_data_bytes = 8;
  caps_.send_queue = 0;
  caps_.rma_virtual_address = true;
  caps_.local_registration = false;
  caps_.remote_data_consumes_recv = false;
  caps_.reports_source = true;
  caps_.gather_inject = true;
  caps_.receives = Receives::lent;  // messages are read where they lie, in their cells
  caps_.registration_pins = false;   // a registration is the range peers may attach to
  // With cross-memory attach a rendezvous reads 8-16 KiB in one copy: a ping-pong of 16 KiB is
  // 1.6 us that way against 2.4 us by gathered fragments (ferry-bench, 2 ranks); a stream is
  // even and task chains favour fragments, so only FERRY_FRAGMENT=auto acts on this. In
  // forced copy mode a get costs the target's progress.
  caps_.one_copy_get = copy_ != ShmCopy::copy;  // settled per peer by connect()
}

ShmTransport::~ShmTransport() = default;  // peers' mappings, then our own (unlinked if still linked)

std::string ShmTransport::address() const {
  char probe[32];
  std::snprintf(probe, sizeof probe, "%" PRIxPTR, reinterpret_cast<std::uintptr_t>(own_.probe_address()));
  return "shm1;" + own_.name() + ";" + std::to_string(getpid()) + ";" + std::to_string(rank_) + ";" +
         std::to_string(device_) + ";" + probe;
}

void ShmTransport::connect(const std::vector<std::string>& addresses) {
  if (addresses.size() != static_cast<std::size_t>(size_)) {
    throw Error("shm transport: connect got " + std::to_string(addresses.size()) + " addresses for a job of " +
                std::to_string(size_) + " ranks");
  }
  for (int r = 0; r < size_; ++r) {
    const std::string& text = addresses[static_cast<std::size_t>(r)];
    Peer& p = peers_[static_cast<std::size_t>(r)];
    if (text.empty()) continue;
    Address a;
    if (!parse_address(text, a)) {
      throw Error("shm transport: address of rank " + std::to_string(r) + " is malformed: \"" + text + "\"");
    }
    if (a.rank != r || a.device != device_) {
      throw Error("shm transport: address of rank " + std::to_string(r) + " names rank " + std::to_string(a.rank) +
                  " device " + std::to_string(a.device) + ": \"" + text + "\"");
    }
    p.pid = static_cast<pid_t>(a.pid);
    if (r == rank_) {
      if (a.name != own_.name() || p.pid != getpid()) {
        throw Error("shm transport: address of this rank (" + std::to_string(r) + ") is not its own: \"" + text + "\"");
      }
      p.queue = rx_;
      p.mode = copy_ == ShmCopy::copy ? Mode::copy : Mode::self;
    } else {
      p.segment = Segment::open(a.name, SegmentExpect{static_cast<int>(a.pid), r, device_, cell_payload_});
      p.queue = p.segment.queue();
      if (copy_ == ShmCopy::copy) {
        p.mode = Mode::copy;
      } else {
        const int rc = cma_probe(p.pid, a.probe, p.segment.probe_value());
        if (rc == 0) {
          p.mode = Mode::cma;
        } else if (copy_ == ShmCopy::cma) {
          throw Error("shm transport: cross-memory attach to rank " + std::to_string(r) + " (pid " +
                      std::to_string(a.pid) + ") failed: " + std::strerror(-rc) +
                      "; the copy mode 'copy' works without it");
        } else {
          FERRY_LOG(info, "shm: cross-memory attach to rank %d (pid %lld) not available (%s): copying through shared memory",
                    r, a.pid, std::strerror(-rc));
          p.mode = Mode::copy;
        }
      }
    }
  }
  // A peer whose memory cannot be read in one copy needs fragments past a packet, so the
  // transport offers one-copy gets only when every peer it reaches allows them.
  for (int r = 0; r < size_; ++r) {
    if (peers_[static_cast<std::size_t>(r)].mode == Mode::copy) caps_.one_copy_get = false;
    if (peers_[static_cast<std::size_t>(r)].mode == Mode::cma) caps_.pushed_get = true;
  }
}

void ShmTransport::connected() { own_.unlink(); }

const char* ShmTransport::copy_mode(int rank) const noexcept {
  if (rank < 0 || rank >= size_) return "none";
  switch (peers_[static_cast<std::size_t>(rank)].mode) {
    case Mode::none: return "none";
    case Mode::self: return "self";
    case Mode::cma: return "cma";
    case Mode::copy: return "copy";
  }
  return "none";
}

std::string ShmTransport::copy_summary() const {
  std::string cma, copy;
  for (int r = 0; r < size_; ++r) {
    const Mode m = peers_[static_cast<std::size_t>(r)].mode;
    std::string& list = m == Mode::cma ? cma : copy;
    if (m != Mode::cma && m != Mode::copy) continue;
    if (!list.empty()) list += ',';
    list += std::to_string(r);
  }
  if (copy.empty()) return cma.empty() ? "self" : "cma";
  if (cma.empty()) return "copy";
  return "mixed (cma: ranks " + cma + "; copy: ranks " + copy + ")";
}

bool ShmTransport::peer_alive(int rank) const noexcept {
  if (rank < 0 || rank >= size_) return false;
  const Peer& p = peers_[static_cast<std::size_t>(rank)];
  if (p.mode == Mode::none || p.pid <= 0) return false;
  return kill(p.pid, 0) == 0 || errno == EPERM;
}

void ShmTransport::peer_failed(int rank) {
  if (rank < 0 || rank >= size_) return;
  if (failed_.empty()) failed_.assign(static_cast<std::size_t>(size_), 0);
  failed_[static_cast<std::size_t>(rank)] = 1;
  try {
    failing_.push_back(Failing{rank, std::chrono::steady_clock::now() + std::chrono::milliseconds(kAbandonGraceMs)});
  } catch (...) {
    FERRY_LOG(error, "shm: out of memory recording rank %d's failure: its outstanding gets may never complete", rank);
  }
  next_abandon_check_ = {};
}

}  // namespace shm
}  // namespace ferry::net
