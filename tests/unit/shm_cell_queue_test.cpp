// The shared-memory cell queue: exactly-once, per-producer FIFO delivery under concurrent
// producers, and a full queue that refuses (never blocks) and recovers, over many laps.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "net/shm/cell_queue.hpp"
#include "test_scale.hpp"

namespace {

using ferry::net::shm::cell_payload;
using ferry::net::shm::CellHeader;
using ferry::net::shm::CellQueue;

// A queue in ordinary memory laid out as in a segment (tail and head on lines of their own,
// then cells). Zeroed first and initialized as a fresh segment is (cells left untouched), or,
// with `garbage`, over bytes that are not zero, every cell's header written.
struct QueueMemory {
  QueueMemory(std::uint64_t count, std::size_t payload, bool garbage = false)
      : stride(CellQueue::stride_for(payload)),
        mem(static_cast<unsigned char*>(std::aligned_alloc(64, 256 + count * stride + CellQueue::claims_bytes(count)))) {
    const std::size_t bytes = 256 + count * stride + CellQueue::claims_bytes(count);
    std::memset(mem, garbage ? 0xA5 : 0, bytes);
    unsigned char* claims = mem + 256 + count * stride;
    CellQueue::initialize(mem, mem + 128, mem + 256, claims, count, stride, /*zeroed=*/!garbage);
    queue = CellQueue(reinterpret_cast<std::atomic<std::uint64_t>*>(mem),
                      reinterpret_cast<std::atomic<std::uint64_t>*>(mem + 128), mem + 256,
                      reinterpret_cast<std::atomic<std::uint64_t>*>(claims), count, stride);
  }
  ~QueueMemory() { std::free(mem); }
  std::size_t stride;
  unsigned char* mem;
  CellQueue queue;
};

TEST(ShmCellQueue, CellsAreWholeCacheLines) {
  EXPECT_EQ(CellQueue::stride_for(8), 64u);   // an 8-byte message is one line
  EXPECT_EQ(CellQueue::stride_for(24), 64u);
  EXPECT_EQ(CellQueue::stride_for(25), 128u);
  EXPECT_EQ(CellQueue::stride_for(8192), 8256u);
}

class ShmCellQueueMemory : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(FreshOrGarbage, ShmCellQueueMemory, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "garbage" : "zeroed"; });

TEST_P(ShmCellQueueMemory, FullRefusesThenAcceptsAcrossLaps) {
  constexpr std::uint64_t kCount = 4;
  QueueMemory m(kCount, 16, GetParam());
  for (std::uint64_t h = 0; h < kCount; ++h) EXPECT_EQ(m.queue.peek(h), nullptr) << "an empty queue's cell " << h;
  std::uint64_t head = 0;
  std::uint64_t next_value = 0, expect_value = 0;
  for (int lap = 0; lap < 1000; ++lap) {
    // Fill it: exactly kCount claims succeed, the next is refused.
    for (std::uint64_t i = 0; i < kCount; ++i) {
      std::uint64_t pos = 0;
      CellHeader* c = m.queue.try_claim(pos);
      ASSERT_NE(c, nullptr) << "lap " << lap << " cell " << i;
      std::memcpy(cell_payload(c), &next_value, 8);
      ++next_value;
      CellQueue::publish(c, pos);
    }
    std::uint64_t pos = 0;
    ASSERT_EQ(m.queue.try_claim(pos), nullptr) << "lap " << lap << ": a full queue must refuse";
    // Free one: exactly one more claim succeeds.
    CellHeader* c = m.queue.peek(head);
    ASSERT_NE(c, nullptr);
    std::uint64_t v;
    std::memcpy(&v, cell_payload(c), 8);
    ASSERT_EQ(v, expect_value++);
    m.queue.free_below(++head);
    CellHeader* d = m.queue.try_claim(pos);
    ASSERT_NE(d, nullptr);
    std::memcpy(cell_payload(d), &next_value, 8);
    ++next_value;
    CellQueue::publish(d, pos);
    ASSERT_EQ(m.queue.try_claim(pos), nullptr);
    // Drain.
    while ((c = m.queue.peek(head)) != nullptr) {
      std::memcpy(&v, cell_payload(c), 8);
      ASSERT_EQ(v, expect_value++);
      m.queue.free_below(++head);
    }
    ASSERT_EQ(expect_value, next_value);
  }
}

