// The shared-memory transport in one process talking to itself: parameters, caps, segment
// lifetime, lent messages, many threads posting at once, copy-mode RMA (also from
// many threads), malformed cells and foreign segments.
#include <algorithm>
#include <exception>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "shm_test_util.hpp"

namespace {

using namespace ferry::test::shm;

TEST(ShmTransport, ParametersAreChecked) {
  EXPECT_THROW(ShmTransport(ShmParams{2, 2, 0, kPayload, 256, ShmCopy::automatic}), ferry::Error);
  EXPECT_THROW(ShmTransport(ShmParams{0, 1, 0, kPayload, 100, ShmCopy::automatic}), ferry::Error);
  EXPECT_THROW(ShmTransport(ShmParams{0, 1, 0, 4, 256, ShmCopy::automatic}), ferry::Error);
  try {
    ShmTransport t(ShmParams{0, 1, 0, kPayload, 256, static_cast<ShmCopy>(9)});
    ADD_FAILURE() << "a copy mode outside the enum must be refused";
  } catch (const ferry::Error& e) {
    EXPECT_NE(std::string(e.what()).find("copy mode 9 is not auto, cma or copy"), std::string::npos) << e.what();
  }
  try {
    ShmTransport t(ShmParams{0, 1, -1, kPayload, 256, ShmCopy::automatic});
    ADD_FAILURE() << "a negative device must be refused";
  } catch (const ferry::Error& e) {
    EXPECT_NE(std::string(e.what()).find("device -1"), std::string::npos) << e.what();
  }
}

TEST(ShmTransport, CapsDescribeTheTransport) {
  auto t = ferry::net::make_shm_transport(ShmParams{0, 1, 3, 4096, 64, ShmCopy::automatic});
  const auto& c = t->caps();
  EXPECT_EQ(c.name, "shm");
  EXPECT_EQ(c.inject_size, 4096u);
  EXPECT_EQ(c.max_msg_size, 4096u);
  EXPECT_EQ(c.remote_data_bytes, 8u);
  EXPECT_GE(c.max_rma_size, std::size_t{1} << 40);
  EXPECT_EQ(c.send_queue, 0u);
  EXPECT_TRUE(c.reports_source);
  EXPECT_TRUE(c.rma_virtual_address);
  EXPECT_FALSE(c.local_registration);
  EXPECT_FALSE(c.remote_data_consumes_recv);
  EXPECT_TRUE(c.gather_inject);
  EXPECT_EQ(t->address().rfind("shm1;/ferry-" + std::to_string(getpid()) + "-3-", 0), 0u) << t->address();
}

TEST(ShmTransport, SegmentIsRemovedAfterConnectedOrDestruction) {
  const int pid = getpid();
  ASSERT_TRUE(segments_of(pid).empty());
  {
    auto t = make(0, 1, ShmCopy::automatic);
    EXPECT_EQ(segments_of(pid).size(), 1u);
  }
  EXPECT_TRUE(segments_of(pid).empty()) << "the destructor unlinks a segment never connected";
  auto t = make(0, 1, ShmCopy::automatic);
  t->connect({t->address()});
  t->connected();
  EXPECT_TRUE(segments_of(pid).empty()) << "connected() unlinks";
}

TEST(ShmTransport, SelfMessagesEventsAndTruncation) {
  auto t = make(0, 1, ShmCopy::automatic);
  t->connect({t->address()});
  t->connected();
  EXPECT_STREQ(t->copy_mode(0), "self");
  EXPECT_EQ(t->copy_summary(), "self");
  EXPECT_TRUE(t->peer_alive(0));
  EXPECT_FALSE(t->peer_alive(1));

  std::vector<unsigned char> big(kPayload);
  fill(big.data(), big.size(), 5);
  const std::uint64_t eight = 0x0123456789abcdefULL;
  OpContext send_ctx;
  ASSERT_EQ(t->inject(0, &eight, 8), 0);
  ASSERT_EQ(t->send(0, big.data(), big.size(), nullptr, &send_ctx), 0);
  ASSERT_EQ(t->inject(0, big.data(), 16), 0);
  EXPECT_EQ(t->inject(0, big.data(), kPayload + 1), -EMSGSIZE);
  EXPECT_EQ(t->inject(1, big.data(), 8), -EHOSTUNREACH);

  // No room to lend: the messages wait (only send's local event comes out).
  Event ev[8];
  t->set_lend_limit(0);
  int n = t->poll(ev, 8);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(ev[0].context, &send_ctx);
  EXPECT_EQ(ev[0].length, kPayload);
  EXPECT_EQ(ev[0].error, 0);
  EXPECT_EQ(t->poll(ev, 8), 0);

  // Receives are lent, never posted: each message comes in its cell, in order, with no context.
  EXPECT_EQ(t->caps().receives, ferry::net::Receives::lent);
  OpContext r;
  unsigned char b0[8];
  EXPECT_EQ(t->post_recv(b0, sizeof b0, nullptr, &r), -ENOSYS);
  t->set_lend_limit(2);
  n = t->poll(ev, 8);
  ASSERT_EQ(n, 2) << "at most the lend limit";
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(ev[i].context, nullptr);
    EXPECT_EQ(ev[i].rank, 0);
    EXPECT_EQ(ev[i].error, 0);
    ASSERT_NE(ev[i].lent, nullptr);
  }
  EXPECT_EQ(ev[0].length, 8u);
  EXPECT_EQ(std::memcmp(ev[0].lent, &eight, 8), 0);
  EXPECT_EQ(ev[1].length, kPayload);
  EXPECT_EQ(check(ev[1].lent, kPayload, 5), kPayload);
  n = t->poll(ev, 8);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(ev[0].length, 16u);
  EXPECT_EQ(check(ev[0].lent, 16, 5), 16u);

