// packet_pool_test.cpp — PacketPool: the fixed set of pre-registered packets of a device,
// with per-thread caches for pools of kMinCachedPool packets or more.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "alloc_counter.hpp"
#include "core/packet_pool.hpp"
#include "ferry/error.hpp"
#include "test_scale.hpp"

namespace {

using ferry::detail::cache_line;
using ferry::detail::Packet;
using ferry::detail::PacketPool;

constexpr std::size_t kCachedCount = PacketPool::kMinCachedPool;  // smallest pool with caches

// Which packet of the slab p is (packets are laid out at a fixed stride).
std::size_t index_of(const PacketPool& pool, const Packet* p) {
  const std::size_t stride = pool.slab_bytes() / pool.count();
  const auto offset = static_cast<std::size_t>(reinterpret_cast<const unsigned char*>(p) -
                                               static_cast<const unsigned char*>(pool.slab()));
  return offset / stride;
}

bool in_slab(const PacketPool& pool, const Packet* p) {
  const auto* base = static_cast<const unsigned char*>(pool.slab());
  const auto* at = reinterpret_cast<const unsigned char*>(p);
  if (at < base || at >= base + pool.slab_bytes()) return false;
  const std::size_t stride = pool.slab_bytes() / pool.count();
  return static_cast<std::size_t>(at - base) % stride == 0;
}

// Takes packets from the calling thread until get() says the pool is empty.
std::vector<Packet*> drain(PacketPool& pool) {
  std::vector<Packet*> out;
  while (Packet* p = pool.get()) {
    out.push_back(p);
    if (out.size() > pool.count()) break;  // a bug handed out more than exist: stop, report
  }
  return out;
}

// All distinct packets of `pool`, no more than it has.
void expect_all_distinct_from(const PacketPool& pool, const std::vector<Packet*>& got) {
  std::set<const Packet*> unique(got.begin(), got.end());
  EXPECT_EQ(unique.size(), got.size()) << "a packet was handed out twice";
  for (const Packet* p : got) {
    ASSERT_TRUE(in_slab(pool, p)) << "packet " << p << " is not one of this pool's";
    EXPECT_EQ(p->pool, &pool);
  }
}

TEST(PacketPool, ZeroPacketsThrows) {
  try {
    PacketPool pool(0, 64);
    FAIL() << "a pool of 0 packets must throw";
  } catch (const ferry::Error& e) {
    EXPECT_NE(std::string(e.what()).find("FERRY_PACKETS=0"), std::string::npos) << e.what();
  }
}

TEST(PacketPool, OversizedPayloadThrows) {
  try {
    PacketPool pool(1, std::size_t{1} << 32);  // capacity is a 32-bit field
    FAIL() << "a 4 GiB payload must throw";
  } catch (const ferry::Error& e) {
    EXPECT_NE(std::string(e.what()).find("FERRY_PACKET_SIZE=4294967296"), std::string::npos) << e.what();
  }
}

// Small pools have no per-thread caches, so get() sees every free packet: exactly `count`
// packets come out, then nullptr (the caller's cue to report retry(packet_pool)).
TEST(PacketPool, SmallPoolGetUntilEmptyIsExact) {
  for (const std::size_t count : {std::size_t{1}, std::size_t{2}, std::size_t{7}, kCachedCount - 1}) {
    PacketPool pool(count, 256);
    EXPECT_EQ(pool.count(), count);
    EXPECT_EQ(pool.payload_size(), 256u);
    std::vector<Packet*> got = drain(pool);
    EXPECT_EQ(got.size(), count);
    expect_all_distinct_from(pool, got);
    EXPECT_EQ(pool.get(), nullptr);  // still empty on a second try
    for (Packet* p : got) pool.put(p);
    EXPECT_EQ(pool.available_approx(), count);  // no cache: everything is back in the ring
    std::vector<Packet*> again = drain(pool);
    EXPECT_EQ(again.size(), count);
    for (Packet* p : again) pool.put(p);
  }
}

// With caches on, one thread still gets exactly `count` packets: its own cache first, then
// the shared ring.
TEST(PacketPool, CachedPoolRoundTripIsExact) {
  PacketPool pool(kCachedCount, 128);
  std::vector<Packet*> got = drain(pool);
  EXPECT_EQ(got.size(), kCachedCount);
  expect_all_distinct_from(pool, got);
  for (Packet* p : got) pool.put(p);
  std::vector<Packet*> again = drain(pool);
  EXPECT_EQ(again.size(), kCachedCount);
  expect_all_distinct_from(pool, again);
  EXPECT_EQ(std::set<Packet*>(got.begin(), got.end()), std::set<Packet*>(again.begin(), again.end()));
  for (Packet* p : again) pool.put(p);
}

// A burst of gets or puts trades with the shared list in batches of half the cache: after k
// gets from a fresh pool the shared list has lost whole batches, and the packets this thread
// took beyond k wait in its cache; putting them back keeps at most a cache's worth here.
TEST(PacketPool, BurstsTradeWithTheSharedListInBatches) {
  PacketPool pool(4096, 64);
  const std::size_t cap = pool.cache_capacity();
  ASSERT_EQ(cap, PacketPool::kCacheSize);
  const std::size_t batch = cap / 2;
  std::vector<Packet*> got;
  for (std::size_t i = 0; i < 128 + 5; ++i) got.push_back(pool.get());
  const std::size_t batches = (got.size() + batch - 1) / batch;
  EXPECT_EQ(pool.available_approx(), pool.count() - batches * batch);
  expect_all_distinct_from(pool, got);
  for (Packet* p : got) pool.put(p);
  const std::size_t shared = pool.available_approx();
  EXPECT_GE(shared, pool.count() - cap);
  EXPECT_LT(shared, pool.count());
  // Nothing was lost on the way: every packet comes out again, each once.
  std::vector<Packet*> all = drain(pool);
  EXPECT_EQ(all.size(), pool.count());
  expect_all_distinct_from(pool, all);
  for (Packet* p : all) pool.put(p);
}

TEST(PacketPool, PutGetRoundTripReturnsTheSamePacket) {
  for (const std::size_t count : {std::size_t{4}, kCachedCount}) {
    PacketPool pool(count, 64);
    Packet* p = pool.get();
    ASSERT_NE(p, nullptr);
    std::memcpy(p->data(), "hello", 6);
    pool.put(p);
    // Either from this thread's cache (LIFO) or, uncached, after the other packets; taking
    // them all must include p, with its payload untouched by the pool.
    std::vector<Packet*> all = drain(pool);
    ASSERT_EQ(all.size(), count);
    EXPECT_NE(std::find(all.begin(), all.end(), p), all.end());
    EXPECT_STREQ(reinterpret_cast<const char*>(p->data()), "hello");
    for (Packet* q : all) pool.put(q);
  }
}

// Every packet, and so every payload, starts on a cache line, and payloads do not overlap
// their neighbours' metadata: fill each payload completely, then check none was disturbed
// (ASan would also flag a write past the slab).
TEST(PacketPool, PayloadsAreCacheLineAlignedAndDisjoint) {
  for (const std::size_t payload : {std::size_t{1}, std::size_t{63}, std::size_t{64}, std::size_t{65},
                                    std::size_t{100}, std::size_t{8192}}) {
    PacketPool pool(16, payload);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(pool.slab()) % 4096, 0u) << "slab is page aligned";
    EXPECT_GE(pool.slab_bytes(), pool.count() * (sizeof(Packet) + payload));
    std::vector<Packet*> all = drain(pool);
    ASSERT_EQ(all.size(), 16u);
    for (Packet* p : all) {
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % cache_line, 0u);
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p->data()) % cache_line, 0u) << "payload " << payload;
      EXPECT_EQ(p->capacity, payload);
      std::memset(p->data(), static_cast<int>(index_of(pool, p) & 0xFF), payload);
    }
    for (Packet* p : all) {
      EXPECT_EQ(p->pool, &pool) << "a neighbour's payload overwrote this packet's metadata";
      EXPECT_EQ(p->capacity, payload);
      const auto fill = static_cast<unsigned char>(index_of(pool, p) & 0xFF);
      for (std::size_t i = 0; i < payload; ++i) {
        if (p->data()[i] != fill) {
          ADD_FAILURE() << "payload byte " << i << " of packet " << index_of(pool, p) << " changed";
          break;
        }
      }
    }
    for (Packet* p : all) pool.put(p);
  }
}