// Room comes only from the consumer's shared head: cells it has read but not freed (as the
// transport's lent payloads are until the next poll) are never handed to a producer, freeing a
// prefix gives back exactly that many, and a view that last saw an old head (a copy made
// before the frees, as another thread's or process's view would be) finds the room too.
TEST(ShmCellQueue, CellsAreReusedOnlyOnceTheConsumerFreesThem) {
  constexpr std::uint64_t kCount = 8;
  QueueMemory m(kCount, 16);
  std::uint64_t pos = 0;
  for (std::uint64_t i = 0; i < kCount; ++i) {
    CellHeader* c = m.queue.try_claim(pos);
    ASSERT_NE(c, nullptr);
    c->arg0 = i;
    CellQueue::publish(c, pos);
  }
  const CellQueue stale = m.queue;  // saw head 0
  // The consumer reads all eight and frees none: the queue stays full, and each cell still
  // holds what was published in it.
  for (std::uint64_t h = 0; h < kCount; ++h) {
    CellHeader* c = m.queue.peek(h);
    ASSERT_NE(c, nullptr) << "position " << h;
    EXPECT_EQ(c->arg0, h);
  }
  EXPECT_EQ(m.queue.try_claim(pos), nullptr) << "read but not freed: still full";
  EXPECT_EQ(m.queue.peek(kCount), nullptr) << "nothing published at position " << kCount;
  m.queue.free_below(3);
  for (std::uint64_t h = 0; h < kCount; ++h) EXPECT_EQ(m.queue.peek(h)->arg0, h) << "a free does not touch the cells";
  CellQueue other = stale;
  for (int i = 0; i < 3; ++i) {
    CellHeader* c = other.try_claim(pos);
    ASSERT_NE(c, nullptr) << "claim " << i << " after freeing 3";
    EXPECT_EQ(pos, kCount + static_cast<std::uint64_t>(i));
    c->arg0 = pos;
    CellQueue::publish(c, pos);
  }
  EXPECT_EQ(other.try_claim(pos), nullptr) << "exactly three cells were freed";
  EXPECT_EQ(m.queue.try_claim(pos), nullptr);
  // Cells 3..7 keep their first-lap messages; the next lap starts where they end.
  for (std::uint64_t h = 3; h < kCount + 3; ++h) {
    CellHeader* c = m.queue.peek(h);
    ASSERT_NE(c, nullptr) << "position " << h;
    EXPECT_EQ(c->arg0, h);
  }
  EXPECT_EQ(m.queue.peek(kCount + 3), nullptr);
}

