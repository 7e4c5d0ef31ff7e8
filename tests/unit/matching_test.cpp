// matching_test.cpp — MatchingEngine: pairing posted receives with unexpected messages by
// (rank, tag), with wildcards and MPI-style non-overtaking order.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "core/matching.hpp"
#include "core/packet_pool.hpp"
#include "test_scale.hpp"

namespace {

using ferry::any_source;
using ferry::any_tag;
using ferry::detail::MatchingEngine;
using ferry::detail::Packet;
using ferry::detail::PacketPool;

// Packets for receives and messages come from real pools, as in a device; a field the engine
// does not read carries a test id (recv.size of a receive, arrived.length of a message) so a
// match can be traced back to what was posted.
class Matching : public testing::Test {
 protected:
  Packet* recv(int rank, ferry::Tag tag, std::size_t id) {
    Packet* p = make(recvs_);
    p->recv.want = {rank, tag};
    p->recv.size = id;
    return p;
  }
  Packet* msg(int rank, ferry::Tag tag, std::size_t id) {
    Packet* p = make(msgs_);
    p->arrived.from = {rank, tag};
    p->arrived.length = static_cast<std::uint32_t>(id);
    return p;
  }

  // Returns a matched pair's packets (or nullptr) to their pools.
  void done(Packet* p) {
    if (p != nullptr) p->pool->put(p);
  }

  // The id of what add_recv returns (a message) or add_message returns (a receive).
  static std::size_t msg_id(const Packet* p) { return p == nullptr ? SIZE_MAX : p->arrived.length; }
  static std::size_t recv_id(const Packet* p) { return p == nullptr ? SIZE_MAX : p->recv.size; }

  MatchingEngine engine_;

 private:
  Packet* make(PacketPool& pool) {
    Packet* p = pool.get();
    EXPECT_NE(p, nullptr);
    p->next = reinterpret_cast<Packet*>(0x1);  // garbage: the engine must not trust it
    return p;
  }

