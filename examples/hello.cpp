// hello: every rank says hello to rank 0 with an active message.
//   build/bin/ferryrun -n 4 build/bin/ferry-example-hello
#include <cstdio>
#include <cstring>
#include <string>

#include "ferry/ferry.hpp"

int main() {
  ferry::Runtime rt;
  ferry::CompletionQueue inbox;
  ferry::Exposure exposed = rt.expose(inbox, /*id=*/1);
  rt.barrier();  // every rank has exposed its inbox
  ferry::Device& dev = rt.device();

  const std::string text = "hello from rank " + std::to_string(rt.rank());
  ferry::Status s;
  while ((s = dev.post_am({.rank = 0, .buffer = text.data(), .size = text.size(), .target = exposed.target()})).is_retry()) {
    dev.progress();
  }
  if (rt.rank() == 0) {
    for (int got = 0; got < rt.size();) {
      dev.progress();
      if (auto c = inbox.pop()) {
        std::printf("rank 0 got: %.*s (on %s)\n", static_cast<int>(c->size), static_cast<const char*>(c->buffer.data()),
                    rt.transport().c_str());
        ++got;
      }
    }
  }
  rt.finalize();
  return 0;
}
