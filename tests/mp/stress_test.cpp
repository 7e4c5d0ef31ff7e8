// Many threads, random sizes, random peers: every message arrives exactly once and intact.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "mp_common.hpp"

using namespace mp;

namespace {

struct Stamp {
  std::uint32_t src;
  std::uint32_t thread;
  std::uint32_t seq;
  std::uint32_t size;
  std::uint64_t checksum;  // of the bytes after the stamp
};

std::uint64_t checksum(const unsigned char* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::size_t random_size(std::mt19937_64& rng) {
  const unsigned roll = rng() % 100;
  if (roll < 70) return sizeof(Stamp) + rng() % 256;          // small: inject / eager
  if (roll < 95) return sizeof(Stamp) + rng() % 8192;         // up to the eager limit and just past it
  return sizeof(Stamp) + 8192 + rng() % (64 * 1024);           // rendezvous
}

long env_long(const char* name, long def) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atol(v) : def;
}

}  // namespace

TEST(Stress, ManyThreadsRandomSizesRandomPeersExactlyOnce) {
  const int threads = static_cast<int>(env_long("FERRY_TEST_THREADS", 4));
  const long total = env_long("FERRY_TEST_MESSAGES", 100000);  // over the whole job
  const int n = rt().size();
  const long per_thread = (total + static_cast<long>(n) * threads - 1) / (static_cast<long>(n) * threads);
  const int devices = rt().device_count();
  // Thread t uses device t % devices alone: under the serialized model, a device per thread.
  if (serialized_model() && threads > devices) {
    GTEST_SKIP() << threads << " threads share " << devices << " devices, which FERRY_LOCK_MODEL=serialized does not allow";
  }

  ferry::CompletionQueue inbox;
  ferry::Exposure ex = rt().expose(inbox, 20);
  rt().barrier();

  std::vector<std::atomic<long>> sent_to(static_cast<std::size_t>(n));
  std::atomic<long> received{0}, corrupt{0}, duplicate{0};
  std::atomic<long> expected{-1};
  std::mutex seen_mutex;
  std::set<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>> seen;
  std::atomic<bool> failed{false};

  auto consume = [&](ferry::Completion& c) {
    Stamp st{};
    if (c.size < sizeof(Stamp) || c.buffer.size() != c.size) {
      corrupt.fetch_add(1);
    } else {
      std::memcpy(&st, c.buffer.data(), sizeof(Stamp));
      const auto* body = static_cast<const unsigned char*>(c.buffer.data()) + sizeof(Stamp);
      if (st.size != c.size || static_cast<int>(st.src) != c.rank ||
          st.checksum != checksum(body, c.size - sizeof(Stamp))) {
        corrupt.fetch_add(1);
      }
      std::lock_guard<std::mutex> g(seen_mutex);
      if (!seen.insert({st.src, st.thread, st.seq}).second) duplicate.fetch_add(1);
    }
    received.fetch_add(1);
  };

  auto worker = [&](int t) {
    ferry::Device& dev = rt().device(t % devices);
    std::mt19937_64 rng(static_cast<std::uint64_t>(rt().rank()) * 7919u + static_cast<std::uint64_t>(t));
    std::vector<unsigned char> buf(sizeof(Stamp) + 8192 + 64 * 1024);
    std::vector<ferry::Synchronizer> pending;
    for (long i = 0; i < per_thread; ++i) {
      const int dest = static_cast<int>(rng() % static_cast<unsigned>(n));
      const std::size_t size = random_size(rng);
      for (std::size_t b = sizeof(Stamp); b < size; ++b) buf[b] = static_cast<unsigned char>(rng());
      Stamp st{static_cast<std::uint32_t>(rt().rank()), static_cast<std::uint32_t>(t), static_cast<std::uint32_t>(i),
               static_cast<std::uint32_t>(size), checksum(buf.data() + sizeof(Stamp), size - sizeof(Stamp))};
      std::memcpy(buf.data(), &st, sizeof(st));
      ferry::Synchronizer done(1);
      const ferry::Status s = post_retry(dev, [&] {
        if (auto c = inbox.pop()) consume(*c);  // keep draining while the network pushes back
        return dev.post_am({.rank = dest, .buffer = buf.data(), .size = size, .target = {20}, .local = &done});
      });
      // A rendezvous send reads `buf` later: wait before reusing it.
      if (s.is_posted() && !wait_until(dev, [&] {
            if (auto c = inbox.pop()) consume(*c);
            return done.test();
          })) {
        failed = true;
        return;
      }
      sent_to[static_cast<std::size_t>(dest)].fetch_add(1);
      if (auto c = inbox.pop()) consume(*c);
    }
    // Receive until the whole job's count for this rank is known and reached.
    if (!wait_until(dev, [&] {
          if (auto c = inbox.pop()) consume(*c);
          const long e = expected.load();
          return e >= 0 && received.load() >= e;
        })) {
      failed = true;
    }
  };

  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker, t);
  // The main thread learns how many messages each peer sent here once all threads are done
  // sending: count exchange through the bootstrap store (not the network).
  std::vector<long> mine(static_cast<std::size_t>(n));
  while (true) {
    long s = 0;
    for (auto& v : sent_to) s += v.load();
    if (s == per_thread * threads || failed) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::string counts;
  for (auto& v : sent_to) counts += std::to_string(v.load()) + ",";
  rt().kv_put("mp.stress.counts", counts);
  rt().kv_fence();
  long expect = 0;
  for (int r = 0; r < n; ++r) {
    const std::string c = rt().kv_get(r, "mp.stress.counts");
    std::size_t pos = 0;
    for (int k = 0; k < rt().rank(); ++k) pos = c.find(',', pos) + 1;
    expect += std::atol(c.c_str() + pos);
  }
  expected = expect;
  for (auto& th : pool) th.join();
  ASSERT_FALSE(failed.load()) << "a thread timed out; received " << received.load() << " of " << expect;
  EXPECT_EQ(received.load(), expect);
  EXPECT_EQ(corrupt.load(), 0);
  EXPECT_EQ(duplicate.load(), 0);
  EXPECT_EQ(static_cast<long>(seen.size()), expect);
  EXPECT_FALSE(inbox.pop().has_value()) << "more messages than were sent";
  rt().barrier();
}

