// ring_test.cpp — MpmcRing: the bounded MPMC queue under CompletionQueue and PacketPool.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "alloc_counter.hpp"
#include "common/mpmc_ring.hpp"
#include "test_scale.hpp"

namespace {

using ferry::detail::MpmcRing;

TEST(MpmcRing, FifoSingleThreaded) {
  MpmcRing<int> ring(8);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(ring.try_push(i));
  for (int i = 0; i < 8; ++i) {
    int v = -1;
    ASSERT_TRUE(ring.try_pop(v));
    EXPECT_EQ(v, i);
  }
}

// Many laps around a small ring with a varying fill level: the per-cell sequence numbers
// must keep handing cells between producers and consumers correctly lap after lap.
TEST(MpmcRing, FifoAcrossManyLaps) {
  MpmcRing<std::uint64_t> ring(4);
  std::uint64_t next_in = 0, next_out = 0;
  for (int round = 0; round < 1000; ++round) {
    const int fill = 1 + round % 4;
    for (int i = 0; i < fill; ++i) ASSERT_TRUE(ring.try_push(next_in++));
    for (int i = 0; i < fill; ++i) {
      std::uint64_t v = 0;
      ASSERT_TRUE(ring.try_pop(v));
      ASSERT_EQ(v, next_out++);
    }
  }
  std::uint64_t v = 0;
  EXPECT_FALSE(ring.try_pop(v));
}

// try_take hands out the element in its cell: the cell stays taken (a push that needs it is
// refused) until the Taken is destroyed, which destroys what the caller left there; the next
// take is the next element, and an empty ring gives an empty Taken.
TEST(MpmcRing, ATakenCellIsFreedOnlyWhenTheTakenEnds) {
  MpmcRing<std::unique_ptr<int>> ring(2);
  ASSERT_TRUE(ring.try_push(std::make_unique<int>(1)));
  ASSERT_TRUE(ring.try_push(std::make_unique<int>(2)));
  {
    auto taken = ring.try_take();
    ASSERT_TRUE(taken);
    ASSERT_NE(*taken, nullptr);
    EXPECT_EQ(**taken, 1);
    EXPECT_FALSE(ring.try_push(std::make_unique<int>(3))) << "the cell is still the taker's";
    auto second = ring.try_take();
    ASSERT_TRUE(second);
    const std::unique_ptr<int> moved = std::move(*second);  // moved out; the Taken destroys the husk
    EXPECT_EQ(*moved, 2);
  }
  ASSERT_TRUE(ring.try_push(std::make_unique<int>(3)));
  ASSERT_TRUE(ring.try_push(std::make_unique<int>(4)));
  for (int expect : {3, 4}) {
    auto taken = ring.try_take();
    ASSERT_TRUE(taken);
    EXPECT_EQ(**taken, expect);
  }
  EXPECT_FALSE(ring.try_take());
}

TEST(MpmcRing, EmptyPopFailsAndLeavesOutputAlone) {
  MpmcRing<int> ring(4);
  int v = 42;
  EXPECT_FALSE(ring.try_pop(v));
  EXPECT_EQ(v, 42);
  EXPECT_EQ(ring.size_approx(), 0u);
  // Empty again after a push/pop pair.
  ASSERT_TRUE(ring.try_push(1));
  ASSERT_TRUE(ring.try_pop(v));
  EXPECT_FALSE(ring.try_pop(v));
  EXPECT_EQ(v, 1);
}

TEST(MpmcRing, FullPushFailsUntilAPop) {
  MpmcRing<int> ring(4);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(ring.try_push(i)) << i;
  EXPECT_EQ(ring.size_approx(), 4u);
  EXPECT_FALSE(ring.try_push(99));
  EXPECT_FALSE(ring.try_push(99));  // still full: a failed push must not claim a slot
  int v = -1;
  ASSERT_TRUE(ring.try_pop(v));
  EXPECT_EQ(v, 0);
  EXPECT_TRUE(ring.try_push(4));
  EXPECT_FALSE(ring.try_push(5));
  for (int want = 1; want <= 4; ++want) {
    ASSERT_TRUE(ring.try_pop(v));
    EXPECT_EQ(v, want);
  }
  EXPECT_FALSE(ring.try_pop(v));
}

// Rounded up to a power of two; the requested number of elements always fits, and exactly
// capacity() elements fit.
// try_push_batch takes the longest prefix that fits, in order, and leaves the rest (and a
// refused batch) with the caller; it works across the wrap of the ring.
TEST(MpmcRing, BatchPushTakesThePrefixThatFits) {
  MpmcRing<std::unique_ptr<int>> ring(8);
  auto batch = [](int from, int n) {
    std::vector<std::unique_ptr<int>> v;
    for (int i = 0; i < n; ++i) v.push_back(std::make_unique<int>(from + i));
    return v;
  };
  int next_out = 0;
  auto pop_expect = [&](int n) {
    for (int i = 0; i < n; ++i) {
      std::unique_ptr<int> p;
      ASSERT_TRUE(ring.try_pop(p));
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(*p, next_out++);
    }
  };
  auto a = batch(0, 5);
  EXPECT_EQ(ring.try_push_batch(a.data(), a.size()), 5u);
  for (auto& p : a) EXPECT_EQ(p, nullptr) << "a pushed item is moved-from";
  auto b = batch(5, 6);
  EXPECT_EQ(ring.try_push_batch(b.data(), b.size()), 3u);  // 3 cells left of 8
  EXPECT_EQ(b[2], nullptr);
  ASSERT_NE(b[3], nullptr);
  EXPECT_EQ(*b[3], 8) << "the refused rest stays with the caller";
  EXPECT_EQ(ring.try_push_batch(b.data() + 3, 3), 0u);  // full
  ASSERT_NE(b[3], nullptr);
  pop_expect(6);
  EXPECT_EQ(ring.try_push_batch(b.data() + 3, 3), 3u);  // across the wrap
  auto c = batch(11, 3);
  EXPECT_EQ(ring.try_push_batch(c.data(), c.size()), 3u);
  pop_expect(8);
  std::unique_ptr<int> p;
  EXPECT_FALSE(ring.try_pop(p));
  EXPECT_EQ(ring.try_push_batch(c.data(), 0), 0u);
}

// Producers push batches of 1..9 while consumers pop: nothing lost or duplicated, and each
// producer's items come out in the order it pushed them.
TEST(MpmcRing, BatchPushesFromManyThreadsKeepEachProducersOrder) {
  constexpr int kProducers = 3, kConsumers = 2;
  const std::uint64_t per_producer = ferry::test::scaled(200'000, 20'000);
  MpmcRing<std::uint64_t> ring(64);
  std::atomic<bool> go{false};
  std::atomic<std::uint64_t> popped{0};
  std::atomic<int> errors{0};
  std::vector<std::vector<std::uint64_t>> last(kConsumers, std::vector<std::uint64_t>(kProducers, 0));
  std::vector<std::thread> threads;
  for (int t = 0; t < kProducers; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      std::uint64_t next = 1;
      std::uint64_t items[9];
      while (next <= per_producer) {
        const std::size_t n = std::min<std::uint64_t>(1 + next % 9, per_producer - next + 1);
        for (std::size_t i = 0; i < n; ++i) items[i] = (static_cast<std::uint64_t>(t) << 48) | (next + i);
        std::size_t done = 0;
        while (done < n) {
          const std::size_t k = ring.try_push_batch(items + done, n - done);
          if (k == 0) std::this_thread::yield();
          done += k;
        }
        next += n;
      }
    });
  }
  const std::uint64_t total = per_producer * kProducers;
  for (int c = 0; c < kConsumers; ++c) {
    threads.emplace_back([&, c] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      while (popped.load(std::memory_order_relaxed) < total) {
        std::uint64_t v = 0;
        if (!ring.try_pop(v)) {
          std::this_thread::yield();
          continue;
        }
        popped.fetch_add(1, std::memory_order_relaxed);
        const auto producer = static_cast<std::size_t>(v >> 48);
        const std::uint64_t seq = v & ((std::uint64_t{1} << 48) - 1);
        // Per consumer, one producer's items arrive in increasing order (a consumer's pops
        // are ordered, and positions were claimed in the producer's order).
        if (producer >= kProducers || seq <= last[static_cast<std::size_t>(c)][producer]) ++errors;
        else last[static_cast<std::size_t>(c)][producer] = seq;
      }
    });
  }
  go.store(true, std::memory_order_release);
  for (auto& th : threads) th.join();
  EXPECT_EQ(popped.load(), total);
  EXPECT_EQ(errors.load(), 0);
  std::uint64_t v = 0;
  EXPECT_FALSE(ring.try_pop(v));
}

