// ferry-maps-check: one rank of a job that says which backend libraries its process maps.
//   ferry-maps-check absent LIB...   exits 1 if any LIB ("libucp", "libfabric") is mapped
//   ferry-maps-check present LIB...  exits 1 if any LIB is not mapped
// after the runtime is up and a message went to the next rank and back (so the transports are
// in use, not only opened). Links libferry alone: whatever else is mapped, ferry loaded.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"

namespace {

bool mapped(const std::string& lib) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const auto slash = line.rfind('/');
    if (slash != std::string::npos && line.compare(slash + 1, lib.size(), lib) == 0) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || (std::strcmp(argv[1], "absent") != 0 && std::strcmp(argv[1], "present") != 0)) {
    std::fprintf(stderr, "usage: ferry-maps-check absent|present LIB...\n");
    return 2;
  }
  const bool want = std::strcmp(argv[1], "present") == 0;
  try {
    ferry::Runtime rt;
    ferry::Device& dev = rt.device();
    ferry::CompletionQueue cq;
    ferry::Exposure exposed = rt.expose(cq, /*id=*/1);
    rt.barrier();
    const int rank = rt.rank();
    const std::string transport = rt.transport();
    const int next = (rank + 1) % rt.size();
    const char hello[] = "maps";
    for (;;) {
      const ferry::Status s = dev.post_am({.rank = next, .buffer = hello, .size = sizeof(hello), .target = exposed.target()});
      if (!s.is_retry()) break;
      dev.progress();
    }
    while (!cq.pop()) dev.progress();
    rt.barrier();
    rt.finalize();
    int bad = 0;
    for (int i = 2; i < argc; ++i) {
      if (mapped(argv[i]) != want) {
        std::fprintf(stderr, "rank %d (transport %s): %s is %s\n", rank, transport.c_str(), argv[i],
                     want ? "not mapped" : "mapped");
        bad = 1;
      }
    }
    if (bad == 0) std::printf("rank %d (transport %s): as expected\n", rank, transport.c_str());
    return bad;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-maps-check: %s\n", e.what());
    return 1;
  }
}