// Run with a tiny packet pool (see CMakeLists: FERRY_PACKETS=16 FERRY_PREPOST=4): posts must
// report retry, and still nothing is lost and nothing deadlocks. Messages of 256 bytes are
// above tcp's inject size, so each send holds a packet until it completes and the sender's
// pool runs dry; on shm they are injected and the receiver's full queue pushes back.
TEST(Flood, ATinyPacketPoolPushesBackWithRetryAndLosesNothing) {
  ferry::Device& dev = rt().device();
  ferry::CompletionQueue inbox;
  ferry::Exposure ex = rt().expose(inbox, 21);
  rt().barrier();
  const long count = env_long("FERRY_TEST_FLOOD", 20000);
  long retries = 0, got = 0;
  std::vector<ferry::Completion> held;  // hold received buffers for a while: starves the pool
  std::uint64_t next_expected = 0;
  bool in_order = true;
  std::vector<unsigned char> msg(256);
  for (long i = 0; i < count; ++i) {
    const std::uint64_t v = static_cast<std::uint64_t>(i);
    std::memcpy(msg.data(), &v, 8);
    for (;;) {
      const ferry::Status s = dev.post_am({.rank = right(), .buffer = msg.data(), .size = msg.size(), .target = {21}});
      if (!s.is_retry()) break;
      ++retries;
      dev.progress();
      while (auto c = inbox.pop()) held.push_back(std::move(*c));
      if (held.size() >= 8) {
        for (auto& c : held) {
          std::uint64_t x;
          std::memcpy(&x, c.buffer.data(), 8);
          in_order &= (x == next_expected++);
          ++got;
        }
        held.clear();
      }
    }
  }
  ASSERT_TRUE(wait_until(dev, [&] {
    while (auto c = inbox.pop()) held.push_back(std::move(*c));
    for (auto& c : held) {
      std::uint64_t x;
      std::memcpy(&x, c.buffer.data(), 8);
      in_order &= (x == next_expected++);
      ++got;
    }
    held.clear();
    return got == count;
  })) << "received " << got << " of " << count;
  EXPECT_EQ(got, count);
  EXPECT_TRUE(in_order) << "one sender, one device: messages arrive in order";
  std::printf("flood: rank %d sent %ld messages, %ld retries\n", rt().rank(), count, retries);
  // Which rank is pushed back depends on who drains faster (a peer's retry loop progresses
  // and so drains this rank's sends), so the job's total must be positive, not each rank's.
  rt().kv_put("mp.flood.retries", std::to_string(retries));
  // The key-value fence does not progress the device: every rank first waits, progressing,
  // until all have received everything (UCX may still hold this rank's last sends for it).
  rt().barrier();
  rt().kv_fence();
  long job_retries = 0;
  for (int r = 0; r < rt().size(); ++r) job_retries += std::atol(rt().kv_get(r, "mp.flood.retries").c_str());
  EXPECT_GT(job_retries, 0) << "the tiny pool never pushed back: the test did not test back-pressure";
  rt().barrier();
}

