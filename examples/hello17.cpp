// hello17: a C++17 program (no designated initializers) against the installed ferry.
#include <cstdio>

#include "ferry/ferry.hpp"

int main() {
  ferry::Runtime rt;
  ferry::CompletionQueue inbox;
  ferry::Exposure ex = rt.expose(inbox, 1);
  rt.barrier();
  ferry::AmArgs args;
  args.rank = 0;
  args.buffer = "hi";
  args.size = 2;
  args.target = ex.target();
  ferry::Device& dev = rt.device();
  while (dev.post_am(args).is_retry()) dev.progress();
  int got = 0;
  while (rt.rank() == 0 && got < rt.size()) {
    dev.progress();
    if (inbox.pop()) ++got;
  }
  if (rt.rank() == 0) std::printf("hello17: %d greetings\n", got);
  rt.finalize();
}
