// backend.cpp — the shared-memory backend's registration (built into libferry): ranks of one
// host, through segments of its own (shm_transport.hpp), and its facts for ferry-info.
#include <fstream>
#include <string>

#include "common/queue_support.hpp"
#include "net/backend.hpp"
#include "net/util/cma.hpp"
#include "net/shm/shm_transport.hpp"

namespace ferry::net {

namespace {

// The kernel's transparent huge page mode ("always", "madvise", "never"), or "" when unknown.
std::string thp_mode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(f, line)) return "";
  const auto open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return "";
  return line.substr(open + 1, close - open - 1);
}

// "cma" or "copy (...)", then what the pushed rendezvous gets from the kernel: receive blocks
// from FERRY_RECV_HUGE on are advised onto 2 MiB pages, which only "always" or "madvise" grant.
std::string large_data_path() {
  std::string out = describe_cma();
  const std::string thp = thp_mode();
  if (thp == "always" || thp == "madvise") {
    out += "; transparent huge pages: " + thp + " (large receive blocks on 2 MiB pages, FERRY_RECV_HUGE)";
  } else if (!thp.empty()) {
    out += "; transparent huge pages: " + thp + " (large receive blocks stay on 4 KiB pages: pushed rendezvous gain little)";
  }
  return out;
}

class ShmBackend final : public Backend {
 public:
  // The rows of options.cpp: shm_copy's names follow ShmCopy's values.
  explicit ShmBackend(const OpenParams& p)
      : cells_(detail::round_up_pow2(p.option("shm_cells").number)),
        copy_(static_cast<ShmCopy>(p.option("shm_copy").index)) {}
  std::unique_ptr<Transport> make_transport(const TransportParams& p) override {
    return make_shm_transport(ShmParams{p.rank, p.size, p.device, p.packet_size, cells_, copy_});
  }
  std::string provider() const override { return "none"; }

 private:
  std::size_t cells_;
  ShmCopy copy_;
};

const BackendInfo kShm{
    "shm",
    "ferry's shared memory: ranks of one host, a cell queue per receiver, large data by cross-memory attach or copy",
    unsigned(Reach::self) | Reach::host,
    [](const OpenParams& p) -> std::unique_ptr<Backend> { return std::make_unique<ShmBackend>(p); },
    [](bool) { return std::vector<Fact>{{"large data", large_data_path()}}; },
};

}  // namespace

const BackendInfo* builtin_backend_shm() noexcept { return &kShm; }

}  // namespace ferry::net