// The same back-pressure with sizes that take every eager path (stack inject, packet inject,
// fragments in a packet, fragments past a packet's size): a fragmented message the provider refuses midway
// waits in the device's backlog, and nothing posted after it may overtake it.
TEST(Flood, MixedSizesKeepTheirOrderWhenFragmentsArePushedBack) {
  ferry::Device& dev = rt().device();
  ferry::CompletionQueue inbox;
  ferry::Exposure ex = rt().expose(inbox, 23);
  rt().barrier();
  const long count = env_long("FERRY_TEST_FLOOD", 20000) / 2;
  // Rendezvous messages may be overtaken (they finish when the receiver has read them), so
  // every size is kept eager: on tcp, or with FERRY_FRAGMENT=off, the larger ones shrink.
  std::size_t cycle[] = {8, 6000, 256, 8176, 4081, 16384, 4000, 12000};
  for (std::size_t& c : cycle) c = std::min(c, dev.eager_limit());
  const std::size_t ncycle = sizeof(cycle) / sizeof(cycle[0]);
  std::vector<unsigned char> msg(16384);
  long got = 0, bad = 0, retries = 0;
  std::uint64_t next_expected = 0;
  auto consume = [&] {
    while (auto c = inbox.pop()) {
      std::uint64_t x;
      std::memcpy(&x, c->buffer.data(), 8);
      const std::size_t size = cycle[x % ncycle];
      if (x != next_expected || c->size != size ||
          first_mismatch(static_cast<const unsigned char*>(c->buffer.data()) + 8, size - 8, left(), size - 8) != -1) {
        ++bad;
      }
      next_expected = x + 1;
      ++got;
    }
  };
  for (long i = 0; i < count; ++i) {
    const std::uint64_t v = static_cast<std::uint64_t>(i);
    const std::size_t size = cycle[v % ncycle];
    fill(msg.data() + 8, size - 8, rt().rank());
    std::memcpy(msg.data(), &v, 8);
    for (;;) {
      const ferry::Status s = dev.post_am({.rank = right(), .buffer = msg.data(), .size = size, .target = {23}});
      if (!s.is_retry()) break;
      ++retries;
      dev.progress();
      consume();
    }
  }
  ASSERT_TRUE(wait_until(dev, [&] {
    consume();
    return got == count;
  })) << "received " << got << " of " << count;
  EXPECT_EQ(bad, 0) << "messages out of order, of the wrong size, or corrupt";
  std::printf("flood (mixed sizes): rank %d sent %ld messages, %ld retries\n", rt().rank(), count, retries);
  rt().barrier();
}

