// queue_algorithms_test.cpp — the queue algorithms behind CompletionQueue (QueueKind): every
// kind through detail::QueueImpl under stress, FaaRing and MsQueue white-box (laps around tiny
// rings and pools, refusals, leftovers), and FERRY_COMPLETION's choice of the default kind.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "alloc_counter.hpp"
#include "common/faa_ring.hpp"
#include "common/ms_queue.hpp"
#include "core/queues/queue_impl.hpp"
#include "ferry/completion.hpp"
#include "ferry/error.hpp"
#include "test_scale.hpp"

namespace {

using ferry::Completion;
using ferry::QueueKind;
using ferry::detail::FaaRing;
using ferry::detail::MsQueue;

void* id_ptr(std::uint64_t v) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(v)); }
std::uint64_t ptr_id(void* p) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)); }

// --- Every kind through QueueImpl -----------------------------------------------------------

struct KindStress {
  QueueKind kind;
  int producers;
  int consumers;
  std::size_t capacity;
  std::size_t items;  // total, before scaling
};

void PrintTo(const KindStress& p, std::ostream* os) {
  *os << ferry::to_string(p.kind) << ": " << p.producers << " producers, " << p.consumers << " consumers, capacity "
      << p.capacity;
}

class QueueImplStress : public testing::TestWithParam<KindStress> {};