  // A full queue refuses (once the last poll's lent cells are back).
  t->set_lend_limit(0);
  EXPECT_EQ(t->poll(ev, 8), 0);
  int accepted = 0;
  while (t->inject(0, &eight, 8) == 0) ++accepted;
  EXPECT_EQ(accepted, 256);
  EXPECT_EQ(t->inject(0, &eight, 8), -EAGAIN);
  t->cancel_all();
}

// inject_parts: the header and the body land back to back in one message; the sum is held to
// the inject size.
TEST(ShmTransport, InjectPartsGathersHeaderAndBody) {
  auto t = make(0, 1, ShmCopy::automatic);
  t->connect({t->address()});
  t->connected();
  const unsigned char head[3] = {1, 2, 3};
  std::vector<unsigned char> body(kPayload - 3);
  fill(body.data(), body.size(), 7);
  ASSERT_EQ(t->inject_parts(0, head, 3, body.data(), body.size()), 0);
  EXPECT_EQ(t->inject_parts(0, head, 3, body.data(), body.size() + 1), -EMSGSIZE);
  EXPECT_EQ(t->inject_parts(1, head, 3, body.data(), 1), -EHOSTUNREACH);
  ASSERT_EQ(t->inject_parts(0, nullptr, 0, nullptr, 0), 0);
  Event ev[4];
  ASSERT_EQ(t->poll(ev, 4), 2);
  EXPECT_EQ(ev[0].length, kPayload);
  ASSERT_NE(ev[0].lent, nullptr);
  EXPECT_EQ(std::memcmp(ev[0].lent, head, 3), 0);
  EXPECT_EQ(check(ev[0].lent + 3, body.size(), 7), body.size());
  EXPECT_EQ(ev[1].length, 0u);
  EXPECT_EQ(ev[1].error, 0);
}

// Small messages are copied inline (common/small_copy.hpp): every split of a message of up to
// 48 bytes into header and body arrives byte for byte.
TEST(ShmTransport, SmallMessagesArriveExactlyAtEverySplit) {
  auto t = make(0, 1, ShmCopy::automatic);
  t->connect({t->address()});
  t->connected();
  std::vector<unsigned char> src(48);
  fill(src.data(), src.size(), 3);
  for (std::size_t total = 0; total <= src.size(); ++total) {
    for (std::size_t head = 0; head <= total; ++head) {
      ASSERT_EQ(t->inject_parts(0, src.data(), head, src.data() + head, total - head), 0);
      Event ev[2];
      ASSERT_EQ(t->poll(ev, 2), 1);
      ASSERT_EQ(ev[0].length, total) << "total " << total << " head " << head;
      ASSERT_EQ(ev[0].error, 0);
      ASSERT_EQ(std::memcmp(ev[0].lent, src.data(), total), 0) << "total " << total << " head " << head;
    }
  }
}