TEST(PacketPool, FromDataInvertsData) {
  PacketPool pool(8, 200);
  std::vector<Packet*> all = drain(pool);
  for (Packet* p : all) {
    EXPECT_EQ(Packet::from_data(p->data()), p);
    EXPECT_EQ(p->data(), reinterpret_cast<unsigned char*>(p) + sizeof(Packet));
  }
  for (Packet* p : all) pool.put(p);
}

// release_payload is the Buffer::Release ferry uses when it hands a packet's payload to the
// application: destroying the Buffer must return the packet to its pool.
TEST(PacketPool, BufferReleaseReturnsThePacket) {
  PacketPool pool(2, 64);
  Packet* a = pool.get();
  Packet* b = pool.get();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(pool.get(), nullptr);
  {
    ferry::Buffer buffer(a->data(), 10, &PacketPool::release_payload, &pool);
    ferry::Buffer moved(std::move(buffer));
    EXPECT_EQ(pool.get(), nullptr);  // still owned by the buffer
  }
  EXPECT_EQ(pool.get(), a);
  pool.put(a);
  pool.put(b);
}

// Small pools cache nothing, so packets a thread put back are usable by another thread while
// the first one sits idle (nothing stranded in an idle thread's cache).
TEST(PacketPool, SmallPoolStrandsNothingInIdleThreads) {
  PacketPool pool(8, 64);
  std::mutex m;
  std::condition_variable cv;
  bool returned = false, finish = false;
  std::thread idle([&] {
    std::vector<Packet*> got = drain(pool);
    for (Packet* p : got) pool.put(p);
    std::unique_lock<std::mutex> lock(m);
    returned = true;
    cv.notify_all();
    cv.wait(lock, [&] { return finish; });  // stay alive: thread-exit cleanup must not matter
  });
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return returned; });
  }
  std::vector<Packet*> got = drain(pool);
  EXPECT_EQ(got.size(), 8u);
  for (Packet* p : got) pool.put(p);
  {
    std::lock_guard<std::mutex> lock(m);
    finish = true;
  }
  cv.notify_all();
  idle.join();
}

