// completion_queue_test.cpp — the public completion objects (CompletionQueue, Synchronizer,
// Handler) and Buffer, exercised directly through signal() as progress() would.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "alloc_counter.hpp"
#include "ferry/completion.hpp"
#include "ferry/error.hpp"
#include "ferry/status.hpp"
#include "test_scale.hpp"

namespace {

using ferry::Buffer;
using ferry::Completion;
using ferry::CompletionQueue;
using ferry::CompletionQueueOptions;
using ferry::QueueKind;

// Completions are identified by their context pointer, which ferry passes through untouched.
void* tag_ptr(std::uint64_t v) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(v)); }
std::uint64_t ptr_tag(void* p) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)); }

Completion make(std::uint64_t id) {
  Completion c;
  c.op = ferry::OpKind::recv;
  c.rank = static_cast<int>(id % 7);
  c.tag = static_cast<ferry::Tag>(id % 13);
  c.size = id;
  c.context = tag_ptr(id);
  return c;
}

// Counts Buffer releases per owner so a test can tell "released exactly once" apart from
// "never" and "twice".
struct ReleaseLog {
  std::atomic<int> calls{0};
  std::atomic<void*> last_data{nullptr};
  static void release(void* owner, void* data) noexcept {
    auto* log = static_cast<ReleaseLog*>(owner);
    log->calls.fetch_add(1, std::memory_order_relaxed);
    log->last_data.store(data, std::memory_order_relaxed);
  }
};

// --- CompletionQueue ------------------------------------------------------------------------
// Every test below runs once per queue algorithm (QueueKind).

const QueueKind kAllKinds[] = {QueueKind::ring, QueueKind::faa, QueueKind::ms, QueueKind::lock};

class CompletionQueueKinds : public testing::TestWithParam<QueueKind> {
 protected:
  CompletionQueueOptions options(std::size_t capacity) const {
    CompletionQueueOptions o;
    o.capacity = capacity;
    o.kind = GetParam();
    return o;
  }
};

std::string kind_name(const testing::TestParamInfo<QueueKind>& info) { return ferry::to_string(info.param); }

TEST_P(CompletionQueueKinds, CapacityRoundsUpToPowerOfTwo) {
  EXPECT_EQ(CompletionQueue(options(4)).capacity(), 4u);
  EXPECT_EQ(CompletionQueue(options(5)).capacity(), 8u);
  EXPECT_EQ(CompletionQueue(options(1000)).capacity(), 1024u);
}

// capacity 0 means "use FERRY_CQ_CAPACITY", defaulting to 65536.
TEST_P(CompletionQueueKinds, DefaultCapacityComesFromEnvironment) {
  // Restore the caller's setting afterwards, whatever happens in between.
  struct Restore {
    std::optional<std::string> saved;
    ~Restore() {
      if (saved) ::setenv("FERRY_CQ_CAPACITY", saved->c_str(), 1); else ::unsetenv("FERRY_CQ_CAPACITY");
    }
  } restore;
  if (const char* v = std::getenv("FERRY_CQ_CAPACITY")) restore.saved = v;
  ASSERT_EQ(::unsetenv("FERRY_CQ_CAPACITY"), 0);
  EXPECT_EQ(CompletionQueue(options(0)).capacity(), 65536u);
  ASSERT_EQ(::setenv("FERRY_CQ_CAPACITY", "1k", 1), 0);
  EXPECT_EQ(CompletionQueue(options(0)).capacity(), 1024u);
  ASSERT_EQ(::setenv("FERRY_CQ_CAPACITY", "1", 1), 0);  // below the minimum of 2
  EXPECT_THROW(CompletionQueue(options(0)), ferry::Error);
  ASSERT_EQ(::setenv("FERRY_CQ_CAPACITY", "lots", 1), 0);
  EXPECT_THROW(CompletionQueue(options(0)), ferry::Error);
}

TEST_P(CompletionQueueKinds, EmptyPopReturnsNothing) {
  CompletionQueue q(options(8));
  EXPECT_FALSE(q.pop().has_value());
}