// Lending: a message stays in its cell, out of the senders' reach, until the next poll; a
// poll lends at most its limit, and the rest wait in their cells.
TEST(ShmTransport, LentReceivesStayUntilTheNextPoll) {
  auto t = make(0, 1, ShmCopy::automatic, 4);
  t->connect({t->address()});
  t->connected();
  std::vector<unsigned char> a(512), b(512), big(600);
  fill(a.data(), a.size(), 1);
  fill(b.data(), b.size(), 2);
  fill(big.data(), big.size(), 3);
  const std::uint64_t eight = 0x0123456789abcdefULL;
  ASSERT_EQ(t->inject(0, a.data(), a.size()), 0);
  ASSERT_EQ(t->inject(0, b.data(), b.size()), 0);
  ASSERT_EQ(t->inject(0, big.data(), big.size()), 0);
  ASSERT_EQ(t->inject(0, &eight, 8), 0);
  Event ev[8];
  t->set_lend_limit(2);
  ASSERT_EQ(t->poll(ev, 8), 2);
  EXPECT_EQ(ev[0].length, 512u);
  EXPECT_EQ(check(ev[0].lent, 512, 1), 512u);
  EXPECT_EQ(check(ev[1].lent, 512, 2), 512u);
  // Four cells in a ring, two lent and two waiting: the queue is full.
  EXPECT_EQ(t->inject(0, &eight, 8), -EAGAIN);
  t->set_lend_limit(8);
  ASSERT_EQ(t->poll(ev, 8), 2) << "the two that waited";
  EXPECT_EQ(ev[0].length, 600u);
  EXPECT_EQ(check(ev[0].lent, 600, 3), 600u);
  EXPECT_EQ(ev[1].length, 8u);
  EXPECT_EQ(std::memcmp(ev[1].lent, &eight, 8), 0);
  // The first two cells came back with that poll; the last two are lent until the next.
  for (int i = 0; i < 2; ++i) EXPECT_EQ(t->inject(0, &eight, 8), 0) << i;
  EXPECT_EQ(t->inject(0, &eight, 8), -EAGAIN);
  t->set_lend_limit(0);
  EXPECT_EQ(t->poll(ev, 8), 0);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(t->inject(0, &eight, 8), 0) << i;
  EXPECT_EQ(t->inject(0, &eight, 8), -EAGAIN);
  t->cancel_all();
}

// A put_data whose target queue is full: the write stands, and the notice and the event
// follow once the queue has room.
TEST(ShmTransport, PutDataNoticeWaitsForRoom) {
  auto t = make(0, 1, ShmCopy::automatic, 4);
  t->connect({t->address()});
  t->connected();
  const std::uint64_t v = 1;
  for (int i = 0; i < 4; ++i) ASSERT_EQ(t->inject(0, &v, 8), 0);
  std::vector<unsigned char> win(4096), src(4096);
  auto* reg = t->register_memory(win.data(), win.size(), Access::remote_write);
  fill(src.data(), src.size(), 3);
  OpContext c;
  ASSERT_EQ(t->put_data(0, src.data(), src.size(), nullptr, 99, reinterpret_cast<std::uintptr_t>(win.data()), 0, &c), 0);
  EXPECT_EQ(check(win.data(), win.size(), 3), win.size()) << "the write is done at post";
  Event ev[8];
  t->set_lend_limit(0);
  EXPECT_EQ(t->poll(ev, 8), 0) << "no room for the notice, none to lend the messages";
  t->set_lend_limit(4);
  int recvs = 0, put_events = 0, notices = 0;
  ASSERT_TRUE(poll_until(
      *t,
      [&](const Event& e) {
        if (e.remote_write) {
          EXPECT_EQ(e.data, 99u);
          EXPECT_EQ(e.length, 4096u);
          ++notices;
        } else if (e.context == &c) {
          ++put_events;
        } else if (e.lent != nullptr && e.length == 8) {
          ++recvs;
        } else {
          ADD_FAILURE() << "an unexpected event";
        }
      },
      [&] { return recvs == 4 && put_events == 1 && notices == 1; }, 10));
  t->deregister(reg);
}

