// Rank 1 dies in the middle of the traffic; rank 0 keeps sending to it and waiting for a reply
// that never comes. The job must end (ferryrun reports rank 1 and stops rank 0), not hang.
//   ferry-mp-dead-peer          rank 1 exits with code 3
//   ferry-mp-dead-peer abort    rank 1 crashes (SIGABRT): the signal must end it, and ferryrun
//                               must see the signal, even though the runtime is a static
//                               (whose destructor must not run from a signal handler)
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ferry/ferry.hpp"

int main(int argc, char** argv) {
  const bool crash = argc > 1 && std::strcmp(argv[1], "abort") == 0;
  static ferry::Runtime rt;
  // The test script checks that exactly these processes are gone afterwards.
  std::fprintf(stderr, "rank %d pid %d\n", rt.rank(), static_cast<int>(getpid()));
  ferry::Device& dev = rt.device();
  ferry::CompletionQueue inbox;
  ferry::Exposure ex = rt.expose(inbox, 1);
  rt.barrier();
  char byte = 1;
  if (rt.rank() == 1) {
    for (int got = 0; got < 100;) {
      dev.progress();
      if (inbox.pop()) ++got;
    }
    std::fprintf(stderr, "rank 1: dying on purpose\n");
    if (crash) std::abort();
    _exit(3);
  }
  for (;;) {  // rank 0: would wait forever for a peer that is gone
    (void)dev.post_am({.rank = 1, .buffer = &byte, .size = 1, .target = {1}});
    dev.progress();
    (void)inbox.pop();
  }
}