// Several threads post to one device at once. While all of a rank's threads sit in their
// retry loops nobody pops the inbox, so the received payloads pile up: this is also the test
// that the device then moves payloads to the heap rather than run out of receive buffers
// (a 4-rank ring under ASan deadlocked that way before). Whatever the lock model, each thread's
// messages arrive in the order it posted them (one device, one destination), none is lost,
// and a combining model never performs more than its bound in one pass. Every fourth message
// is past shm's inject size, so fragments and their backlog see the same contention.
std::size_t stress_size(std::uint64_t seq) { return seq % 4 == 3 ? 6000 : 8; }
// Byte j (past the sequence number) of thread t's message seq.
unsigned char stress_byte(std::uint64_t seq, unsigned t, std::size_t j) {
  return static_cast<unsigned char>(seq * 131 + t * 17 + j);
}

TEST(Stress, EachThreadsMessagesArriveInOrderUnderContention) {
  const int threads = static_cast<int>(env_long("FERRY_TEST_THREADS", 4));
  const long per_thread = env_long("FERRY_TEST_ORDERED", 20000);
  MP_SKIP_IF_THREADS_SHARE_A_DEVICE();
  ferry::Device& dev = rt().device();
  ferry::CompletionQueue inbox;
  ferry::Exposure ex = rt().expose(inbox, 22);
  rt().barrier();
  std::vector<long> next(static_cast<std::size_t>(threads), 0);
  std::atomic<long> out_of_order{0}, got{0}, corrupt{0};
  std::mutex next_mutex;
  auto drain = [&] {
    // Pop and record under one lock: two threads popping could otherwise record out of order.
    std::lock_guard<std::mutex> g(next_mutex);
    while (auto c = inbox.pop()) {
      std::uint64_t seq;
      std::memcpy(&seq, c->buffer.data(), 8);
      long& expect = next[c->tag];
      if (static_cast<long>(seq) != expect || c->size != stress_size(seq)) {
        if (out_of_order.fetch_add(1) < 8) {
          std::fprintf(stderr, "rank %d: thread %u's message %llu (%zu bytes) arrived when %ld was due\n", rt().rank(),
                       static_cast<unsigned>(c->tag), static_cast<unsigned long long>(seq), c->size, expect);
        }
      }
      expect = static_cast<long>(seq) + 1;
      const auto* bytes = static_cast<const unsigned char*>(c->buffer.data());
      for (std::size_t j = 8; j < c->size; ++j) {
        if (bytes[j] != stress_byte(seq, c->tag, j)) {
          if (corrupt.fetch_add(1) < 8) {
            std::fprintf(stderr, "rank %d: thread %u's message %llu has a wrong byte at %zu\n", rt().rank(),
                         static_cast<unsigned>(c->tag), static_cast<unsigned long long>(seq), j);
          }
          break;
        }
      }
      got.fetch_add(1);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::vector<unsigned char> msg(stress_size(3));
      for (long i = 0; i < per_thread; ++i) {
        const std::uint64_t v = static_cast<std::uint64_t>(i);
        std::memcpy(msg.data(), &v, 8);
        for (std::size_t j = 8; j < stress_size(v); ++j) msg[j] = stress_byte(v, static_cast<unsigned>(t), j);
        (void)post_retry(dev, [&] {
          return dev.post_am({.rank = right(), .buffer = msg.data(), .size = stress_size(v), .target = {22},
                              .tag = static_cast<ferry::Tag>(t)});
        });
        if ((i & 63) == 0) drain();
      }
      if (t == 0) {
        EXPECT_TRUE(wait_until(dev, [&] {
          drain();
          return got.load() == per_thread * threads;
        })) << "received " << got.load() << " of " << per_thread * threads;
      }
    });
  }
  for (auto& th : pool) th.join();
  EXPECT_EQ(out_of_order.load(), 0);
  EXPECT_EQ(corrupt.load(), 0) << "messages with wrong payload bytes";
  EXPECT_EQ(got.load(), per_thread * threads);
  const ferry::DeviceStats st = dev.stats();
  EXPECT_LE(st.max_combined_batch, 64u) << "combining exceeded its bound";
  const char* model = std::getenv("FERRY_LOCK_MODEL");
  if (model != nullptr && (std::string(model) == "lockq" || std::string(model) == "offload")) {
    EXPECT_GT(st.deferred, 0u) << "no post was ever deferred: the storm of failed try-locks did not happen";
  }
  if (rt().rank() == 0) {
    std::printf("ordered: %ld messages, deferred %llu, combined %llu, largest batch %llu\n", got.load(),
                static_cast<unsigned long long>(st.deferred), static_cast<unsigned long long>(st.combined),
                static_cast<unsigned long long>(st.max_combined_batch));
  }
  rt().barrier();
}