// Many threads send to one receiver at once (its own rank); every message arrives exactly once
// and in order per thread, and every send() reports exactly one event.
TEST(ShmTransport, ManyThreadsPostConcurrently) {
  auto t = make(0, 1, ShmCopy::automatic, 64);
  t->connect({t->address()});
  t->connected();
  constexpr int kThreads = 3;
  const std::size_t per = ferry::test::scaled(20000, 2000);
  std::vector<std::vector<OpContext>> send_ctx(kThreads, std::vector<OpContext>(per / 4 + 1));
  ferry::test::Gate gate;
  std::atomic<int> finished{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      gate.wait();
      std::size_t used = 0;
      for (std::uint64_t i = 0; i < per; ++i) {
        const std::uint64_t msg[2] = {static_cast<std::uint64_t>(th), i};
        int rc;
        do {
          rc = (i % 4 == 0) ? t->send(0, msg, sizeof msg, nullptr, &send_ctx[th][used]) : t->inject(0, msg, sizeof msg);
          if (rc == -EAGAIN) std::this_thread::yield();
        } while (rc == -EAGAIN);
        ASSERT_EQ(rc, 0);
        if (i % 4 == 0) ++used;
      }
      finished.fetch_add(1, std::memory_order_release);
    });
  }
  gate.open();
  std::vector<std::uint64_t> next(kThreads, 0);
  std::vector<std::vector<char>> seen(kThreads, std::vector<char>(per / 4 + 1, 0));
  std::size_t received = 0, send_events = 0;
  bool ok = true;
  const std::size_t sends_total = kThreads * ((per + 3) / 4);
  const bool done = poll_until(
      *t,
      [&](const Event& e) {
        if (e.lent != nullptr) {
          std::uint64_t m[2] = {~0ULL, ~0ULL};
          if (e.length == sizeof m) std::memcpy(m, e.lent, sizeof m);
          const std::uint64_t th = m[0], seq = m[1];
          if (e.error != 0 || e.context != nullptr || e.length != 16 || th >= kThreads || seq != next[th]) {
            if (ok) ADD_FAILURE() << "thread " << th << " message " << seq << " (error " << e.error << ")";
            ok = false;
          } else {
            ++next[th];
          }
          ++received;
          return;
        }
        for (int th = 0; th < kThreads; ++th) {
          const auto& v = send_ctx[th];
          if (e.context >= &v.front() && e.context <= &v.back()) {
            char& s = seen[th][static_cast<std::size_t>(ferry::detail::OpContext::of(e.context) - &v.front())];
            if (s != 0 && ok) ADD_FAILURE() << "a send event came twice";
            s = 1;
            ++send_events;
            return;
          }
        }
        ADD_FAILURE() << "an event with an unknown context";
        ok = false;
      },
      [&] { return !ok || (received == kThreads * per && send_events == sends_total); }, 120);
  for (auto& th : threads) th.join();
  EXPECT_TRUE(done) << "received " << received << " of " << kThreads * per << ", send events " << send_events;
  EXPECT_TRUE(ok);
}