TEST(MpmcRing, CapacityRoundsUpToPowerOfTwo) {
  struct Case {
    std::size_t requested, expected;
  };
  // 1 (and 0) become 2: the sequence-number scheme needs two cells, since with one the full
  // cell's sequence would equal the next producer's position and read as free.
  for (const Case c : {Case{0, 2}, Case{1, 2}, Case{2, 2}, Case{3, 4}, Case{4, 4}, Case{5, 8},
                       Case{1000, 1024}, Case{1024, 1024}, Case{1025, 2048}}) {
    MpmcRing<int> ring(c.requested);
    EXPECT_EQ(ring.capacity(), c.expected) << "requested " << c.requested;
    std::size_t pushed = 0;
    while (ring.try_push(static_cast<int>(pushed))) ++pushed;
    EXPECT_EQ(pushed, ring.capacity()) << "requested " << c.requested;
  }
}

TEST(MpmcRing, MoveOnlyPayloads) {
  MpmcRing<std::unique_ptr<int>> ring(4);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(ring.try_push(std::make_unique<int>(i)));
  // A failed push must leave the caller's object intact, so the caller can retry it later.
  auto keep = std::make_unique<int>(100);
  EXPECT_FALSE(ring.try_push(std::move(keep)));
  ASSERT_NE(keep, nullptr);
  EXPECT_EQ(*keep, 100);
  for (int i = 0; i < 4; ++i) {
    std::unique_ptr<int> p;
    ASSERT_TRUE(ring.try_pop(p));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(*p, i);
  }
}