TEST(PacketPool, PutSharedBypassesTheCache) {
  PacketPool pool(kCachedCount, 64);
  Packet* p = pool.get();  // takes a batch of half a cache into this thread's cache
  ASSERT_NE(p, nullptr);
  const std::size_t batch = pool.cache_capacity() / 2;
  EXPECT_EQ(pool.available_approx(), kCachedCount - batch);
  pool.put_shared(p);
  EXPECT_EQ(pool.available_approx(), kCachedCount - batch + 1);
}

// After the first get/put on a thread (which creates its cache), the get/put pair allocates
// nothing, cached or not: it is on every message's path.
TEST(PacketPool, SteadyStateGetPutDoesNotAllocate) {
  FERRY_SKIP_UNLESS_COUNTING_ALLOCATIONS();
  for (const std::size_t count : {std::size_t{8}, kCachedCount}) {
    PacketPool pool(count, 64);
    pool.put(pool.get());  // warm up this thread's cache entry
    ferry::test::AllocationCounter allocs;
    for (int i = 0; i < 1000; ++i) {
      Packet* a = pool.get();
      Packet* b = pool.get();
      ASSERT_NE(a, nullptr);
      ASSERT_NE(b, nullptr);
      pool.put(a);
      pool.put(b);
    }
    EXPECT_EQ(allocs.count(), 0u) << "pool of " << count;
  }
}