// RMA to oneself through the queues (forced copy mode): the same code a peer without
// cross-memory attach uses, here visible to the thread sanitizer in one process.
TEST(ShmTransport, CopyModeRmaToSelf) {
  auto t = make(0, 1, ShmCopy::copy, 16);
  t->connect({t->address()});
  t->connected();
  EXPECT_STREQ(t->copy_mode(0), "copy");
  constexpr std::size_t kLen = (1 << 20) + 123;
  std::vector<unsigned char> win(kLen), src(kLen), dst(kLen), guard(4096, 0xee);
  auto* reg = t->register_memory(win.data(), win.size(), Access::remote_read | Access::remote_write);
  EXPECT_EQ(reg->key(), 0u);
  EXPECT_EQ(reg->desc(), nullptr);
  const auto addr = [](const void* p) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)); };

  fill(src.data(), kLen, 1);
  OpContext c1, c2, c3, c4, c5;
  Event e;
  ASSERT_EQ(t->put(0, src.data(), kLen, nullptr, addr(win.data()), 0, &c1), 0);
  ASSERT_TRUE(wait_for(*t, &c1, e));
  EXPECT_EQ(e.error, 0);
  EXPECT_EQ(e.length, kLen);

  fill(src.data(), kLen, 2);
  ASSERT_EQ(t->put_data(0, src.data(), kLen, nullptr, 0xfeedULL, addr(win.data()), 0, &c2), 0);
  bool notified = false, put_done = false;
  ASSERT_TRUE(poll_until(
      *t,
      [&](const Event& ev) {
        if (ev.remote_write) {
          EXPECT_EQ(ev.data, 0xfeedULL);
          EXPECT_EQ(ev.length, kLen);
          EXPECT_EQ(ev.rank, 0);
          EXPECT_EQ(ev.context, nullptr);
          EXPECT_EQ(check(win.data(), kLen, 2), kLen) << "the notice comes after the data";
          notified = true;
        } else if (ev.context == &c2) {
          put_done = true;
        }
      },
      [&] { return notified && put_done; }));

  ASSERT_EQ(t->get(0, dst.data(), kLen, nullptr, addr(win.data()), 0, &c3), 0);
  ASSERT_TRUE(wait_for(*t, &c3, e));
  EXPECT_EQ(e.error, 0);
  EXPECT_EQ(e.length, kLen);
  EXPECT_EQ(check(dst.data(), kLen, 2), kLen);

  // Outside any registration: the put is dropped at the target, the get refused.
  ASSERT_EQ(t->put(0, src.data(), guard.size(), nullptr, addr(guard.data()), 0, &c4), 0);
  ASSERT_TRUE(wait_for(*t, &c4, e));
  ASSERT_EQ(t->get(0, dst.data(), 64, nullptr, addr(win.data() + kLen - 32), 0, &c5), 0);
  ASSERT_TRUE(wait_for(*t, &c5, e));
  EXPECT_EQ(e.error, -EACCES) << "a get running past the end of the registration";
  for (unsigned char b : guard) ASSERT_EQ(b, 0xee) << "a put outside the registrations must not land";

  t->deregister(reg);
  ASSERT_EQ(t->inject_put(0, src.data(), 8, addr(win.data()), 0), 0);
  EXPECT_EQ(t->inject_put(0, src.data(), kPayload + 1, addr(win.data()), 0), -EMSGSIZE);
  Event ev[4];
  for (int i = 0; i < 10; ++i) EXPECT_EQ(t->poll(ev, 4), 0);
  EXPECT_EQ(check(win.data(), 8, 2), 8u) << "after deregister, remote writes are refused";
}

