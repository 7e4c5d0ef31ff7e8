// am_pingpong: rank 0 and rank 1 bounce an active message; rank 0 prints the half round trip.
//   build/bin/ferryrun -n 2 build/bin/ferry-example-am-pingpong [iterations]
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "ferry/ferry.hpp"

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 10000;
  ferry::Runtime rt;
  if (rt.size() < 2) {
    std::fprintf(stderr, "am_pingpong: needs 2 ranks (run it under ferryrun -n 2)\n");
    return 2;
  }
  ferry::Device& dev = rt.device();
  ferry::CompletionQueue inbox;
  ferry::Exposure ex = rt.expose(inbox, 1);
  rt.barrier();
  const int peer = 1 - rt.rank();
  char msg[8] = "ping";
  auto send = [&] {
    while (dev.post_am({.rank = peer, .buffer = msg, .size = sizeof msg, .target = {1}}).is_retry()) dev.progress();
  };
  auto receive = [&] {
    for (;;) {
      if (auto c = inbox.pop()) return;  // the Buffer goes back to ferry here
      dev.progress();
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  if (rt.rank() < 2) {
    for (int i = 0; i < iters; ++i) {
      if (rt.rank() == 0) { send(); receive(); } else { receive(); send(); }
    }
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  if (rt.rank() == 0) std::printf("%d round trips, half round trip %.3f us on %s\n", iters, us / iters / 2, rt.transport().c_str());
  rt.finalize();
}
