// sendrecv: every rank sends a tagged message to rank 0, which receives from any source.
//   build/bin/ferryrun -n 4 build/bin/ferry-example-sendrecv
#include <cstdio>

#include "ferry/ferry.hpp"

int main() {
  ferry::Runtime rt;
  ferry::Device& dev = rt.device();
  int value = 100 + rt.rank();
  ferry::Synchronizer sent(1);
  ferry::Status s;
  while ((s = dev.post_send({.rank = 0, .buffer = &value, .size = sizeof value, .tag = 42, .local = &sent})).is_retry()) {
    dev.progress();
  }
  if (rt.rank() == 0) {
    for (int i = 0; i < rt.size(); ++i) {
      int got = 0;
      ferry::Synchronizer received(1);
      ferry::Status r;
      while ((r = dev.post_recv({.rank = ferry::any_source, .buffer = &got, .size = sizeof got, .tag = 42,
                                 .local = &received})).is_retry()) {
        dev.progress();
      }
      int from = r.rank;
      if (r.is_posted()) {  // not here yet: wait for it
        while (!received.test()) dev.progress();
        from = received.results()[0].rank;
      }
      std::printf("rank 0 received %d from rank %d\n", got, from);
    }
  }
  while (s.is_posted() && !sent.test()) dev.progress();
  rt.finalize();
}