// The process-wide slot table is finite; the error says so, and slots are reused once pools go.
TEST(PacketPool, TooManyLivePoolsThrowsAndSlotsAreReused) {
  std::vector<std::unique_ptr<PacketPool>> pools;
  bool threw = false;
  for (int i = 0; i < 1000 && !threw; ++i) {
    try {
      pools.push_back(std::make_unique<PacketPool>(1, 64));
    } catch (const ferry::Error& e) {
      threw = true;
      EXPECT_NE(std::string(e.what()).find("256"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(threw);
  EXPECT_EQ(pools.size(), 256u);
  pools.clear();
  PacketPool again(1, 64);
  EXPECT_NE(again.get(), nullptr);
}

// --- Threads and caches ---------------------------------------------------------------------

struct PoolStressParam {
  int threads;
  std::size_t count;
};

void PrintTo(const PoolStressParam& p, std::ostream* os) { *os << p.threads << " threads, " << p.count << " packets"; }

class PacketPoolStress : public testing::TestWithParam<PoolStressParam> {};

// Threads repeatedly take a random batch of packets, stamp each with (thread, round), yield so
// other threads run, check the stamp, and put the batch back (mostly via the cache, sometimes
// straight to the ring). A packet handed to two holders at once shows up either in the owner
// table or as an overwritten stamp.
TEST_P(PacketPoolStress, NoPacketHandedOutTwice) {
  const PoolStressParam param = GetParam();
  PacketPool pool(param.count, 64);
  std::vector<std::atomic<int>> owner(param.count);
  for (auto& o : owner) o.store(-1);
  const std::size_t rounds = ferry::test::scaled(20'000, 500);
  std::atomic<std::size_t> double_handout{0}, stamp_overwritten{0}, foreign{0};
  ferry::test::Gate gate;

  std::vector<std::thread> threads;
  for (int t = 0; t < param.threads; ++t) {
    threads.emplace_back([&, t] {
      gate.wait();
      std::minstd_rand rng(static_cast<unsigned>(t) + 1);
      std::vector<Packet*> held;
      for (std::size_t round = 0; round < rounds; ++round) {
        // Sometimes more than a cache holds, so whole batches move both ways.
        const std::size_t want = 1 + rng() % std::max<std::size_t>(40, 3 * pool.cache_capacity());
        while (held.size() < want) {
          Packet* p = pool.get();
          if (p == nullptr) {  // empty, or a producer mid-publish: a retry, not an error
            if (held.empty()) {
              std::this_thread::yield();
              continue;
            }
            break;
          }
          if (!in_slab(pool, p)) {
            ++foreign;
            continue;
          }
          int expected = -1;
          if (!owner[index_of(pool, p)].compare_exchange_strong(expected, t)) ++double_handout;
          const std::uint64_t stamp = (static_cast<std::uint64_t>(t) << 32) | round;
          std::memcpy(p->data(), &stamp, sizeof stamp);
          held.push_back(p);
        }
        if (round % 4 == 0) std::this_thread::yield();
        const std::uint64_t stamp = (static_cast<std::uint64_t>(t) << 32) | round;
        for (Packet* p : held) {
          std::uint64_t seen = 0;
          std::memcpy(&seen, p->data(), sizeof seen);
          if (seen != stamp) ++stamp_overwritten;
          owner[index_of(pool, p)].store(-1);
          if (rng() % 8 == 0) pool.put_shared(p); else pool.put(p);
        }
        held.clear();
      }
    });
  }
  gate.open();
  for (auto& th : threads) th.join();
  EXPECT_EQ(foreign.load(), 0u);
  EXPECT_EQ(double_handout.load(), 0u);
  EXPECT_EQ(stamp_overwritten.load(), 0u);
  // Every worker has exited, returning its cache: the whole pool is available again here.
  std::vector<Packet*> all = drain(pool);
  EXPECT_EQ(all.size(), param.count);
  expect_all_distinct_from(pool, all);
  for (Packet* p : all) pool.put(p);
}

INSTANTIATE_TEST_SUITE_P(Configs, PacketPoolStress,
                         testing::Values(PoolStressParam{4, kCachedCount}, PoolStressParam{8, 1024}, PoolStressParam{3, 4096},
                                         PoolStressParam{4, 64}),  // 64: uncached, often empty
                         [](const testing::TestParamInfo<PoolStressParam>& info) {
                           return std::to_string(info.param.threads) + "threads_" +
                                  std::to_string(info.param.count) + "packets";
                         });

// A thread's cache is returned to the pool when the thread exits (thread_local destructor):
// with every worker's cache full, the main thread can still get all `count` packets.
// The workers take their packets together, then (after a barrier) put them back together, so
// no get() is in flight while packets are returned: this test is about the exit path only,
// independent of the put/get race that PacketPool.ConcurrentGetPutLosesNoPackets covers.
TEST(PacketPool, ExitedThreadsReturnTheirCaches) {
  PacketPool pool(kCachedCount, 64);
  constexpr int kThreads = 6;
  std::mutex m;
  std::condition_variable cv;
  int taken = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      std::vector<Packet*> mine;
      for (std::size_t i = 0; i < pool.cache_capacity() * 2; ++i) {
        Packet* p = nullptr;
        while ((p = pool.get()) == nullptr) std::this_thread::yield();
        mine.push_back(p);
      }
      {
        std::unique_lock<std::mutex> lock(m);
        ++taken;
        cv.notify_all();
        cv.wait(lock, [&] { return taken == kThreads; });
      }
      for (Packet* p : mine) pool.put(p);  // the last cache_capacity() stay in this thread's cache
    });
  }
  for (auto& t : threads) t.join();
  std::vector<Packet*> all = drain(pool);
  EXPECT_EQ(all.size(), kCachedCount) << "packets stranded in exited threads' caches";
  expect_all_distinct_from(pool, all);
  for (Packet* p : all) pool.put(p);
}

// Threads get and put one packet at a time on an uncached pool, so every call goes to the
// shared list: a packet lost or duplicated by a racing pop and push shows in the final count.
TEST(PacketPool, ConcurrentGetPutLosesNoPackets) {
  constexpr std::size_t kCount = 64;
  constexpr int kThreads = 8;
  const std::size_t rounds = ferry::test::scaled(500'000, 20'000);
  PacketPool pool(kCount, 64);
  std::atomic<bool> go{false};  // start together, or early threads finish before late ones run
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      for (std::size_t r = 0; r < rounds; ++r) {
        Packet* p = nullptr;
        for (int tries = 0; (p = pool.get()) == nullptr; ++tries) {
          if (tries == 100'000) return;  // the pool leaked dry: stop, the count below reports it
          std::this_thread::yield();
        }
        pool.put(p);
      }
    });
  }
  go.store(true, std::memory_order_release);
  for (auto& th : threads) th.join();
  EXPECT_EQ(drain(pool).size(), kCount) << "packets lost by concurrent put/get";
}