// Copy-mode RMA posted by several threads at once while one thread polls: puts bigger than the
// queue (finished by polls), put_data notices, and gets that share the request table.
TEST(ShmTransport, CopyModeRmaFromManyThreads) {
  auto t = make(0, 1, ShmCopy::copy, 8);
  t->connect({t->address()});
  t->connected();
  constexpr int kThreads = 3;
  const int ops = static_cast<int>(ferry::test::scaled(150, 40));
  constexpr std::size_t kSlice = 3 * kPayload + 100;  // each op spans four cells; the queue holds eight
  std::vector<unsigned char> win(kThreads * kSlice);
  auto* reg = t->register_memory(win.data(), win.size(), Access::remote_read | Access::remote_write);
  struct PerThread {
    std::vector<unsigned char> src = std::vector<unsigned char>(kSlice), dst = std::vector<unsigned char>(kSlice);
    OpContext ctx;
    std::atomic<int> done{0};  // events seen for this thread's current op (set by the poller)
    std::atomic<int> errors{0};
  };
  std::vector<PerThread> pt(kThreads);
  std::atomic<int> notices{0};
  std::atomic<int> finished{0};
  ferry::test::Gate gate;
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      PerThread& me = pt[static_cast<std::size_t>(th)];
      unsigned char* slice = win.data() + th * kSlice;
      const auto target = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(slice));
      gate.wait();
      for (int i = 0; i < ops; ++i) {
        const unsigned seed = static_cast<unsigned>(th * 100000 + i);
        fill(me.src.data(), kSlice, seed);
        const int before = me.done.load(std::memory_order_acquire);
        int rc;
        while ((rc = (i % 2 == 0) ? t->put(0, me.src.data(), kSlice, nullptr, target, 0, &me.ctx)
                                  : t->put_data(0, me.src.data(), kSlice, nullptr, seed, target, 0, &me.ctx)) ==
               -EAGAIN) {
          std::this_thread::yield();
        }
        ASSERT_EQ(rc, 0);
        while (me.done.load(std::memory_order_acquire) == before) std::this_thread::yield();
        // The put's event says its data is queued; a get queued behind it reads it back.
        while ((rc = t->get(0, me.dst.data(), kSlice, nullptr, target, 0, &me.ctx)) == -EAGAIN) {
          std::this_thread::yield();
        }
        ASSERT_EQ(rc, 0);
        while (me.done.load(std::memory_order_acquire) == before + 1) std::this_thread::yield();
        if (check(me.dst.data(), kSlice, seed) != kSlice) me.errors.fetch_add(1, std::memory_order_relaxed);
      }
      finished.fetch_add(1, std::memory_order_release);
    });
  }
  gate.open();
  const bool ok = poll_until(
      *t,
      [&](const Event& e) {
        if (e.remote_write) {
          notices.fetch_add(1, std::memory_order_relaxed);
          return;
        }
        for (auto& me : pt) {
          if (e.context == &me.ctx) {
            if (e.error != 0) me.errors.fetch_add(1, std::memory_order_relaxed);
            me.done.fetch_add(1, std::memory_order_release);
            return;
          }
        }
        ADD_FAILURE() << "an event with an unknown context";
      },
      [&] { return finished.load(std::memory_order_acquire) == kThreads; }, 120);
  for (auto& th : threads) th.join();
  EXPECT_TRUE(ok);
  for (int th = 0; th < kThreads; ++th) {
    EXPECT_EQ(pt[th].errors.load(), 0) << "thread " << th;
    EXPECT_EQ(pt[th].done.load(), 2 * ops) << "thread " << th;
  }
  EXPECT_EQ(notices.load(), kThreads * (ops / 2));
  t->deregister(reg);
}

// Cells written by a broken or hostile process are skipped, and what follows still arrives.
TEST(ShmTransport, MalformedCellsAreSkipped) {
  auto t = make(0, 1, ShmCopy::automatic, 16);
  const std::string addr = t->address();
  t->connect({addr});
  const std::string name = addr.substr(5, addr.find(';', 5) - 5);
  auto seg = ferry::net::shm::Segment::open(name, {getpid(), 0, 0, kPayload});
  t->connected();
  auto q = seg.queue();
  const auto push = [&](std::uint32_t kind, std::uint32_t length, std::int32_t rank, std::uint64_t arg0 = 0) {
    std::uint64_t pos = 0;
    auto* c = q.try_claim(pos);
    ASSERT_NE(c, nullptr);
    c->kind = kind;
    c->length = length;
    c->rank = rank;
    c->aux = 0;
    c->arg0 = arg0;
    c->arg1 = 0;
    std::memset(ferry::net::shm::cell_payload(c), 0x5a, 8);
    ferry::net::shm::CellQueue::publish(c, pos);
  };
  push(99, 8, 0);                                                  // unknown kind
  push(0, 8, 0);                                                   // kind 0
  push(1, kPayload + 1, 0);                                        // longer than a cell
  push(1, 8, 7);                                                   // a rank outside the job
  push(1, 8, -1);
  push(5, 8, 0, 12345);                                            // a get reply nobody asked for
  push(3, 8, 0, reinterpret_cast<std::uintptr_t>(&name));          // a put into unregistered memory
  push(4, 3, 0);                                                   // a short get request
  push(1, 8, 0);                                                   // the one good message
  Event ev[4];
  int n = 0;
  for (int i = 0; i < 4 && n == 0; ++i) n = t->poll(ev, 4);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(ev[0].context, nullptr);
  EXPECT_EQ(ev[0].length, 8u);
  ASSERT_NE(ev[0].lent, nullptr);
  EXPECT_EQ(ev[0].lent[0], 0x5a);
  EXPECT_EQ(t->poll(ev, 4), 0);
}