// A sender that dies between claiming a cell and publishing it: once its rank is known
// failed, the consumer passes the cell and reads what others published after it; a claim by
// a rank that is alive, or an empty cell, is never passed.
TEST(ShmCellQueue, ACellClaimedByAFailedRankIsPassed) {
  QueueMemory m(8, 16);
  auto failed = [](int rank) { return rank == 3; };
  std::uint64_t head = 0, pos = 0;
  EXPECT_FALSE(m.queue.skip_dead_claim(head, failed)) << "an empty cell is not passed";
  ASSERT_NE(m.queue.try_claim(pos, CellQueue::claim_mark(3)), nullptr);  // rank 3 claims position 0 and dies
  ASSERT_EQ(pos, 0u);
  CellHeader* live = m.queue.try_claim(pos, CellQueue::claim_mark(1));   // rank 1 claims position 1, publishes
  ASSERT_NE(live, nullptr);
  live->arg0 = 42;
  CellQueue::publish(live, pos);
  EXPECT_EQ(m.queue.peek(head), nullptr) << "the dead claim blocks the head";
  EXPECT_FALSE(m.queue.skip_dead_claim(head, [](int) { return false; })) << "rank 3 not failed yet";
  ASSERT_TRUE(m.queue.skip_dead_claim(head, failed));
  ++head;
  CellHeader* c = m.queue.peek(head);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->arg0, 42u);
  m.queue.free_below(++head);
  // Position 2 claimed by rank 1, which is alive and slow: never passed.
  ASSERT_NE(m.queue.try_claim(pos, CellQueue::claim_mark(1)), nullptr);
  EXPECT_FALSE(m.queue.skip_dead_claim(head, failed));
  // The passed cell is free again a lap later: positions 3..9 (cells 3..7, then 0 and 1) can
  // be claimed; position 10 is cell 2, still claimed.
  int claimed = 0;
  while (m.queue.try_claim(pos, CellQueue::claim_mark(2)) != nullptr) ++claimed;
  EXPECT_EQ(claimed, 7);
}

// A sender killed right after its claim, before it moved the tail hint: the claim word alone
// names it. Other producers pass the taken position; the consumer, once the claimer is known
// failed, passes its cell, which is free again a lap later; and a tail hint that went back (a
// slow claimer's late store), even by more than a lap, costs a search, never a position
// claimed twice or left out.
TEST(ShmCellQueue, AClaimWordNamesItsClaimerAndTheTailIsOnlyAHint) {
  QueueMemory m(8, 16);
  auto* tail = reinterpret_cast<std::atomic<std::uint64_t>*>(m.mem);
  auto* words = reinterpret_cast<std::atomic<std::uint64_t>*>(m.mem + 256 + 8 * m.stride);
  // Rank 3 claims position 0 (its word, as try_claim writes it) and dies before the tail moves.
  words[0].store(CellQueue::claim_word(0, 3));
  ASSERT_EQ(tail->load(), 0u);
  std::uint64_t pos = 99;
  CellHeader* live = m.queue.try_claim(pos, CellQueue::claim_mark(1));
  ASSERT_NE(live, nullptr);
  EXPECT_EQ(pos, 1u) << "position 0 is taken: the next claim is position 1";
  live->arg0 = 7;
  CellQueue::publish(live, pos);
  std::uint64_t head = 0;
  EXPECT_EQ(m.queue.peek(head), nullptr);
  EXPECT_FALSE(m.queue.skip_dead_claim(head, [](int r) { return r == 1; })) << "rank 3, not rank 1, claimed it";
  ASSERT_TRUE(m.queue.skip_dead_claim(head, [](int r) { return r == 3; }));
  ++head;
  ASSERT_NE(m.queue.peek(head), nullptr);
  EXPECT_EQ(m.queue.peek(head)->arg0, 7u);
  m.queue.free_below(++head);
  // Positions 2 and 3 claimed and published; then the hint goes back to 0.
  for (std::uint64_t want = 2; want < 4; ++want) {
    CellHeader* c = m.queue.try_claim(pos, CellQueue::claim_mark(1));
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(pos, want);
    CellQueue::publish(c, pos);
  }
  EXPECT_FALSE(m.queue.skip_dead_claim(head, [](int) { return true; }))
      << "a cell published by a rank declared failed while it still ran is read, not passed";
  tail->store(0);
  CellHeader* c = m.queue.try_claim(pos, CellQueue::claim_mark(2));
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(pos, 4u) << "an old hint: the search passes every taken position";
  EXPECT_EQ(tail->load(), 5u);
  CellQueue::publish(c, pos);
  // An unclaimed position is never passed, whatever has failed.
  EXPECT_FALSE(m.queue.skip_dead_claim(5, [](int) { return true; }));
  // Cell 0, passed, is free for position 8: the consumer reads positions 2..4, and producers
  // then fill positions 5..12 (8 cells), cell 0 among them.
  for (; head < 5; ++head) ASSERT_NE(m.queue.peek(head), nullptr) << "position " << head;
  m.queue.free_below(head);
  for (std::uint64_t want = 5; want < 13; ++want) {
    CellHeader* d = m.queue.try_claim(pos, CellQueue::claim_mark(1));
    ASSERT_NE(d, nullptr) << "position " << want;
    EXPECT_EQ(pos, want);
    d->arg0 = want;
    CellQueue::publish(d, pos);
  }
  EXPECT_EQ(m.queue.try_claim(pos), nullptr) << "full";
  for (; head < 13; ++head) {
    CellHeader* d = m.queue.peek(head);
    ASSERT_NE(d, nullptr) << "position " << head;
    EXPECT_EQ(d->arg0, head);
  }
  m.queue.free_below(head);
  // A hint more than a lap old: the word of position 5 names position 13 (a lap later), and
  // the search jumps straight past it to 14, the next free position (one further would leave
  // 14 unclaimed behind the hint: a gap).
  CellHeader* d = m.queue.try_claim(pos, CellQueue::claim_mark(1));
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(pos, 13u);
  CellQueue::publish(d, pos);
  tail->store(5);
  ASSERT_NE(m.queue.try_claim(pos, CellQueue::claim_mark(1)), nullptr);
  EXPECT_EQ(pos, 14u);
  EXPECT_EQ(tail->load(), 15u);
}