// A pool makes its packets as gets need them: one batch at construction, then a batch at a
// time, every packet once, and no more than FERRY_PACKETS.
TEST(PacketPool, PacketsAreMadeAsNeeded) {
  for (const std::size_t count : {std::size_t{8}, std::size_t{100}, std::size_t{4096}}) {
    PacketPool pool(count, 64);
    EXPECT_EQ(pool.made(), std::min<std::size_t>(count, PacketPool::kGrowBatch)) << "pool of " << count;
    EXPECT_EQ(pool.available_approx(), count) << "unmade packets count as available";
    std::vector<Packet*> got;
    for (std::size_t i = 0; i < std::min<std::size_t>(count, PacketPool::kGrowBatch + 1); ++i) got.push_back(pool.get());
    if (count > PacketPool::kGrowBatch) {
      EXPECT_EQ(pool.made(), std::min<std::size_t>(count, 2 * PacketPool::kGrowBatch)) << "one batch more";
    }
    std::vector<Packet*> rest = drain(pool);
    got.insert(got.end(), rest.begin(), rest.end());
    EXPECT_EQ(pool.made(), count);
    expect_all_distinct_from(pool, got);
    EXPECT_EQ(got.size(), count) << "every packet once";
    for (Packet* p : got) {
      ASSERT_TRUE(in_slab(pool, p));
      EXPECT_EQ(p->index, index_of(pool, p));
      EXPECT_EQ(p->capacity, 64u);
      EXPECT_EQ(p->pool, &pool);
    }
    for (Packet* p : got) pool.put_shared(p);
  }
}

