// The sender of a large active message dies after the receiver asked it for the data: with
// FERRY_RDV_READ=push the receiver waits for the sender to write the data, and in copy mode
// (FERRY_SHM_COPY=copy) for its reply cells; either way the request is outstanding at a
// process that will never answer. Rank 0 must get the message back as failed, naming rank 1,
// within the bound, and finalize; it must not wait forever.
//
// Rank 1 posts the message and then stops progressing (so the request stays unanswered) until
// it SIGKILLs itself a second later.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "ferry/ferry.hpp"

int main() {
  ferry::Runtime rt;
  std::fprintf(stderr, "rank %d pid %d\n", rt.rank(), static_cast<int>(getpid()));
  if (rt.size() != 2) {
    std::fprintf(stderr, "run with 2 ranks\n");
    return 2;
  }
  ferry::Device& dev = rt.device();
  ferry::CompletionQueue inbox;
  ferry::Exposure ex = rt.expose(inbox, 1);
  rt.barrier();
  constexpr std::size_t kSize = std::size_t{1} << 20;
  if (rt.rank() == 1) {
    std::vector<unsigned char> out(kSize, 7);
    ferry::Synchronizer sent;
    ferry::Status s;
    while ((s = dev.post_am({.rank = 0, .buffer = out.data(), .size = kSize, .target = {1}, .local = &sent})).is_retry()) {
      dev.progress();
    }
    if (!s.is_posted()) {
      std::fprintf(stderr, "rank 1: a %zu-byte message did not go by rendezvous (%s)\n", kSize, ferry::to_string(s.kind));
      return 1;
    }
    ::sleep(1);  // no progress: rank 0's request waits here unanswered
    std::fprintf(stderr, "rank 1: killing itself with the request unanswered\n");
    std::fflush(stderr);
    ::raise(SIGKILL);
  }
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    dev.progress();
    if (auto c = inbox.pop()) {
      if (c->ok()) {
        std::fprintf(stderr, "rank 0: the message arrived whole although its sender never answered\n");
        return 1;
      }
      if (c->rank != 1 || c->error != ferry::peer_failed_error) {
        std::fprintf(stderr, "rank 0: the message failed with %s from rank %d, not rank 1's failure\n",
                     c->error_string().c_str(), c->rank);
        return 1;
      }
      break;
    }
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(20)) {
      std::fprintf(stderr, "rank 0: no word of the message 20 s on: the request to the dead sender was never given up\n");
      return 1;
    }
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  try {
    rt.finalize();
  } catch (const ferry::PeerFailed&) {
    // expected: finalize names the failed rank
  }
  std::fprintf(stderr, "rank 0: the message failed with rank 1's failure after %.2f s: given up OK\n", took);
  return 0;
}