// The runtime's barrier sends its own messages. Under every lock model it must enter the
// device as that model lets a post in (on the offload thread, under the coarse lock, as an
// announced call) while other threads keep posting and progressing; a barrier that went
// straight to the transport would run beside the thread that owns it, which a transport
// relying on the lock model's serialisation (UCX in serialised mode) does not survive.
TEST(Stress, BarriersRunWhileOtherThreadsPostAndProgress) {
  // Two ranks pass a barrier in a microsecond or so here; with three or four ranks and busy
  // threads on two cores each barrier took 100-200 ms (200 barriers: 27-39 s over shm).
  if (rt().size() != 2) GTEST_SKIP() << "two ranks only: with more, barriers under this load take 100+ ms each here";
  MP_SKIP_IF_THREADS_SHARE_A_DEVICE();
  const int threads = 2;
  const int barriers = 2000;  // about 1 ms each on a loaded machine, a microsecond on a quiet one
  ferry::Device& dev = rt().device();
  std::atomic<long> got{0}, sent{0};
  ferry::Handler h([&](ferry::Completion&&) { got.fetch_add(1); });
  ferry::Exposure ex = rt().expose(h, 23);
  rt().barrier();
  // The threads post and progress for as long as the barriers run.
  std::atomic<bool> stop{false};
  std::atomic<int> quit{0};
  std::vector<std::thread> pool;
  // A barrier that throws (a peer failed) still stops and joins the threads.
  struct Joiner {
    std::atomic<bool>& stop;
    std::vector<std::thread>& pool;
    ~Joiner() {
      stop.store(true);
      for (auto& th : pool)
        if (th.joinable()) th.join();
    }
  } joiner{stop, pool};
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      std::uint64_t v = 7;
      for (long i = 0; !stop.load(); ++i) {
        // At most a few hundred messages ahead of what arrived here: on a ring every rank sends
        // what it receives, so the links never fill and a barrier step never waits behind a
        // flood (the sum of sent - got over the ranks is what is in flight: someone may post).
        if (sent.load() - got.load() < 256) {
          const ferry::Status s =
              post_retry(dev, [&] { return dev.post_am({.rank = right(), .buffer = &v, .size = 8, .target = {23}}); });
          if (s.is_failed()) {  // the peer is gone: the barrier reports it
            quit.fetch_add(1);
            return;
          }
          sent.fetch_add(1);
        }
        if ((i & 3) == 0) (void)dev.progress();
        std::this_thread::yield();  // cores are few: the barrier's thread must get its turns
      }
    });
  }
  while (sent.load() < threads * 64L && quit.load() == 0) std::this_thread::yield();  // every thread is posting
  for (int b = 0; b < barriers; ++b) rt().barrier();
  stop.store(true);
  for (auto& th : pool) th.join();
  pool.clear();
  const long expected = allgather<long>("mp.barrier_storm", sent.load())[static_cast<std::size_t>(left())];
  EXPECT_TRUE(wait_until(dev, [&] { return got.load() == expected; })) << "received " << got.load() << " of " << expected;
  rt().barrier();
}