TEST_P(CompletionQueueKinds, SignalThenPopCarriesEveryField) {
  CompletionQueue q(options(8));
  for (std::uint64_t i = 0; i < 8; ++i) q.signal(make(i));
  for (std::uint64_t i = 0; i < 8; ++i) {
    std::optional<Completion> c = q.pop();
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(ptr_tag(c->context), i);  // within capacity: FIFO
    EXPECT_EQ(c->op, ferry::OpKind::recv);
    EXPECT_EQ(c->rank, static_cast<int>(i % 7));
    EXPECT_EQ(c->tag, i % 13);
    EXPECT_EQ(c->size, i);
    EXPECT_TRUE(c->ok());
  }
  EXPECT_FALSE(q.pop().has_value());
}

// A full queue spills into the overflow list: nothing is dropped and signal() never waits.
TEST_P(CompletionQueueKinds, OverflowLosesNothing) {
  CompletionQueue q(options(4));
  ASSERT_EQ(q.capacity(), 4u);
  constexpr std::uint64_t kSignals = 1000;
  for (std::uint64_t i = 0; i < kSignals; ++i) q.signal(make(i));
  std::vector<int> seen(kSignals, 0);
  std::uint64_t popped = 0;
  while (std::optional<Completion> c = q.pop()) {
    const std::uint64_t id = ptr_tag(c->context);
    ASSERT_LT(id, kSignals);
    ++seen[id];
    ++popped;
  }
  EXPECT_EQ(popped, kSignals);
  for (std::uint64_t i = 0; i < kSignals; ++i) EXPECT_EQ(seen[i], 1) << "completion " << i;
}

// Overflow interleaved with pops: after a spill, pops free ring space while spilled entries
// still wait. One producer's completions must still come out exactly once and in the order
// signalled (a later signal that found ring space must not overtake a spilled one).
TEST_P(CompletionQueueKinds, OverflowInterleavedWithPopsKeepsOrder) {
  CompletionQueue q(options(4));
  std::uint64_t next = 0, expect = 0;
  auto take = [&](std::optional<Completion>&& c) {
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(ptr_tag(c->context), expect) << "popped out of order";
    expect = ptr_tag(c->context) + 1;
  };
  for (int round = 0; round < 100; ++round) {
    for (int i = 0; i < 20; ++i) q.signal(make(next++));
    for (int i = 0; i < 10; ++i) take(q.pop());
  }
  while (expect < next) take(q.pop());
  EXPECT_FALSE(q.pop().has_value());
}

// A capacity above the hot tier (1024 entries) adds a cold queue before the overflow list.
// One producer fills all three tiers while the consumer now and then takes some; through
// signal and signal_batch alike, every entry comes out once and in the order signalled.
TEST_P(CompletionQueueKinds, TiersKeepOrder) {
  CompletionQueue q(options(2048));
  ASSERT_EQ(q.capacity(), 2048u);
  std::uint64_t next = 0, expect = 0;
  auto take = [&](std::optional<Completion>&& c) {
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(ptr_tag(c->context), expect) << "popped out of order";
    expect = ptr_tag(c->context) + 1;
  };
  std::vector<Completion> run;
  for (int round = 0; round < 100; ++round) {
    for (int i = 0; i < 30; ++i) q.signal(make(next++));
    run.clear();
    for (int i = 0; i < 20; ++i) run.push_back(make(next++));
    q.signal_batch(run.data(), run.size());
    for (int i = 0; i < 15; ++i) take(q.pop());  // 3500 in, 1500 out: every tier is used
  }
  while (expect < next) take(q.pop());
  EXPECT_FALSE(q.pop().has_value());
}

