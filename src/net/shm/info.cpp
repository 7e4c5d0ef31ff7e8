// info.cpp — the shared-memory transport's facts for tools (ferry-info).
#include <fstream>
#include <string>

#include "ferry/runtime.hpp"
#include "net/shm/cma.hpp"

namespace ferry {

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

}  // namespace

// "cma" or "copy (...)", then what the pushed rendezvous gets from the kernel: receive blocks
// from FERRY_RECV_HUGE on are advised onto 2 MiB pages, which only "always" or "madvise" grant.
std::string shm_large_data_path() {
  std::string out = net::shm::describe_cma();
  const std::string thp = thp_mode();
  if (thp == "always" || thp == "madvise") {
    out += "; transparent huge pages: " + thp + " (large receive blocks on 2 MiB pages, FERRY_RECV_HUGE)";
  } else if (!thp.empty()) {
    out += "; transparent huge pages: " + thp + " (large receive blocks stay on 4 KiB pages: pushed rendezvous gain little)";
  }
  return out;
}

}  // namespace ferry