// P producers push (producer, sequence) while C consumers pop until all have arrived. A refused
// push must leave the completion with the producer, which retries it (so per-producer order is
// the push order). Checks: every item exactly once, and each consumer sees each producer's items
// in increasing sequence order (FIFO for every kind: a producer's pushes are ordered, and so are
// one consumer's pops).
TEST_P(QueueImplStress, ExactlyOnceAndPerProducerFifo) {
  const KindStress param = GetParam();
  const std::size_t per_producer = ferry::test::scaled(param.items) / static_cast<std::size_t>(param.producers);
  const std::size_t total = per_producer * static_cast<std::size_t>(param.producers);
  std::unique_ptr<ferry::detail::QueueImpl> q = ferry::detail::make_queue(param.kind, param.capacity);
  ASSERT_NE(q, nullptr);
  std::vector<std::atomic<std::uint8_t>> hits(total);
  std::atomic<std::size_t> consumed{0}, order_violations{0}, bad{0}, lost_on_refusal{0};
  ferry::test::Gate gate;
  std::vector<std::thread> threads;
  for (int p = 0; p < param.producers; ++p) {
    threads.emplace_back([&, p] {
      gate.wait();
      for (std::size_t s = 0; s < per_producer; ++s) {
        const std::uint64_t item = (static_cast<std::uint64_t>(p) << 32) | s;
        Completion c;
        c.context = id_ptr(item);
        c.size = item;
        while (!q->push(std::move(c))) {
          if (ptr_id(c.context) != item || c.size != item) ++lost_on_refusal;
          std::this_thread::yield();
        }
      }
    });
  }
  for (int c = 0; c < param.consumers; ++c) {
    threads.emplace_back([&] {
      gate.wait();
      std::vector<std::int64_t> last(static_cast<std::size_t>(param.producers), -1);
      while (consumed.load(std::memory_order_relaxed) < total) {
        std::optional<Completion> popped;
        if (!q->pop(popped)) {
          std::this_thread::yield();
          continue;
        }
        const Completion& got = *popped;
        consumed.fetch_add(1, std::memory_order_relaxed);
        const std::uint64_t item = ptr_id(got.context);
        const std::size_t p = item >> 32, s = item & 0xFFFFFFFFu;
        if (got.size != item || p >= static_cast<std::size_t>(param.producers) || s >= per_producer) {
          ++bad;
          continue;
        }
        if (static_cast<std::int64_t>(s) <= last[p]) ++order_violations;
        last[p] = static_cast<std::int64_t>(s);
        hits[p * per_producer + s].fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  gate.open();
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_EQ(lost_on_refusal.load(), 0u) << "a refused push must leave the completion with the caller";
  EXPECT_EQ(order_violations.load(), 0u);
  std::size_t missing = 0, duplicated = 0;
  for (auto& h : hits) {
    const auto n = h.load(std::memory_order_relaxed);
    missing += n == 0;
    duplicated += n > 1;
  }
  EXPECT_EQ(missing, 0u);
  EXPECT_EQ(duplicated, 0u);
  std::optional<Completion> extra;
  EXPECT_FALSE(q->pop(extra)) << "an item was delivered beyond the total";
}

std::vector<KindStress> kind_stress_params() {
  std::vector<KindStress> out;
  for (const QueueKind kind : {QueueKind::ring, QueueKind::faa, QueueKind::ms, QueueKind::lock}) {
    out.push_back({kind, 1, 1, 1024, 400'000});
    out.push_back({kind, 4, 4, 64, 400'000});
    out.push_back({kind, 8, 8, 1024, 400'000});
    out.push_back({kind, 4, 4, 2, 40'000});  // tiny: laps, refusals, node reuse all the time
    out.push_back({kind, 8, 1, 16, 100'000});
    out.push_back({kind, 1, 8, 16, 100'000});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Kinds, QueueImplStress, testing::ValuesIn(kind_stress_params()),
                         [](const testing::TestParamInfo<KindStress>& info) {
                           return std::string(ferry::to_string(info.param.kind)) + "_" +
                                  std::to_string(info.param.producers) + "p" + std::to_string(info.param.consumers) +
                                  "c_cap" + std::to_string(info.param.capacity);
                         });

// --- FaaRing --------------------------------------------------------------------------------

TEST(FaaRing, FifoAndFullRefusal) {
  FaaRing<std::uint64_t> ring(4);
  ASSERT_EQ(ring.capacity(), 4u);
  for (std::uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(ring.try_push(std::uint64_t{i}));
  std::uint64_t keep = 99;
  EXPECT_FALSE(ring.try_push(std::move(keep)));  // full
  EXPECT_EQ(keep, 99u);
  for (std::uint64_t i = 0; i < 4; ++i) {
    std::uint64_t v = 0;
    ASSERT_TRUE(ring.try_pop(v));
    EXPECT_EQ(v, i);
  }
  std::uint64_t v = 7;
  EXPECT_FALSE(ring.try_pop(v));
  EXPECT_EQ(v, 7u);
  // The burnt ticket is skipped: the ring is fully usable again.
  for (std::uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(ring.try_push(std::uint64_t{100 + i}));
  for (std::uint64_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(ring.try_pop(v));
    EXPECT_EQ(v, 100 + i);
  }
  EXPECT_FALSE(ring.try_pop(v));
}

// Many laps around the smallest ring with varying fill levels, refused pushes (burnt tickets)
// and empty pops in between: the cell state words must keep handing cells over lap after lap.
TEST(FaaRing, FifoAcrossManyLapsWithRefusals) {
  FaaRing<std::uint64_t> ring(2);
  std::uint64_t next_in = 0, next_out = 0;
  const int rounds = static_cast<int>(ferry::test::scaled(100'000, 10'000));
  for (int round = 0; round < rounds; ++round) {
    const int fill = 1 + round % 3;  // 3 overfills the 2-cell ring
    for (int i = 0; i < fill; ++i) {
      std::uint64_t item = next_in;
      if (ring.try_push(std::move(item))) ++next_in;
    }
    for (;;) {
      std::uint64_t v = 0;
      if (!ring.try_pop(v)) break;
      ASSERT_EQ(v, next_out++);
    }
    ASSERT_EQ(next_out, next_in) << "round " << round;
  }
  EXPECT_GT(next_in, static_cast<std::uint64_t>(rounds));
}

// Tokens circulate through a tiny ring among many threads for many laps: refusals from
// preempted threads' cells, abandoned writes and burnt tickets all happen; none may lose or
// duplicate a token. (The "segment turnover" of this bounded LCRQ-class ring: see faa_ring.hpp.)
TEST(FaaRing, TokensSurviveManyLapsOfATinyRing) {
  constexpr std::uint32_t kTokens = 3;
  constexpr int kThreads = 6;
  const std::size_t rounds = ferry::test::scaled(200'000, 10'000);
  FaaRing<std::uint32_t> ring(4);
  for (std::uint32_t i = 0; i < kTokens; ++i) ASSERT_TRUE(ring.try_push(std::uint32_t{i}));
  ferry::test::Gate gate;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      gate.wait();
      for (std::size_t r = 0; r < rounds; ++r) {
        std::uint32_t token = 0;
        while (!ring.try_pop(token)) std::this_thread::yield();
        const std::uint32_t mine = token;
        while (!ring.try_push(std::move(token))) {
          ASSERT_EQ(token, mine);
          std::this_thread::yield();
        }
      }
    });
  }
  gate.open();
  for (auto& th : threads) th.join();
  std::vector<int> seen(kTokens, 0);
  std::uint32_t token = 0;
  std::size_t left = 0;
  while (ring.try_pop(token)) {
    ASSERT_LT(token, kTokens);
    ++seen[token];
    ++left;
  }
  EXPECT_EQ(left, kTokens);
  for (std::uint32_t i = 0; i < kTokens; ++i) EXPECT_EQ(seen[i], 1) << "token " << i;
}

TEST(FaaRing, NoAllocationAfterConstruction) {
  FERRY_SKIP_UNLESS_COUNTING_ALLOCATIONS();
  FaaRing<std::uint64_t> ring(64);
  ferry::test::AllocationCounter allocs;
  for (std::uint64_t i = 0; i < 1000; ++i) {
    ASSERT_TRUE(ring.try_push(std::uint64_t{i}));
    std::uint64_t v = 0;
    ASSERT_TRUE(ring.try_pop(v));
  }
  EXPECT_EQ(allocs.count(), 0u);
}

// --- Both algorithms: move-only payloads, leftovers destroyed --------------------------------

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

template <class Queue>
void move_only_stress_with_leftovers() {
  constexpr int kProducers = 4, kConsumers = 4;
  const std::size_t per_producer = ferry::test::scaled(100'000) / kProducers;
  const std::size_t to_consume = per_producer * kProducers - 50;  // leave 50 queued
  Tracked::live = 0;
  {
    Queue q(64);
    std::atomic<std::size_t> consumed{0};
    ferry::test::Gate gate;
    std::vector<std::thread> threads;
    for (int p = 0; p < kProducers; ++p) {
      threads.emplace_back([&] {
        gate.wait();
        for (std::size_t s = 0; s < per_producer; ++s) {
          auto item = std::make_unique<Tracked>(static_cast<int>(s));
          while (!q.try_push(std::move(item))) std::this_thread::yield();
        }
      });
    }
    for (int c = 0; c < kConsumers; ++c) {
      threads.emplace_back([&] {
        gate.wait();
        for (;;) {
          std::size_t n = consumed.load(std::memory_order_relaxed);
          do {
            if (n >= to_consume) return;
          } while (!consumed.compare_exchange_weak(n, n + 1, std::memory_order_relaxed));
          std::unique_ptr<Tracked> item;
          while (!q.try_pop(item)) std::this_thread::yield();
          ASSERT_NE(item, nullptr);
        }
      });
    }
    gate.open();
    for (auto& t : threads) t.join();
    EXPECT_EQ(Tracked::live.load(), 50);
  }
  EXPECT_EQ(Tracked::live.load(), 0);  // the destructor destroyed the leftovers
}

TEST(FaaRing, MoveOnlyStressWithLeftovers) { move_only_stress_with_leftovers<FaaRing<std::unique_ptr<Tracked>>>(); }
TEST(MsQueue, MoveOnlyStressWithLeftovers) { move_only_stress_with_leftovers<MsQueue<std::unique_ptr<Tracked>>>(); }

// --- MsQueue --------------------------------------------------------------------------------

TEST(MsQueue, FifoAndPoolExhaustion) {
  MsQueue<std::uint64_t> q(4);
  ASSERT_EQ(q.capacity(), 4u);
  for (std::uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(q.try_push(std::uint64_t{i}));
  std::uint64_t keep = 99;
  EXPECT_FALSE(q.try_push(std::move(keep)));  // every node is in use
  EXPECT_EQ(keep, 99u);
  std::uint64_t v = 0;
  ASSERT_TRUE(q.try_pop(v));
  EXPECT_EQ(v, 0u);
  EXPECT_TRUE(q.try_push(std::uint64_t{4}));  // the freed node came back (exactly capacity fit)
  for (std::uint64_t i = 1; i <= 4; ++i) {
    ASSERT_TRUE(q.try_pop(v));
    EXPECT_EQ(v, i);
  }
  EXPECT_FALSE(q.try_pop(v));
}

// Many laps through the smallest pool: every node is reused over and over (tags, releases).
TEST(MsQueue, NodeReuseAcrossManyLaps) {
  MsQueue<std::uint64_t> q(2);
  std::uint64_t next_in = 0, next_out = 0;
  for (int round = 0; round < 10'000; ++round) {
    const int fill = 1 + round % 2;
    for (int i = 0; i < fill; ++i) ASSERT_TRUE(q.try_push(std::uint64_t{next_in++}));
    for (int i = 0; i < fill; ++i) {
      std::uint64_t v = 0;
      ASSERT_TRUE(q.try_pop(v));
      ASSERT_EQ(v, next_out++);
    }
  }
  std::uint64_t v = 0;
  EXPECT_FALSE(q.try_pop(v));
}

TEST(MsQueue, TokensSurviveManyLapsOfATinyPool) {
  constexpr std::uint32_t kTokens = 2;
  constexpr int kThreads = 6;
  const std::size_t rounds = ferry::test::scaled(200'000, 10'000);
  MsQueue<std::uint32_t> q(2);
  for (std::uint32_t i = 0; i < kTokens; ++i) ASSERT_TRUE(q.try_push(std::uint32_t{i}));
  ferry::test::Gate gate;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      gate.wait();
      for (std::size_t r = 0; r < rounds; ++r) {
        std::uint32_t token = 0;
        while (!q.try_pop(token)) std::this_thread::yield();
        // A pool node may still await its second release from a slow consumer: retry.
        while (!q.try_push(std::move(token))) std::this_thread::yield();
      }
    });
  }
  gate.open();
  for (auto& th : threads) th.join();
  std::vector<int> seen(kTokens, 0);
  std::uint32_t token = 0;
  std::size_t left = 0;
  while (q.try_pop(token)) {
    ASSERT_LT(token, kTokens);
    ++seen[token];
    ++left;
  }
  EXPECT_EQ(left, kTokens);
}

TEST(MsQueue, NoAllocationAfterConstruction) {
  FERRY_SKIP_UNLESS_COUNTING_ALLOCATIONS();
  MsQueue<std::uint64_t> q(64);
  ferry::test::AllocationCounter allocs;
  for (std::uint64_t i = 0; i < 1000; ++i) {
    ASSERT_TRUE(q.try_push(std::uint64_t{i}));
    std::uint64_t v = 0;
    ASSERT_TRUE(q.try_pop(v));
  }
  EXPECT_EQ(allocs.count(), 0u);
}

// --- FERRY_COMPLETION chooses the default kind ----------------------------------------------

class CompletionEnv : public testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = std::getenv("FERRY_COMPLETION")) saved_ = v;
  }
  void TearDown() override {
    if (saved_) ::setenv("FERRY_COMPLETION", saved_->c_str(), 1); else ::unsetenv("FERRY_COMPLETION");
  }
  std::optional<std::string> saved_;
};

TEST_F(CompletionEnv, DefaultKindFollowsFerryCompletion) {
  EXPECT_EQ(ferry::CompletionQueueOptions{}.kind, QueueKind::default_kind);
  ASSERT_EQ(::unsetenv("FERRY_COMPLETION"), 0);
  const QueueKind cq = ferry::default_queue_kind();
  EXPECT_TRUE(cq == QueueKind::faa || cq == QueueKind::ring) << ferry::to_string(cq);
  ASSERT_EQ(::setenv("FERRY_COMPLETION", "cq", 1), 0);
  EXPECT_EQ(ferry::default_queue_kind(), cq);
  ASSERT_EQ(::setenv("FERRY_COMPLETION", "cq_ms", 1), 0);
  EXPECT_EQ(ferry::default_queue_kind(), QueueKind::ms);
  ASSERT_EQ(::setenv("FERRY_COMPLETION", "cq_lock", 1), 0);
  EXPECT_EQ(ferry::default_queue_kind(), QueueKind::lock);
  ferry::CompletionQueue q;  // made with the lock kind: works like any other
  q.signal(Completion{});
  EXPECT_TRUE(q.pop().has_value());
  EXPECT_FALSE(q.pop().has_value());
}

TEST_F(CompletionEnv, InvalidValueNamesVariableValueAndValidOnes) {
  ASSERT_EQ(::setenv("FERRY_COMPLETION", "lcrq", 1), 0);
  try {
    ferry::CompletionQueue q;
    FAIL() << "FERRY_COMPLETION=lcrq must be refused";
  } catch (const ferry::Error& e) {
    const std::string what = e.what();
    for (const char* part : {"FERRY_COMPLETION", "lcrq", "cq", "cq_ms", "cq_lock"}) {
      EXPECT_NE(what.find(part), std::string::npos) << what;
    }
  }
  // An explicit kind does not consult the variable.
  ferry::CompletionQueueOptions o;
  o.kind = QueueKind::ms;
  EXPECT_NO_THROW(ferry::CompletionQueue{o});
}

TEST(QueueKindNames, EveryKindHasAName) {
  EXPECT_STREQ(ferry::to_string(QueueKind::ring), "ring");
  EXPECT_STREQ(ferry::to_string(QueueKind::faa), "faa");
  EXPECT_STREQ(ferry::to_string(QueueKind::ms), "ms");
  EXPECT_STREQ(ferry::to_string(QueueKind::lock), "lock");
  EXPECT_STREQ(ferry::to_string(QueueKind::default_kind), "default");
}

}  // namespace