TEST(ShmCellQueue, ConcurrentProducersExactlyOnceInOrder) {
  constexpr int kProducers = 4;
  const std::size_t per = ferry::test::scaled(50000, 5000);
  QueueMemory m(16, 16);  // small: producers lap it many times and often find it full
  ferry::test::Gate gate;
  std::atomic<std::uint64_t> refused{0};
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      gate.wait();
      std::uint64_t full = 0;
      for (std::uint64_t i = 0; i < per; ++i) {
        std::uint64_t pos = 0;
        CellHeader* c;
        while ((c = m.queue.try_claim(pos)) == nullptr) {
          ++full;
          std::this_thread::yield();
        }
        c->rank = p;
        c->length = 16;
        const std::uint64_t words[2] = {static_cast<std::uint64_t>(p), i};
        std::memcpy(cell_payload(c), words, sizeof words);
        CellQueue::publish(c, pos);
      }
      refused.fetch_add(full, std::memory_order_relaxed);
    });
  }
  gate.open();
  std::vector<std::uint64_t> next(kProducers, 0);
  std::uint64_t head = 0;
  const std::uint64_t total = per * kProducers;
  bool ok = true;
  for (std::uint64_t got = 0; got < total && ok;) {
    CellHeader* c = m.queue.peek(head);
    if (c == nullptr) {
      std::this_thread::yield();
      continue;
    }
    std::uint64_t words[2];
    std::memcpy(words, cell_payload(c), sizeof words);
    if (words[0] >= kProducers || static_cast<std::uint64_t>(c->rank) != words[0] || words[1] != next[words[0]]) {
      ADD_FAILURE() << "cell " << head << ": producer " << words[0] << " message " << words[1] << ", expected "
                    << (words[0] < kProducers ? next[words[0]] : 0);
      ok = false;
    } else {
      ++next[words[0]];
    }
    m.queue.free_below(++head);
    ++got;
  }
  for (auto& t : producers) t.join();
  if (!ok) return;
  for (int p = 0; p < kProducers; ++p) EXPECT_EQ(next[p], per) << "producer " << p;
  std::uint64_t pos = 0;
  EXPECT_EQ(m.queue.peek(head), nullptr) << "nothing beyond what was sent";
  EXPECT_NE(m.queue.try_claim(pos), nullptr) << "empty again";
  RecordProperty("full_refusals", static_cast<int>(refused.load()));
}

}  // namespace