// Counts live instances (every constructor +1, every destructor -1, moved-from included), so
// after everything is destroyed the count must be back to zero.
struct Tracked {
  static std::atomic<int> live;
  int value = -1;
  Tracked() noexcept { ++live; }
  explicit Tracked(int v) noexcept : value(v) { ++live; }
  Tracked(Tracked&& o) noexcept : value(o.value) { ++live; }
  Tracked& operator=(Tracked&& o) noexcept {
    value = o.value;
    return *this;
  }
  ~Tracked() { --live; }
};
std::atomic<int> Tracked::live{0};

TEST(MpmcRing, DestructionDestroysQueuedItems) {
  Tracked::live = 0;
  {
    MpmcRing<Tracked> ring(8);
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(ring.try_push(Tracked(i)));
    // Pop one so the queued items do not start at cell 0.
    Tracked t;
    ASSERT_TRUE(ring.try_pop(t));
    EXPECT_EQ(t.value, 0);
    EXPECT_EQ(Tracked::live.load(), 5);  // 4 queued + t
  }
  EXPECT_EQ(Tracked::live.load(), 0);
}

// Queued unique_ptrs are freed by the destructor (LeakSanitizer would also flag a leak).
TEST(MpmcRing, DestructionFreesQueuedUniquePtrs) {
  static int deleted = 0;
  struct CountingDelete {
    void operator()(int* p) const noexcept {
      ++deleted;
      delete p;
    }
  };
  deleted = 0;
  {
    MpmcRing<std::unique_ptr<int, CountingDelete>> ring(16);
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(ring.try_push(std::unique_ptr<int, CountingDelete>(new int(i))));
  }
  EXPECT_EQ(deleted, 10);
}

// "No allocation after construction": push and pop must not call operator new.
TEST(MpmcRing, NoAllocationAfterConstruction) {
  FERRY_SKIP_UNLESS_COUNTING_ALLOCATIONS();
  MpmcRing<std::uint64_t> ring(64);
  ferry::test::AllocationCounter allocs;
  for (std::uint64_t i = 0; i < 1000; ++i) {
    ASSERT_TRUE(ring.try_push(i));
    std::uint64_t v = 0;
    ASSERT_TRUE(ring.try_pop(v));
  }
  EXPECT_EQ(allocs.count(), 0u);
}