// A consumer that found the hot queue empty and is preempted before it looks at the later
// tiers must not, once it runs again, take a later tier's entry while the hot queue holds
// older ones: the producer may have filled the hot queue and spilled past it meanwhile. Both
// threads share one CPU (when the host lets them), so the consumer, spinning on an empty
// queue, is preempted at a random point of pop() and the producer's burst of more than the
// hot queue holds runs while it sleeps. Capacity 1024 spills straight to the overflow list,
// 4096 to the cold queue first.
TEST_P(CompletionQueueKinds, APreemptedConsumerNeverTakesALaterTierFirst) {
  for (const std::size_t capacity : {std::size_t{1024}, std::size_t{4096}}) {
    CompletionQueue q(options(capacity));
    constexpr std::uint64_t kBurst = 1500;  // past the hot tier (1024)
    const auto bursts = static_cast<std::uint64_t>(ferry::test::scaled(60, 20));
    std::atomic<std::uint64_t> popped{0};
    std::atomic<long> out_of_order{0};
    std::atomic<bool> done{false};
    cpu_set_t one;
    CPU_ZERO(&one);
    const int cpu = sched_getcpu();
    CPU_SET(cpu < 0 ? 0 : cpu, &one);
    auto pin = [&] { (void)pthread_setaffinity_np(pthread_self(), sizeof one, &one); };  // best effort
    std::thread consumer([&] {
      pin();
      std::uint64_t expect = 0;
      while (!done.load(std::memory_order_acquire) || popped.load(std::memory_order_relaxed) < bursts * kBurst) {
        std::optional<Completion> c = q.pop();
        if (!c) continue;
        if (ptr_tag(c->context) != expect) out_of_order.fetch_add(1, std::memory_order_relaxed);
        expect = ptr_tag(c->context) + 1;
        popped.fetch_add(1, std::memory_order_release);
      }
    });
    std::thread producer([&] {
      pin();
      std::uint64_t next = 0;
      for (std::uint64_t b = 0; b < bursts; ++b) {
        for (std::uint64_t i = 0; i < kBurst; ++i) q.signal(make(next++));
        while (popped.load(std::memory_order_acquire) < next) std::this_thread::yield();
      }
      done.store(true, std::memory_order_release);
    });
    producer.join();
    consumer.join();
    EXPECT_EQ(out_of_order.load(), 0) << "capacity " << capacity << ": " << out_of_order.load()
                                      << " entries popped out of order";
    EXPECT_EQ(popped.load(), bursts * kBurst);
  }
}

// Buffers travel with completions: the popper owns them, and whatever is still queued (in the
// ring or in the overflow list) is released when the queue is destroyed, exactly once.
TEST_P(CompletionQueueKinds, BuffersReleasedExactlyOnce) {
  ReleaseLog popped_log, queued_log;
  int payload = 0;
  {
    CompletionQueue q(options(2));
    Completion first = make(0);
    first.buffer = Buffer(&payload, sizeof payload, &ReleaseLog::release, &popped_log);
    q.signal(std::move(first));
    for (std::uint64_t i = 1; i < 6; ++i) {  // 1 more in the ring, 4 in the overflow list
      Completion c = make(i);
      c.buffer = Buffer(&payload, sizeof payload, &ReleaseLog::release, &queued_log);
      c.parts.emplace_back(&payload, sizeof payload, &ReleaseLog::release, &queued_log);
      q.signal(std::move(c));
    }
    EXPECT_EQ(popped_log.calls.load(), 0);
    EXPECT_EQ(queued_log.calls.load(), 0);  // moving through the queue releases nothing
    {
      std::optional<Completion> c = q.pop();
      ASSERT_TRUE(c.has_value());
      ASSERT_EQ(ptr_tag(c->context), 0u);
      EXPECT_TRUE(c->buffer);
      EXPECT_EQ(c->buffer.data(), &payload);
      EXPECT_EQ(popped_log.calls.load(), 0);
    }
    EXPECT_EQ(popped_log.calls.load(), 1);
  }
  EXPECT_EQ(popped_log.calls.load(), 1);
  EXPECT_EQ(queued_log.calls.load(), 10);  // 5 completions x (buffer + 1 part)
}

