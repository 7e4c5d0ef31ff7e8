// Finalize with work in flight: several threads post eager and rendezvous active messages to
// the peer and return at once (no waiting for completions); the main thread then finalizes.
// Under FERRY_LOCK_MODEL=offload most of those posts are still descriptors in the offload
// thread's queue at that moment. finalize must run them all, stop the thread, and leave
// nothing behind: every local completion signalled exactly once, every message delivered to
// the peer exactly once. A hang is caught by ferryrun --timeout. Exit 0 on success.
// The posting threads also consume what arrives (as a real application does): a received
// payload holds one of the device's packets until it is released, and a receiver that kept
// more than FERRY_PACKETS of them would leave its device no receive buffers.
//   ferryrun -n 2 ferry-mp-shutdown-in-flight        (FERRY_LOCK_MODEL picks the model)
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "ferry/ferry.hpp"

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

const int kThreads = env_int("FERRY_TEST_THREADS", 4);
const int kPerThread = env_int("FERRY_TEST_MESSAGES", 2000);
constexpr std::size_t kLarge = 64 * 1024;  // above any eager limit here: rendezvous
const int kLargeEvery = env_int("FERRY_TEST_LARGE_EVERY", 50);

// Counts local completions without ever blocking inside progress.
class Counter final : public ferry::CompletionObject {
 public:
  void signal(ferry::Completion&& c) noexcept override {
    (c.ok() ? ok : failed).fetch_add(1, std::memory_order_relaxed);
  }
  std::atomic<long> ok{0}, failed{0};
};

}  // namespace

int main() {
  ferry::Runtime rt;
  if (rt.size() != 2) {
    std::fprintf(stderr, "ferry-mp-shutdown-in-flight: needs exactly 2 ranks\n");
    return 2;
  }
  const int peer = 1 - rt.rank();
  ferry::Device& dev = rt.device();
  ferry::CompletionQueue inbox;
  ferry::Exposure ex = rt.expose(inbox, 7);
  Counter local;
  rt.barrier();

  // Rendezvous payloads must stay valid until their completion: one buffer per large post,
  // all alive until after finalize.
  const int large_per_thread = (kPerThread + kLargeEvery - 1) / kLargeEvery;
  std::vector<std::vector<unsigned char>> large(static_cast<std::size_t>(kThreads * large_per_thread),
                                                std::vector<unsigned char>(kLarge));
  std::atomic<long> posted_with_completion{0};
  std::vector<int> seen(static_cast<std::size_t>(kThreads * kPerThread), 0);
  long received = 0, bad = 0;
  std::mutex seen_mutex;
  auto consume = [&] {
    std::lock_guard<std::mutex> guard(seen_mutex);
    while (auto c = inbox.pop()) {
      std::uint64_t id = 0;
      if (c->buffer.size() >= sizeof id) std::memcpy(&id, c->buffer.data(), sizeof id);
      const auto t = static_cast<std::size_t>(id >> 32), i = static_cast<std::size_t>(id & 0xFFFFFFFFu);
      if (t >= static_cast<std::size_t>(kThreads) || i >= static_cast<std::size_t>(kPerThread) || c->tag != t) {
        ++bad;
        continue;
      }
      ++seen[t * static_cast<std::size_t>(kPerThread) + i];
      ++received;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      int next_large = 0;
      for (int i = 0; i < kPerThread; ++i) {
        const std::uint64_t id = static_cast<std::uint64_t>(t) << 32 | static_cast<std::uint32_t>(i);
        ferry::AmArgs a{.rank = peer, .target = {7}, .tag = static_cast<ferry::Tag>(t)};
        std::uint64_t small = id;
        if (i % kLargeEvery == 0) {
          auto& buf = large[static_cast<std::size_t>(t * large_per_thread + next_large++)];
          std::memcpy(buf.data(), &id, sizeof id);
          a.buffer = buf.data();
          a.size = buf.size();
        } else {
          a.buffer = &small;
          a.size = sizeof small;
        }
        a.local = &local;
        if ((i & 63) == 0) consume();
        for (;;) {
          const ferry::Status s = dev.post_am(a);
          if (s.is_retry()) {
            dev.progress();
            consume();
            continue;
          }
          if (s.is_posted()) posted_with_completion.fetch_add(1, std::memory_order_relaxed);
          break;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  rt.finalize();  // the posts above may still be queued, unsent or unacknowledged here

  int failures = 0;
  const long expected_local = posted_with_completion.load();
  if (local.ok.load() != expected_local || local.failed.load() != 0) {
    std::fprintf(stderr, "rank %d: %ld of %ld local completions arrived (%ld failed)\n", rt.rank(), local.ok.load(),
                 expected_local, local.failed.load());
    ++failures;
  }
  consume();  // what arrived during finalize
  long missing = 0, duplicated = 0;
  for (const int n : seen) {
    missing += n == 0;
    duplicated += n > 1;
  }
  if (bad != 0 || missing != 0 || duplicated != 0) {
    std::fprintf(stderr, "rank %d: received %ld messages: %ld missing, %ld duplicated, %ld malformed\n", rt.rank(),
                 received, missing, duplicated, bad);
    ++failures;
  }
  if (failures == 0) {
    std::printf("rank %d: %ld messages delivered, %ld local completions, all after finalize\n", rt.rank(), received,
                expected_local);
  }
  return failures == 0 ? 0 : 1;
}