// Threads that find the shared list empty at once grow the pool without making a packet twice.
TEST(PacketPool, ConcurrentGrowthMakesEachPacketOnce) {
  constexpr std::size_t kCount = 4096;
  constexpr int kThreads = 8;
  PacketPool pool(kCount, 64);
  std::atomic<bool> go{false};
  std::vector<std::vector<Packet*>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      while (Packet* p = pool.get()) got[static_cast<std::size_t>(t)].push_back(p);
    });
  }
  go.store(true, std::memory_order_release);
  for (auto& th : threads) th.join();
  std::vector<Packet*> all;
  for (auto& g : got) all.insert(all.end(), g.begin(), g.end());
  EXPECT_EQ(pool.made(), kCount);
  EXPECT_EQ(all.size(), kCount);
  expect_all_distinct_from(pool, all);
  for (Packet* p : all) pool.put_shared(p);
}

// A pool destroyed and replaced (same cache slot, since slots are reused lowest-first) must
// not see the old pool's packets still sitting in a thread's cache.
TEST(PacketPool, NewPoolInSameSlotIgnoresStaleCache) {
  auto old_pool = std::make_unique<PacketPool>(kCachedCount, 64);
  {
    std::vector<Packet*> got;
    for (std::size_t i = 0; i < old_pool->cache_capacity(); ++i) got.push_back(old_pool->get());
    for (Packet* p : got) old_pool->put(p);  // this thread's cache is now full of old packets
  }
  old_pool.reset();
  PacketPool pool(kCachedCount, 64);
  std::vector<Packet*> all = drain(pool);
  EXPECT_EQ(all.size(), kCachedCount) << "stale cached packets were handed out";
  expect_all_distinct_from(pool, all);
  for (Packet* p : all) pool.put(p);
}

// The same with a worker thread that stays alive across the replacement: its first get() on
// the new pool must not return the old pool's packets, and when it exits it must not push
// stale packets into the new pool.
TEST(PacketPool, LiveThreadCacheSurvivesPoolReplacement) {
  std::mutex m;
  std::condition_variable cv;
  int phase = 0;  // 0: worker fills cache; 1: pool replaced; 2: worker drained new pool
  auto wait_for = [&](int want) {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return phase >= want; });
  };
  auto advance = [&](int to) {
    std::lock_guard<std::mutex> lock(m);
    phase = to;
    cv.notify_all();
  };

  auto old_pool = std::make_unique<PacketPool>(kCachedCount, 64);
  std::unique_ptr<PacketPool> new_pool;
  std::vector<Packet*> worker_got;
  std::thread worker([&] {
    std::vector<Packet*> got;
    for (std::size_t i = 0; i < old_pool->cache_capacity(); ++i) got.push_back(old_pool->get());
    for (Packet* p : got) old_pool->put(p);
    advance(1);
    wait_for(2);
    worker_got = drain(*new_pool);  // must be new_pool's packets only, each once
    for (Packet* p : worker_got) new_pool->put_shared(p);
    advance(3);
    wait_for(4);
    // Exits with an empty cache for the new pool: its exit returns nothing.
  });
  wait_for(1);
  old_pool.reset();
  new_pool = std::make_unique<PacketPool>(kCachedCount, 64);
  advance(2);
  wait_for(3);
  EXPECT_EQ(worker_got.size(), kCachedCount);
  expect_all_distinct_from(*new_pool, worker_got);

  // The main thread now holds every packet; the worker's exit must add nothing to the ring.
  std::vector<Packet*> mine = drain(*new_pool);
  EXPECT_EQ(mine.size(), kCachedCount);
  advance(4);
  worker.join();
  EXPECT_EQ(new_pool->get(), nullptr) << "the exiting worker returned packets it did not hold";
  for (Packet* p : mine) new_pool->put(p);
}

