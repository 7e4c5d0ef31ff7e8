// ferry-am-cost: instructions per active message, sender and receiver, for callgrind.
//   ferryrun -n 2 valgrind --tool=callgrind --collect-atstart=no ferry-am-cost [--size 8]
// Only the sender's post_am calls and the receiver's progress + pop + buffer release are
// collected (CALLGRIND_TOGGLE_COLLECT). Between the phases the ranks meet at a bootstrap fence,
// which does not touch the network, so every message of a batch is already queued at the
// receiver when it starts counting: the receiver's count has no empty polls but the last.
// bench/callgrind_split.py turns the output files into per-message numbers by library.
#include <valgrind/callgrind.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"

int main(int argc, char** argv) {
  std::size_t size = 8;
  int rounds = 20, batch = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--size") size = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (a == "--batch") batch = std::atoi(argv[i + 1]);
  }
  ferry::Runtime rt;
  if (rt.size() != 2) {
    std::fprintf(stderr, "ferry-am-cost: needs exactly 2 ranks\n");
    return 2;
  }
  ferry::Device& dev = rt.device();
  ferry::CompletionQueue inbox;
  ferry::Exposure ex = rt.expose(inbox, 1);
  rt.barrier();
  std::vector<char> msg(size, 'x');
  long retries = 0;
  for (int r = 0; r < rounds; ++r) {
    if (rt.rank() == 0) {
      CALLGRIND_TOGGLE_COLLECT;
      for (int i = 0; i < batch; ++i) {
        while (dev.post_am({.rank = 1, .buffer = msg.data(), .size = size, .target = {1}}).is_retry()) {
          ++retries;
          dev.progress();
        }
      }
      CALLGRIND_TOGGLE_COLLECT;
    }
    rt.kv_fence();
    if (rt.rank() == 1) {
      CALLGRIND_TOGGLE_COLLECT;
      for (int got = 0; got < batch;) {
        dev.progress();
        while (auto c = inbox.pop()) ++got;  // the Buffer goes back to the pool here
      }
      CALLGRIND_TOGGLE_COLLECT;
    }
    rt.kv_fence();
  }
  if (rt.rank() == 0) {
    std::printf("{\"bench\":\"am_cost\",\"size\":%zu,\"messages\":%d,\"retries\":%ld,\"transport\":\"%s\",\"provider\":\"%s\"}\n",
                size, rounds * batch, retries, rt.transport().c_str(), rt.provider().c_str());
  }
  rt.finalize();
}