// The fast path (room in the ring) allocates nothing: signal() runs inside progress().
TEST_P(CompletionQueueKinds, FastPathDoesNotAllocate) {
  if (GetParam() == QueueKind::lock) GTEST_SKIP() << "the locked deque allocates a block every few entries";
  FERRY_SKIP_UNLESS_COUNTING_ALLOCATIONS();
  CompletionQueue q(options(64));
  ferry::test::AllocationCounter allocs;
  for (std::uint64_t i = 0; i < 1000; ++i) {
    q.signal(make(i));
    std::optional<Completion> c = q.pop();
    ASSERT_TRUE(c.has_value());
  }
  EXPECT_EQ(allocs.count(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Kinds, CompletionQueueKinds, testing::ValuesIn(kAllKinds), kind_name);

struct CqStressParam {
  int producers;
  int consumers;
  std::size_t capacity;
  QueueKind kind;
};

void PrintTo(const CqStressParam& p, std::ostream* os) {
  *os << ferry::to_string(p.kind) << ": " << p.producers << " producers, " << p.consumers << " consumers, capacity "
      << p.capacity;
}

std::vector<CqStressParam> cq_stress_params() {
  std::vector<CqStressParam> out;
  for (const QueueKind kind : kAllKinds) {
    for (const CqStressParam p : {CqStressParam{4, 4, 1024, kind}, CqStressParam{4, 2, 8, kind},
                                  CqStressParam{8, 8, 4, kind}, CqStressParam{1, 4, 65536, kind}}) {
      out.push_back(p);
    }
  }
  return out;
}

class CompletionQueueStress : public testing::TestWithParam<CqStressParam> {};

// Producer threads signal (as several progress threads would), consumer threads pop; every
// completion must come out exactly once. A small capacity keeps the overflow path busy too.
TEST_P(CompletionQueueStress, ExactlyOnce) {
  const CqStressParam param = GetParam();
  const std::size_t per_producer = ferry::test::scaled(1'000'000) / static_cast<std::size_t>(param.producers);
  const std::size_t total = per_producer * static_cast<std::size_t>(param.producers);
  CompletionQueueOptions options;
  options.capacity = param.capacity;
  options.kind = param.kind;
  CompletionQueue q(options);
  std::vector<std::atomic<std::uint8_t>> hits(total);
  std::atomic<std::size_t> consumed{0}, bad{0};
  ferry::test::Gate gate;

  std::vector<std::thread> threads;
  for (int p = 0; p < param.producers; ++p) {
    threads.emplace_back([&, p] {
      gate.wait();
      for (std::size_t s = 0; s < per_producer; ++s) q.signal(make(p * per_producer + s));
    });
  }
  for (int c = 0; c < param.consumers; ++c) {
    threads.emplace_back([&] {
      gate.wait();
      while (consumed.load(std::memory_order_relaxed) < total) {
        std::optional<Completion> got = q.pop();
        if (!got) {
          std::this_thread::yield();
          continue;
        }
        consumed.fetch_add(1, std::memory_order_relaxed);
        const std::uint64_t id = ptr_tag(got->context);
        if (id >= total || got->size != id) {
          ++bad;
          continue;
        }
        hits[id].fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  gate.open();
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0u);
  std::size_t missing = 0, duplicated = 0;
  for (auto& h : hits) {
    const auto n = h.load(std::memory_order_relaxed);
    missing += n == 0;
    duplicated += n > 1;
  }
  EXPECT_EQ(missing, 0u);
  EXPECT_EQ(duplicated, 0u);
  EXPECT_FALSE(q.pop().has_value());
}

INSTANTIATE_TEST_SUITE_P(Configs, CompletionQueueStress, testing::ValuesIn(cq_stress_params()),
                         [](const testing::TestParamInfo<CqStressParam>& info) {
                           return std::string(ferry::to_string(info.param.kind)) + "_" +
                                  std::to_string(info.param.producers) + "p" +
                                  std::to_string(info.param.consumers) + "c_cap" +
                                  std::to_string(info.param.capacity);
                         });

// --- Synchronizer ---------------------------------------------------------------------------

TEST(Synchronizer, ZeroThrows) {
  try {
    ferry::Synchronizer s(0);
    FAIL() << "Synchronizer(0) must throw";
  } catch (const ferry::Error& e) {
    EXPECT_NE(std::string(e.what()).find("n=0"), std::string::npos) << e.what();
  }
}

TEST(Synchronizer, DefaultCountsOne) {
  ferry::Synchronizer s;
  EXPECT_FALSE(s.test());
  EXPECT_EQ(s.count(), 0u);
  s.signal(make(7));
  EXPECT_TRUE(s.test());
  EXPECT_EQ(s.count(), 1u);
  ASSERT_EQ(s.results().size(), 1u);
  EXPECT_EQ(ptr_tag(s.results()[0].context), 7u);
  EXPECT_EQ(s.results()[0].size, 7u);
}

TEST(Synchronizer, TrueOnlyAfterAllN) {
  constexpr std::size_t kN = 5;
  ferry::Synchronizer s(kN);
  for (std::size_t i = 0; i < kN; ++i) {
    EXPECT_FALSE(s.test()) << "after " << i << " signals";
    s.signal(make(i));
    EXPECT_EQ(s.count(), i + 1);
  }
  EXPECT_TRUE(s.test());
  // results() are in arrival order.
  for (std::size_t i = 0; i < kN; ++i) EXPECT_EQ(ptr_tag(s.results()[i].context), i);
}

// n threads signal concurrently; the waiter polls test() and then reads results() without any
// other synchronization, which is what the acquire in test() must make safe (TSan checks it).
TEST(Synchronizer, ConcurrentSignals) {
  const int rounds = static_cast<int>(ferry::test::scaled(200, 20));
  for (const std::size_t n : {std::size_t{2}, std::size_t{8}, std::size_t{16}}) {
    ferry::Synchronizer s(n);
    for (int round = 0; round < rounds; ++round) {
      std::vector<std::thread> threads;
      for (std::size_t t = 0; t < n; ++t) threads.emplace_back([&s, t] { s.signal(make(t)); });
      while (!s.test()) std::this_thread::yield();
      EXPECT_EQ(s.count(), n);
      std::set<std::uint64_t> ids;
      for (Completion& c : s.results()) {
        ids.insert(ptr_tag(c.context));
        EXPECT_EQ(c.size, ptr_tag(c.context));  // the whole record was published, not just the pointer
      }
      EXPECT_EQ(ids.size(), n);
      EXPECT_EQ(*ids.rbegin(), n - 1);
      for (auto& t : threads) t.join();
      s.reset();
      ASSERT_FALSE(s.test());
    }
  }
}

TEST(Synchronizer, ResetMakesItReusable) {
  ferry::Synchronizer s(2);
  s.signal(make(1));
  s.signal(make(2));
  ASSERT_TRUE(s.test());
  s.reset();
  EXPECT_FALSE(s.test());
  EXPECT_EQ(s.count(), 0u);
  ASSERT_EQ(s.results().size(), 2u);
  for (const Completion& c : s.results()) EXPECT_EQ(c.context, nullptr);  // old results cleared
  s.signal(make(3));
  EXPECT_FALSE(s.test());
  s.signal(make(4));
  EXPECT_TRUE(s.test());
  EXPECT_EQ(ptr_tag(s.results()[0].context), 3u);
  EXPECT_EQ(ptr_tag(s.results()[1].context), 4u);
}

// A result's Buffer is released once: by reset() (which clears the slots) or by destruction.
TEST(Synchronizer, ResultBuffersReleasedOnce) {
  ReleaseLog log;
  int payload = 0;
  {
    ferry::Synchronizer s(1);
    Completion c = make(1);
    c.buffer = Buffer(&payload, 4, &ReleaseLog::release, &log);
    s.signal(std::move(c));
    EXPECT_EQ(log.calls.load(), 0);
    s.reset();
    EXPECT_EQ(log.calls.load(), 1);
    Completion d = make(2);
    d.buffer = Buffer(&payload, 4, &ReleaseLog::release, &log);
    s.signal(std::move(d));
  }
  EXPECT_EQ(log.calls.load(), 2);
}

// --- Handler --------------------------------------------------------------------------------

TEST(Handler, RunsCallbackSynchronouslyWithTheCompletion) {
  std::vector<std::uint64_t> got;
  std::thread::id ran_on;
  ferry::Handler h([&](Completion&& c) {
    got.push_back(ptr_tag(c.context));
    ran_on = std::this_thread::get_id();
  });
  h.signal(make(11));
  ASSERT_EQ(got.size(), 1u);  // ran before signal() returned
  EXPECT_EQ(got[0], 11u);
  EXPECT_EQ(ran_on, std::this_thread::get_id());  // on the signalling thread
  h.signal(make(12));
  EXPECT_EQ(got.size(), 2u);
}

Completion with_buffer(std::uint64_t id, ReleaseLog& log, void* payload) {
  Completion c = make(id);
  c.buffer = Buffer(payload, 4, &ReleaseLog::release, &log);
  return c;
}

// signal() takes the completion by rvalue reference, as progress() passes a temporary: the
// callback may keep the payload by moving the Buffer out; otherwise the Buffer stays in the
// temporary and is released when that is destroyed, right after signal() returns.
TEST(Handler, CallbackOwnsTheBuffer) {
  ReleaseLog log;
  int payload = 0;
  Buffer kept;
  ferry::Handler keep([&](Completion&& c) { kept = std::move(c.buffer); });
  int released_during_callback = -1;
  ferry::Handler drop([&](Completion&&) { released_during_callback = log.calls.load(); });
  keep.signal(with_buffer(1, log, &payload));
  EXPECT_EQ(log.calls.load(), 0);
  EXPECT_TRUE(kept);
  drop.signal(with_buffer(2, log, &payload));
  EXPECT_EQ(released_during_callback, 0);  // still valid while the callback ran
  EXPECT_EQ(log.calls.load(), 1);
  kept.reset();
  EXPECT_EQ(log.calls.load(), 2);
}

TEST(Handler, ConcurrentSignals) {
  std::atomic<std::uint64_t> calls{0}, sum{0};
  ferry::Handler h([&](Completion&& c) {
    calls.fetch_add(1, std::memory_order_relaxed);
    sum.fetch_add(ptr_tag(c.context), std::memory_order_relaxed);
  });
  constexpr int kThreads = 4;
  const std::uint64_t per = ferry::test::scaled(50'000);
  ferry::test::Gate gate;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      gate.wait();
      for (std::uint64_t i = 1; i <= per; ++i) h.signal(make(i));
    });
  gate.open();
  for (auto& t : threads) t.join();
  EXPECT_EQ(calls.load(), kThreads * per);
  EXPECT_EQ(sum.load(), kThreads * per * (per + 1) / 2);
}

// --- Buffer ---------------------------------------------------------------------------------

TEST(Buffer, DefaultIsEmpty) {
  Buffer b;
  EXPECT_FALSE(b);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(b.size(), 0u);
  b.reset();  // no release function: nothing to do
  EXPECT_FALSE(b);
}

TEST(Buffer, DestructorReleasesOnceWithOwnerAndData) {
  ReleaseLog log;
  char bytes[16];
  {
    Buffer b(bytes, sizeof bytes, &ReleaseLog::release, &log);
    EXPECT_TRUE(b);
    EXPECT_EQ(b.data(), bytes);
    EXPECT_EQ(b.size(), sizeof bytes);
  }
  EXPECT_EQ(log.calls.load(), 1);
  EXPECT_EQ(log.last_data.load(), bytes);
}

TEST(Buffer, MoveConstructTransfersOwnership) {
  ReleaseLog log;
  char bytes[8];
  {
    Buffer a(bytes, 8, &ReleaseLog::release, &log);
    Buffer b(std::move(a));
    EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
    EXPECT_EQ(a.data(), nullptr);
    EXPECT_EQ(a.size(), 0u);
    EXPECT_TRUE(b);
    EXPECT_EQ(b.data(), bytes);
    EXPECT_EQ(b.size(), 8u);
    EXPECT_EQ(log.calls.load(), 0);
  }
  EXPECT_EQ(log.calls.load(), 1);
}

TEST(Buffer, MoveAssignReleasesTheOldBufferFirst) {
  ReleaseLog old_log, new_log;
  char x[4], y[4];
  {
    Buffer a(x, 4, &ReleaseLog::release, &old_log);
    Buffer b(y, 4, &ReleaseLog::release, &new_log);
    a = std::move(b);
    EXPECT_EQ(old_log.calls.load(), 1);  // a's previous buffer went back immediately
    EXPECT_EQ(old_log.last_data.load(), x);
    EXPECT_EQ(new_log.calls.load(), 0);
    EXPECT_EQ(a.data(), y);
    EXPECT_FALSE(b);  // NOLINT(bugprone-use-after-move)
  }
  EXPECT_EQ(old_log.calls.load(), 1);
  EXPECT_EQ(new_log.calls.load(), 1);
}

TEST(Buffer, SelfMoveAssignKeepsTheBuffer) {
  ReleaseLog log;
  char x[4];
  {
    Buffer a(x, 4, &ReleaseLog::release, &log);
    Buffer& alias = a;  // through an alias, so the compiler does not warn about self-move
    a = std::move(alias);
    EXPECT_TRUE(a);
    EXPECT_EQ(a.data(), x);
    EXPECT_EQ(log.calls.load(), 0);
  }
  EXPECT_EQ(log.calls.load(), 1);
}

TEST(Buffer, ResetReleasesOnceThenIsEmpty) {
  ReleaseLog log;
  char x[4];
  Buffer a(x, 4, &ReleaseLog::release, &log);
  a.reset();
  EXPECT_EQ(log.calls.load(), 1);
  EXPECT_FALSE(a);
  a.reset();
  EXPECT_EQ(log.calls.load(), 1);
}

// Buffers in a growing vector are moved on reallocation (Completion::parts): none may be
// released by the moves, each exactly once at the end.
TEST(Buffer, VectorReallocationReleasesEachOnce) {
  ReleaseLog log;
  std::vector<char> storage(100);
  {
    std::vector<Buffer> parts;
    for (int i = 0; i < 100; ++i) parts.emplace_back(&storage[i], 1, &ReleaseLog::release, &log);
    EXPECT_EQ(log.calls.load(), 0);
  }
  EXPECT_EQ(log.calls.load(), 100);
}

// --- Names ------------------------------------------------------------------------------------

TEST(Names, ToStringCoversEveryEnumerator) {
  EXPECT_STREQ(ferry::to_string(ferry::OpKind::remote_am), "remote_am");
  EXPECT_STREQ(ferry::to_string(ferry::StatusKind::retry), "retry");
  EXPECT_STREQ(ferry::to_string(ferry::RetryReason::packet_pool), "packet_pool");
  EXPECT_STREQ(ferry::to_string(ferry::RetryReason::lock), "lock");
  const ferry::Status s = ferry::Status::make_retry(ferry::RetryReason::send_queue);
  EXPECT_TRUE(s.is_retry());
  EXPECT_EQ(s.reason, ferry::RetryReason::send_queue);
  EXPECT_TRUE(ferry::Status::make_posted().is_posted());
  EXPECT_TRUE(ferry::Status::make_done().is_done());
}

TEST(Names, CompletionErrorString) {
  Completion c;
  EXPECT_EQ(c.error_string(), "success");
  c.error = -11;  // -FI_EAGAIN
  c.rank = 3;
  const std::string text = c.error_string();
  EXPECT_FALSE(c.ok());
  EXPECT_NE(text.find("-11"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 3"), std::string::npos) << text;
}

}  // namespace