// --- Multithreaded stress -------------------------------------------------------------------

struct StressParam {
  int producers;
  int consumers;
  std::size_t capacity;
  std::size_t items;  // total, before scaling
};

std::string stress_name(const testing::TestParamInfo<StressParam>& info) {
  return std::to_string(info.param.producers) + "p" + std::to_string(info.param.consumers) + "c_cap" +
         std::to_string(info.param.capacity);
}

// Keeps ctest's test names readable (gtest_discover_tests appends the printed parameter).
void PrintTo(const StressParam& p, std::ostream* os) {
  *os << p.producers << " producers, " << p.consumers << " consumers, capacity " << p.capacity;
}

class MpmcRingStress : public testing::TestWithParam<StressParam> {};

// P producers push tagged items (producer id, sequence) while C consumers pop until all have
// arrived. Checks: every item delivered exactly once, and each consumer sees each producer's
// items in increasing sequence order. (A producer's pushes claim increasing positions and a
// consumer's pops claim increasing positions, so per-producer FIFO holds per consumer; across
// consumers the interleaving of their observations is arbitrary.)
TEST_P(MpmcRingStress, ExactlyOnceAndPerProducerFifo) {
  const StressParam param = GetParam();
  const std::size_t per_producer = ferry::test::scaled(param.items) / static_cast<std::size_t>(param.producers);
  const std::size_t total = per_producer * static_cast<std::size_t>(param.producers);

  MpmcRing<std::uint64_t> ring(param.capacity);
  std::vector<std::atomic<std::uint8_t>> hits(total);
  std::atomic<std::size_t> consumed{0};
  std::atomic<std::size_t> order_violations{0}, bad_items{0};
  std::atomic<bool> go{false};

  std::vector<std::thread> threads;
  for (int p = 0; p < param.producers; ++p) {
    threads.emplace_back([&, p] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      for (std::size_t s = 0; s < per_producer; ++s) {
        const std::uint64_t item = (static_cast<std::uint64_t>(p) << 32) | s;
        // Full is expected with small rings: yield so a consumer (maybe on this core) drains.
        while (!ring.try_push(item)) std::this_thread::yield();
      }
    });
  }
  for (int c = 0; c < param.consumers; ++c) {
    threads.emplace_back([&] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      std::vector<std::int64_t> last(static_cast<std::size_t>(param.producers), -1);
      while (consumed.load(std::memory_order_relaxed) < total) {
        std::uint64_t item = 0;
        if (!ring.try_pop(item)) {
          std::this_thread::yield();
          continue;
        }
        consumed.fetch_add(1, std::memory_order_relaxed);
        const std::size_t p = item >> 32;
        const std::size_t s = item & 0xFFFFFFFFu;
        if (p >= static_cast<std::size_t>(param.producers) || s >= per_producer) {
          ++bad_items;
          continue;
        }
        if (static_cast<std::int64_t>(s) <= last[p]) ++order_violations;
        last[p] = static_cast<std::int64_t>(s);
        hits[p * per_producer + s].fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  go.store(true, std::memory_order_release);
  for (auto& t : threads) t.join();

  EXPECT_EQ(bad_items.load(), 0u);
  EXPECT_EQ(order_violations.load(), 0u);
  std::size_t missing = 0, duplicated = 0;
  for (std::size_t i = 0; i < total; ++i) {
    const auto h = hits[i].load(std::memory_order_relaxed);
    if (h == 0) ++missing;
    if (h > 1) ++duplicated;
  }
  EXPECT_EQ(missing, 0u);
  EXPECT_EQ(duplicated, 0u);
  std::uint64_t v = 0;
  EXPECT_FALSE(ring.try_pop(v)) << "an item was delivered beyond the total";
}

INSTANTIATE_TEST_SUITE_P(Configs, MpmcRingStress,
                         // The lopsided and tiny rings spend most of their time handing the
                         // cores back and forth (full/empty + yield), so they move fewer items.
                         testing::Values(StressParam{1, 1, 1024, 1'000'000}, StressParam{4, 4, 64, 1'000'000},
                                         StressParam{8, 8, 1024, 1'000'000}, StressParam{8, 8, 2, 100'000},
                                         StressParam{8, 1, 16, 200'000}, StressParam{1, 8, 16, 200'000}),
                         stress_name);

// The contract: a push may be refused while a preempted consumer still holds its cell, even
// with room to spare; a refused push leaves the item with the caller, and retrying succeeds
// once that consumer finishes. Tokens circulate among threads: none is ever lost.
TEST(MpmcRing, RefusedPushesKeepTheItemAndRetrySucceeds) {
  constexpr std::size_t kCapacity = 64;
  constexpr int kThreads = 8;
  const std::size_t rounds = ferry::test::scaled(500'000, 20'000);
  MpmcRing<std::uint32_t> ring(kCapacity);
  for (std::uint32_t i = 0; i < kCapacity; ++i) ASSERT_TRUE(ring.try_push(i));
  std::atomic<std::size_t> refused{0};
  std::atomic<bool> go{false};  // start together so the threads really contend
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      for (std::size_t r = 0; r < rounds; ++r) {
        std::uint32_t token = 0;
        while (!ring.try_pop(token)) std::this_thread::yield();
        const std::uint32_t mine = token;
        while (!ring.try_push(token)) {
          refused.fetch_add(1, std::memory_order_relaxed);
          ASSERT_EQ(token, mine) << "a refused push must leave the item with the caller";
          std::this_thread::yield();
        }
      }
    });
  }
  go.store(true, std::memory_order_release);
  for (auto& th : threads) th.join();
  std::vector<bool> seen(kCapacity, false);
  std::size_t left = 0;
  for (std::uint32_t token = 0; ring.try_pop(token);) {
    ASSERT_LT(token, kCapacity);
    EXPECT_FALSE(seen[token]) << "token " << token << " twice";
    seen[token] = true;
    ++left;
  }
  EXPECT_EQ(left, kCapacity) << "tokens lost (" << refused.load() << " refused pushes were retried)";
}