TEST(ShmTransport, ForeignOrMalformedSegmentsAreRefused) {
  auto t = make(0, 2, ShmCopy::automatic);
  const std::string foreign = "/ferry-" + std::to_string(getpid()) + "-0-notasegment";
  const int fd = shm_open(foreign.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 1 << 16), 0);
  close(fd);
  const std::string pid = std::to_string(getpid());
  const auto expect_error = [&](const std::string& peer, const char* needle) {
    try {
      t->connect({t->address(), peer});
      ADD_FAILURE() << "connect accepted \"" << peer << "\"";
    } catch (const ferry::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("shm1;" + foreign + ";" + pid + ";1;0;1000", "wrong magic");
  expect_error("shm1;/ferry-1-0-gone;1;1;0;1000", "ferry-1-0-gone");
  expect_error("shm1;/etc/passwd;" + pid + ";1;0;1000", "not a ferry segment name");
  expect_error("garbage", "malformed");
  expect_error("shm1;" + foreign + ";" + pid + ";0;0;1000", "names rank 0");
  shm_unlink(foreign.c_str());
  // The real thing under the wrong rank: the header says otherwise.
  auto other = make(0, 2, ShmCopy::automatic);
  std::string a = other->address();
  a.replace(a.find(";0;0;"), 5, ";1;0;");
  expect_error(a, "belongs to rank 0");
}

TEST(ShmTransport, ConnectChecksTheAddressListAndItsOwnEntry) {
  auto t = make(0, 2, ShmCopy::automatic);
  const auto error_of = [&](const std::vector<std::string>& addresses) -> std::string {
    try {
      t->connect(addresses);
    } catch (const ferry::Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(error_of({t->address()}).find("connect got 1 addresses for a job of 2 ranks"), std::string::npos)
      << error_of({t->address()});
  // Another transport's address given as this rank's own.
  auto other = make(0, 2, ShmCopy::automatic);
  const std::string not_mine = error_of({other->address(), ""});
  EXPECT_NE(not_mine.find("address of this rank (0) is not its own"), std::string::npos) << not_mine;
}

TEST(ShmTransport, RegisterMemoryRefusesANullBufferAndAWrappingRange) {
  auto t = make(0, 1, ShmCopy::automatic);
  const auto error_of = [&](const void* buf, std::size_t len) -> std::string {
    try {
      t->deregister(t->register_memory(buf, len, Access::remote_read));
    } catch (const ferry::Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(error_of(nullptr, 64).find("register_memory of a null buffer with length 64"), std::string::npos)
      << error_of(nullptr, 64);
  const auto* high = reinterpret_cast<const void*>(UINTPTR_MAX - 15);
  const std::string wraps = error_of(high, 32);
  EXPECT_NE(wraps.find("of 32 bytes wraps around"), std::string::npos) << wraps;
  char byte = 0;
  EXPECT_EQ(error_of(&byte, 1), "no error");
}

// Each field of a peer's segment header is checked against what its address and this process
// expect; a segment written by another version or geometry is refused naming the field.
TEST(ShmTransport, EachSegmentHeaderFieldIsChecked) {
  using ferry::net::shm::Segment;
  using ferry::net::shm::SegmentHeader;
  Segment owner = Segment::create(0, 2, 0, kPayload, 256);
  auto* h = reinterpret_cast<SegmentHeader*>(owner.base());
  const SegmentHeader good = *h;
  const auto error_of = [&](const ferry::net::shm::SegmentExpect& expect) -> std::string {
    try {
      Segment peer = Segment::open(owner.name(), expect);
    } catch (const ferry::Error& e) {
      return e.what();
    }
    return "no error";
  };
  const ferry::net::shm::SegmentExpect expect{getpid(), 0, 0, kPayload};
  ASSERT_EQ(error_of(expect), "no error");
  const auto refused = [&](auto patch, const std::string& needle) {
    *h = good;
    patch(*h);
    const std::string what = error_of(expect);
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    *h = good;
  };
  refused([](SegmentHeader& x) { x.version += 1; }, "version ");
  refused([](SegmentHeader& x) { x.owner_pid += 1; }, "owned by pid ");
  refused([](SegmentHeader& x) { x.device = 3; }, "belongs to device 3, expected 0");
  refused([](SegmentHeader& x) { x.cell_payload = kPayload / 2; }, "all ranks must use the same packet size");
  refused([](SegmentHeader& x) { x.cells = 100; }, "cell count 100 is not a power of two");
  refused([](SegmentHeader& x) { x.stride += 64; }, "inconsistent geometry");
  refused([](SegmentHeader& x) { x.total_bytes *= 2; }, "inconsistent geometry");
  // A name that exists but is too small to hold a header.
  const std::string tiny = "/ferry-" + std::to_string(getpid()) + "-0-tiny";
  const int fd = shm_open(tiny.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 100), 0);
  close(fd);
  try {
    Segment peer = Segment::open(tiny, expect);
    ADD_FAILURE() << "a 100-byte segment was accepted";
  } catch (const ferry::Error& e) {
    EXPECT_NE(std::string(e.what()).find("only 100 bytes, smaller than a header"), std::string::npos) << e.what();
  }
  shm_unlink(tiny.c_str());
}

// Forced cross-memory attach (copy mode cma) that the probe cannot confirm is refused, naming
// the rank and the mode that works without it.
TEST(ShmTransport, ForcedCrossMemoryAttachThatFailsIsRefused) {
  auto t = make(0, 2, ShmCopy::cma);
  auto other = make(1, 2, ShmCopy::automatic);
  // Rank 1's address with its probe address replaced by one no process maps (the last field).
  std::string a = other->address();
  a = a.substr(0, a.rfind(';') + 1) + "8";
  try {
    t->connect({t->address(), a});
    ADD_FAILURE() << "connect accepted a probe that cannot be read: " << a;
  } catch (const ferry::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cross-memory attach to rank 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("the copy mode 'copy' works without it"), std::string::npos) << e.what();
  }
}

// The owner's set-up failing for lack of resources, made with this process's own limits: no
// descriptor left for shm_open, and a file size limit below the segment's size for ftruncate.
// Each is an error naming the call and the segment, and no name is left in /dev/shm.
TEST(ShmTransport, SegmentCreationFailuresAreNamed) {
  using ferry::net::shm::Segment;
  const auto error_with_limit = [](int resource, rlim_t soft) -> std::string {
    rlimit saved{};
    EXPECT_EQ(getrlimit(resource, &saved), 0);
    rlimit low = saved;
    low.rlim_cur = soft;
    EXPECT_EQ(setrlimit(resource, &low), 0);
    // The error is looked at only once the limit is back: a sanitizer's checks of it (UBSan's
    // vptr check) may need a descriptor of their own.
    std::exception_ptr error;
    try {
      Segment s = Segment::create(0, 2, 0, kPayload, 256);
    } catch (...) {
      error = std::current_exception();
    }
    EXPECT_EQ(setrlimit(resource, &saved), 0);
    if (error == nullptr) return "no error";
    try {
      std::rethrow_exception(error);
    } catch (const ferry::Error& e) {
      return e.what();
    } catch (...) {
      return "an exception that is not a ferry::Error";
    }
  };
  const std::string no_fd = error_with_limit(RLIMIT_NOFILE, 0);
  EXPECT_NE(no_fd.find("shm_open(\"/ferry-" + std::to_string(getpid()) + "-0-"), std::string::npos) << no_fd;
  EXPECT_NE(no_fd.find("failed"), std::string::npos) << no_fd;
  // Past RLIMIT_FSIZE, ftruncate fails with EFBIG and raises SIGXFSZ, ignored here.
  struct sigaction ignore{}, saved{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGXFSZ, &ignore, &saved), 0);
  const std::string too_big = error_with_limit(RLIMIT_FSIZE, 4096);
  ASSERT_EQ(sigaction(SIGXFSZ, &saved, nullptr), 0);
  EXPECT_NE(too_big.find("ftruncate of shm segment"), std::string::npos) << too_big;
  EXPECT_NE(too_big.find("is /dev/shm large enough?"), std::string::npos) << too_big;
  EXPECT_TRUE(segments_of(getpid()).empty()) << "a failed create left its name behind";
}

}  // namespace