  PacketPool recvs_{64, 0};
  PacketPool msgs_{64, 0};
};

TEST_F(Matching, MessageFirstThenExactReceive) {
  Packet* m = msg(2, 5, 1);
  EXPECT_EQ(engine_.add_message(m), nullptr);  // no receive yet: queued as unexpected
  Packet* r = recv(2, 5, 2);
  EXPECT_EQ(engine_.add_recv(r), m);
  done(m);
  done(r);
}

TEST_F(Matching, ReceiveFirstThenExactMessage) {
  Packet* r = recv(2, 5, 1);
  EXPECT_EQ(engine_.add_recv(r), nullptr);
  Packet* m = msg(2, 5, 2);
  EXPECT_EQ(engine_.add_message(m), r);
  done(m);
  done(r);
}

TEST_F(Matching, NoCrossMatchOfDifferentRankOrTag) {
  Packet* r = recv(1, 5, 1);
  EXPECT_EQ(engine_.add_recv(r), nullptr);
  Packet* wrong_tag = msg(1, 6, 2);
  Packet* wrong_rank = msg(2, 5, 3);
  Packet* tag_zero = msg(1, 0, 4);
  EXPECT_EQ(engine_.add_message(wrong_tag), nullptr);
  EXPECT_EQ(engine_.add_message(wrong_rank), nullptr);
  EXPECT_EQ(engine_.add_message(tag_zero), nullptr);
  // The queued messages wait for their own receives; r is still waiting for (1, 5).
  Packet* r6 = recv(1, 6, 5);
  EXPECT_EQ(engine_.add_recv(r6), wrong_tag);
  Packet* right = msg(1, 5, 6);
  EXPECT_EQ(engine_.add_message(right), r);
  Packet* r_rank2 = recv(2, 5, 7);
  EXPECT_EQ(engine_.add_recv(r_rank2), wrong_rank);
  Packet* r0 = recv(1, 0, 8);
  EXPECT_EQ(engine_.add_recv(r0), tag_zero);
  for (Packet* p : {r, wrong_tag, wrong_rank, tag_zero, r6, right, r_rank2, r0}) done(p);
}

TEST_F(Matching, AnySourceMatchesEveryRankButOnlyItsTag) {
  Packet* other_tag = msg(3, 6, 1);
  Packet* m = msg(3, 5, 2);
  EXPECT_EQ(engine_.add_message(other_tag), nullptr);
  EXPECT_EQ(engine_.add_message(m), nullptr);
  Packet* r = recv(any_source, 5, 3);
  EXPECT_EQ(engine_.add_recv(r), m);
  // And a posted any_source receive takes a message from any rank.
  Packet* r2 = recv(any_source, 7, 4);
  EXPECT_EQ(engine_.add_recv(r2), nullptr);
  Packet* m2 = msg(12345, 7, 5);
  EXPECT_EQ(engine_.add_message(m2), r2);
  for (Packet* p : {m, r, r2, m2}) done(p);
  // other_tag is still queued in the engine: drain it so its packet returns.
  int left = 0;
  engine_.drain([&](Packet* p) { ADD_FAILURE() << "a receive was left queued"; done(p); },
                [&](Packet* p) {
                  ++left;
                  EXPECT_EQ(p, other_tag);
                  done(p);
                });
  EXPECT_EQ(left, 1);
}

TEST_F(Matching, AnyTagMatchesEveryTagButOnlyItsRank) {
  Packet* other_rank = msg(4, 99, 1);
  Packet* m = msg(3, ferry::max_tag, 2);
  EXPECT_EQ(engine_.add_message(other_rank), nullptr);
  EXPECT_EQ(engine_.add_message(m), nullptr);
  Packet* r = recv(3, any_tag, 3);
  EXPECT_EQ(engine_.add_recv(r), m);
  Packet* both = recv(any_source, any_tag, 4);
  EXPECT_EQ(engine_.add_recv(both), other_rank);
  for (Packet* p : {other_rank, m, r, both}) done(p);
}

// A receive gets the oldest matching message: messages with the same (rank, tag) never
// overtake each other, and a wildcard receive takes the oldest of all it matches.
TEST_F(Matching, ReceivesTakeMessagesInArrivalOrder) {
  Packet* m1 = msg(1, 5, 1);
  Packet* m2 = msg(2, 5, 2);
  Packet* m3 = msg(1, 5, 3);
  Packet* m4 = msg(1, 5, 4);
  for (Packet* m : {m1, m2, m3, m4}) ASSERT_EQ(engine_.add_message(m), nullptr);
  Packet* ra = recv(any_source, 5, 10);
  EXPECT_EQ(msg_id(engine_.add_recv(ra)), 1u);
  Packet* rb = recv(1, 5, 11);
  EXPECT_EQ(msg_id(engine_.add_recv(rb)), 3u);  // skips m2 (rank 2), oldest rank-1 is m3
  Packet* rc = recv(any_source, any_tag, 12);
  EXPECT_EQ(msg_id(engine_.add_recv(rc)), 2u);
  Packet* rd = recv(1, any_tag, 13);
  EXPECT_EQ(msg_id(engine_.add_recv(rd)), 4u);
  Packet* re = recv(any_source, any_tag, 14);
  EXPECT_EQ(engine_.add_recv(re), nullptr);  // all consumed: re is queued
  for (Packet* p : {m1, m2, m3, m4, ra, rb, rc, rd}) done(p);
  engine_.drain([&](Packet* p) { done(p); }, [&](Packet* p) { done(p); });
}

// A message goes to the oldest matching posted receive, whatever mix of wildcards is posted.
TEST_F(Matching, MessagesTakeReceivesInPostingOrder) {
  Packet* r1 = recv(any_source, 5, 1);
  Packet* r2 = recv(1, 5, 2);
  Packet* r3 = recv(1, any_tag, 3);
  Packet* r4 = recv(1, 5, 4);
  for (Packet* r : {r1, r2, r3, r4}) ASSERT_EQ(engine_.add_recv(r), nullptr);
  Packet* a = msg(1, 5, 10);
  EXPECT_EQ(recv_id(engine_.add_message(a)), 1u);
  Packet* b = msg(1, 5, 11);
  EXPECT_EQ(recv_id(engine_.add_message(b)), 2u);
  Packet* c = msg(1, 7, 12);
  EXPECT_EQ(recv_id(engine_.add_message(c)), 3u);  // only r3 takes tag 7
  Packet* d = msg(1, 5, 13);
  EXPECT_EQ(recv_id(engine_.add_message(d)), 4u);
  for (Packet* p : {r1, r2, r3, r4, a, b, c, d}) done(p);
}

// Removing from the head, middle and tail of a list must keep it consistent, including the
// tail pointer used by the next append.
TEST_F(Matching, ListStaysConsistentAfterRemovalsAnywhere) {
  std::vector<Packet*> posted;
  for (std::size_t i = 0; i < 5; ++i) {
    posted.push_back(recv(static_cast<int>(i), 1, i));
    ASSERT_EQ(engine_.add_recv(posted.back()), nullptr);
  }
  std::vector<Packet*> msgs;
  auto deliver = [&](int rank) {
    msgs.push_back(msg(rank, 1, 100 + msgs.size()));
    return engine_.add_message(msgs.back());
  };
  EXPECT_EQ(deliver(4), posted[4]);  // tail
  Packet* late = recv(7, 1, 7);       // appended after a tail removal
  ASSERT_EQ(engine_.add_recv(late), nullptr);
  EXPECT_EQ(deliver(2), posted[2]);  // middle
  EXPECT_EQ(deliver(0), posted[0]);  // head
  EXPECT_EQ(deliver(7), late);       // reachable: the tail pointer was right
  EXPECT_EQ(deliver(3), posted[3]);
  EXPECT_EQ(deliver(1), posted[1]);  // last one: list empty again
  Packet* after = recv(9, 1, 9);
  ASSERT_EQ(engine_.add_recv(after), nullptr);
  EXPECT_EQ(deliver(9), after);
  for (Packet* p : posted) done(p);
  for (Packet* p : msgs) done(p);
  done(late);
  done(after);
  int left = 0;
  engine_.drain([&](Packet*) { ++left; }, [&](Packet*) { ++left; });
  EXPECT_EQ(left, 0);
}

// Each list drains into its own callback: a receive is never handed over as a message (the
// device frees a message's heap payload, which a receive does not have).
TEST_F(Matching, DrainEmptiesBothLists) {
  std::vector<Packet*> receives = {recv(1, 1, 1), recv(any_source, 2, 2), recv(3, any_tag, 3)};
  for (Packet* r : receives) ASSERT_EQ(engine_.add_recv(r), nullptr);
  std::vector<Packet*> messages = {msg(5, 9, 4), msg(6, 9, 5)};
  for (Packet* m : messages) ASSERT_EQ(engine_.add_message(m), nullptr);

  std::vector<Packet*> drained_receives, drained_messages;
  engine_.drain([&](Packet* p) { drained_receives.push_back(p); }, [&](Packet* p) { drained_messages.push_back(p); });
  EXPECT_EQ(drained_receives, receives);  // in posting order
  EXPECT_EQ(drained_messages, messages);  // in arrival order

  // Nothing left to match: a message that the drained any_source receive would have taken
  // is queued now, and a second drain hands back only that.
  Packet* m = msg(8, 2, 6);
  EXPECT_EQ(engine_.add_message(m), nullptr);
  std::vector<Packet*> second;
  engine_.drain([&](Packet* p) { ADD_FAILURE() << "receive " << p << " drained twice"; },
                [&](Packet* p) { second.push_back(p); });
  EXPECT_EQ(second, std::vector<Packet*>{m});
  for (Packet* p : drained_receives) done(p);
  for (Packet* p : drained_messages) done(p);
  done(m);
}

// Threads post receives and messages concurrently with random exact keys. For every key the
// number of receives equals the number of messages, so at the end everything must be matched:
// each message exactly once, with a receive of the same key, and nothing left in the engine.
// (Only exact keys here: with wildcards a greedy matching can legitimately strand entries.)
// Tags in one bucket (t and t + kBuckets) and in different buckets: the order rules hold
// across the engine's lists, not only within one.
TEST_F(Matching, OrderHoldsAcrossTagBuckets) {
  constexpr ferry::Tag kB = MatchingEngine::kBuckets;
  Packet* m1 = msg(1, 7 + kB, 1);  // same bucket as tag 7, different tag
  Packet* m2 = msg(1, 9, 2);
  Packet* m3 = msg(1, 7, 3);
  for (Packet* m : {m1, m2, m3}) ASSERT_EQ(engine_.add_message(m), nullptr);
  Packet* exact = recv(1, 7, 10);
  EXPECT_EQ(msg_id(engine_.add_recv(exact)), 3u);  // passes over m1 in its bucket
  Packet* wild = recv(any_source, any_tag, 11);
  EXPECT_EQ(msg_id(engine_.add_recv(wild)), 1u);  // the oldest of all lists
  Packet* wild2 = recv(1, any_tag, 12);
  EXPECT_EQ(msg_id(engine_.add_recv(wild2)), 2u);

  // A message meets the older of the tagged receive and the any_tag receive.
  Packet* r_any = recv(1, any_tag, 20);
  Packet* r_tag = recv(1, 9, 21);
  ASSERT_EQ(engine_.add_recv(r_any), nullptr);
  ASSERT_EQ(engine_.add_recv(r_tag), nullptr);
  Packet* a = msg(1, 9, 30);
  EXPECT_EQ(recv_id(engine_.add_message(a)), 20u);
  Packet* b = msg(1, 9, 31);
  EXPECT_EQ(recv_id(engine_.add_message(b)), 21u);
  for (Packet* p : {m1, m2, m3, exact, wild, wild2, r_any, r_tag, a, b}) done(p);
}

// Random posts of receives and messages (wildcards, colliding tags) against a model that
// keeps one list of each in order: the engine must make the same matches.
TEST_F(Matching, AgreesWithASingleListModelOnRandomTraffic) {
  struct Entry {
    int rank;
    ferry::Tag tag;
    std::size_t id;
  };
  std::vector<Entry> model_recvs, model_msgs;
  std::vector<Packet*> waiting;  // every packet the engine holds, to return at the end
  std::mt19937 rng(12345);
  constexpr ferry::Tag kB = MatchingEngine::kBuckets;
  const ferry::Tag tags[] = {1, 2, 1 + kB, 2 + kB, 5, 1 + 2 * kB};
  for (std::size_t id = 0; id < 4000; ++id) {
    const int rank = static_cast<int>(rng() % 3);
    const ferry::Tag tag = tags[rng() % std::size(tags)];
    if (rng() % 2 == 0) {
      const bool any_r = rng() % 5 == 0, any_t = rng() % 7 == 0;
      const int want_rank = any_r ? any_source : rank;
      const ferry::Tag want_tag = any_t ? any_tag : tag;
      std::size_t expect = SIZE_MAX;
      for (auto it = model_msgs.begin(); it != model_msgs.end(); ++it) {
        if (ferry::detail::tags_match(want_rank, want_tag, it->rank, it->tag)) {
          expect = it->id;
          model_msgs.erase(it);
          break;
        }
      }
      if (expect == SIZE_MAX) model_recvs.push_back({want_rank, want_tag, id});
      Packet* r = recv(want_rank, want_tag, id);
      Packet* got = engine_.add_recv(r);
      ASSERT_EQ(msg_id(got), expect) << "receive " << id;
      if (got != nullptr) {
        done(got);
        done(r);
      }
    } else {
      std::size_t expect = SIZE_MAX;
      for (auto it = model_recvs.begin(); it != model_recvs.end(); ++it) {
        if (ferry::detail::tags_match(it->rank, it->tag, rank, tag)) {
          expect = it->id;
          model_recvs.erase(it);
          break;
        }
      }
      if (expect == SIZE_MAX) model_msgs.push_back({rank, tag, id});
      Packet* m = msg(rank, tag, id);
      Packet* got = engine_.add_message(m);
      ASSERT_EQ(recv_id(got), expect) << "message " << id;
      if (got != nullptr) {
        done(got);
        done(m);
      }
    }
    // Keep the engine's population bounded by the pools: drain both sides now and then.
    if (model_recvs.size() + model_msgs.size() > 40) {
      engine_.drain([&](Packet* p) { done(p); }, [&](Packet* p) { done(p); });
      model_recvs.clear();
      model_msgs.clear();
    }
  }
  engine_.drain([&](Packet* p) { done(p); }, [&](Packet* p) { done(p); });
}

TEST(MatchingConcurrent, EveryMessageMatchedExactlyOnce) {
  constexpr int kThreads = 4;
  constexpr int kRanks = 4;
  constexpr ferry::Tag kTags = 8;
  const std::size_t pairs = ferry::test::scaled(200'000) / kThreads * kThreads;

  // Keys: message i and receive i have the same key; the receives are then posted in a
  // different order (and by different threads) than the messages.
  std::mt19937_64 rng(12345);
  std::vector<int> rank_of(pairs);
  std::vector<ferry::Tag> tag_of(pairs);
  for (std::size_t i = 0; i < pairs; ++i) {
    rank_of[i] = static_cast<int>(rng() % kRanks);
    tag_of[i] = static_cast<ferry::Tag>(rng() % kTags);
  }
  struct Op {
    bool is_recv;
    std::size_t id;
  };
  std::vector<Op> ops;
  ops.reserve(2 * pairs);
  for (std::size_t i = 0; i < pairs; ++i) {
    ops.push_back({false, i});
    ops.push_back({true, i});
  }
  std::shuffle(ops.begin(), ops.end(), rng);

  // Packets are recycled as pairs complete; the pools only need to cover what is queued.
  PacketPool recv_pool(16384, 0), msg_pool(16384, 0);
  MatchingEngine engine;
  std::vector<std::atomic<std::uint8_t>> msg_matched(pairs), recv_matched(pairs);
  std::atomic<std::size_t> key_mismatch{0}, starved{0};
  ferry::test::Gate gate;

  auto record = [&](Packet* m, Packet* r) {
    if (m->arrived.from.rank != r->recv.want.rank || m->arrived.from.tag != r->recv.want.tag) ++key_mismatch;
    msg_matched[m->arrived.length].fetch_add(1, std::memory_order_relaxed);
    recv_matched[r->recv.size].fetch_add(1, std::memory_order_relaxed);
    m->pool->put(m);
    r->pool->put(r);
  };

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      gate.wait();
      for (std::size_t k = static_cast<std::size_t>(t); k < ops.size(); k += kThreads) {
        const Op op = ops[k];
        PacketPool& pool = op.is_recv ? recv_pool : msg_pool;
        Packet* p = nullptr;
        for (int tries = 0; (p = pool.get()) == nullptr; ++tries) {
          if (tries == 1'000'000) {  // every packet stuck queued: report instead of hanging
            ++starved;
            return;
          }
          std::this_thread::yield();
        }
        if (op.is_recv) {
          p->recv.want = {rank_of[op.id], tag_of[op.id]};
          p->recv.size = op.id;
        } else {
          p->arrived.from = {rank_of[op.id], tag_of[op.id]};
          p->arrived.length = static_cast<std::uint32_t>(op.id);
        }
        if (op.is_recv) {
          if (Packet* m = engine.add_recv(p)) record(m, p);
        } else {
          if (Packet* r = engine.add_message(p)) record(p, r);
        }
      }
    });
  }
  gate.open();
  for (auto& th : threads) th.join();

  ASSERT_EQ(starved.load(), 0u);
  EXPECT_EQ(key_mismatch.load(), 0u);
  std::size_t left = 0;
  auto count = [&](Packet* p) {
    ++left;
    p->pool->put(p);
  };
  engine.drain(count, count);
  EXPECT_EQ(left, 0u) << "entries left unmatched although every key balanced";
  std::size_t bad_msgs = 0, bad_recvs = 0;
  for (std::size_t i = 0; i < pairs; ++i) {
    bad_msgs += msg_matched[i].load() != 1;
    bad_recvs += recv_matched[i].load() != 1;
  }
  EXPECT_EQ(bad_msgs, 0u);
  EXPECT_EQ(bad_recvs, 0u);
}

}  // namespace