// Move-only payloads under contention: nothing lost, nothing freed twice (ASan), no leaks
// (LSan) when items are still queued at destruction.
TEST(MpmcRing, MoveOnlyStressWithLeftovers) {
  constexpr int kProducers = 4, kConsumers = 4;
  const std::size_t per_producer = ferry::test::scaled(100'000) / kProducers;
  const std::size_t to_consume = per_producer * kProducers - 100;  // leave 100 in the ring
  Tracked::live = 0;
  {
    MpmcRing<std::unique_ptr<Tracked>> ring(256);
    std::atomic<std::size_t> consumed{0};
    std::atomic<long long> sum{0};
    ferry::test::Gate gate;
    std::vector<std::thread> threads;
    for (int p = 0; p < kProducers; ++p) {
      threads.emplace_back([&] {
        gate.wait();
        for (std::size_t s = 0; s < per_producer; ++s) {
          auto item = std::make_unique<Tracked>(static_cast<int>(s));
          while (!ring.try_push(std::move(item))) std::this_thread::yield();
        }
      });
    }
    for (int c = 0; c < kConsumers; ++c) {
      threads.emplace_back([&] {
        gate.wait();
        for (;;) {
          // Claim a unit of work first so consumers stop at exactly to_consume items.
          std::size_t n = consumed.load(std::memory_order_relaxed);
          do {
            if (n >= to_consume) return;
          } while (!consumed.compare_exchange_weak(n, n + 1, std::memory_order_relaxed));
          std::unique_ptr<Tracked> item;
          while (!ring.try_pop(item)) std::this_thread::yield();
          sum.fetch_add(item->value, std::memory_order_relaxed);
        }
      });
    }
    gate.open();
    for (auto& t : threads) t.join();
    EXPECT_EQ(ring.size_approx(), 100u);
    EXPECT_EQ(Tracked::live.load(), 100);
  }
  EXPECT_EQ(Tracked::live.load(), 0);
}

}  // namespace