// A worker exits after its pool was destroyed: its cache entry must be discarded, not
// dereferenced (ASan catches a use-after-free here) or pushed into an unrelated pool.
TEST(PacketPool, ThreadExitAfterPoolDestroyed) {
  std::mutex m;
  std::condition_variable cv;
  bool cached = false, destroyed = false;
  auto pool = std::make_unique<PacketPool>(kCachedCount, 64);
  std::thread worker([&] {
    std::vector<Packet*> got;
    for (std::size_t i = 0; i < pool->cache_capacity(); ++i) got.push_back(pool->get());
    for (Packet* p : got) pool->put(p);
    std::unique_lock<std::mutex> lock(m);
    cached = true;
    cv.notify_all();
    cv.wait(lock, [&] { return destroyed; });
  });
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return cached; });
  }
  pool.reset();
  // Another pool in the slot, fully drained by this thread, so any stale push would show.
  PacketPool other(kCachedCount, 64);
  std::vector<Packet*> held = drain(other);
  ASSERT_EQ(held.size(), kCachedCount);
  {
    std::lock_guard<std::mutex> lock(m);
    destroyed = true;
  }
  cv.notify_all();
  worker.join();
  EXPECT_EQ(other.get(), nullptr);
  for (Packet* p : held) other.put(p);
}

}  // namespace

namespace {

// Whole pages of [p, p + n): what trim can give back of one payload.
std::size_t whole_pages(const unsigned char* p, std::size_t n) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t begin = (a + 4095) / 4096 * 4096, end = (a + n) / 4096 * 4096;
  return end > begin ? (end - begin) / 4096 : 0;
}

}  // namespace

// trim gives back exactly the whole pages inside the payloads of the shared list's packets,
// keeps every packet (the same set comes out again, headers intact), and leaves the payloads
// writable; packets handed out at the time are not touched.
TEST(PacketPool, TrimGivesBackTheFreePayloadsPagesAndKeepsEveryPacket) {
  for (const std::size_t count : {std::size_t{64}, kCachedCount}) {
    PacketPool pool(count, 3 * 4096);
    std::vector<Packet*> got = drain(pool);
    ASSERT_EQ(got.size(), count);
    for (Packet* p : got) std::memset(p->data(), 0x5A, pool.payload_size());
    Packet* kept = got.back();  // stays handed out across the trim
    got.pop_back();
    for (Packet* p : got) pool.put_shared(p);  // all in the shared list, none in a cache
    std::size_t pages = 0;
    for (const Packet* p : got) pages += whole_pages(const_cast<Packet*>(p)->data(), pool.payload_size());
    EXPECT_EQ(pool.trim(), pages * 4096) << count << " packets";
    EXPECT_EQ(pool.available_approx(), count - 1);
    EXPECT_EQ(kept->data()[pool.payload_size() / 2], 0x5A) << "a packet handed out keeps its bytes";
    std::vector<Packet*> again = drain(pool);
    ASSERT_EQ(again.size(), count - 1);
    expect_all_distinct_from(pool, again);
    EXPECT_EQ(std::set<Packet*>(got.begin(), got.end()), std::set<Packet*>(again.begin(), again.end()));
    for (Packet* p : again) {
      EXPECT_EQ(p->capacity, pool.payload_size());
      std::memset(p->data(), 0x33, pool.payload_size());
      EXPECT_EQ(p->data()[pool.payload_size() - 1], 0x33);
      pool.put(p);
    }
    pool.put(kept);
  }
}
