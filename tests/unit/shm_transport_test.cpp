// The shared-memory transport on its own: one process talking to itself (many threads
// posting at once, copy-mode RMA, malformed cells, foreign segments), then two processes
// (fork) exercising messages and RMA of 1 MiB and 64 MiB with cross-memory attach and with
// copying through the queues, and leaving nothing in /dev/shm.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ferry/error.hpp"
#include "net/shm/shm_transport.hpp"
#include "test_scale.hpp"

namespace {

using ferry::detail::OpContext;
using ferry::net::Access;
using ferry::net::Event;
using ferry::net::ShmCopy;
using ferry::net::ShmParams;
using ferry::net::shm::ShmTransport;

constexpr std::size_t kPayload = 8192;
using Clock = std::chrono::steady_clock;

std::unique_ptr<ShmTransport> make(int rank, int size, ShmCopy copy, std::size_t cells = 256) {
  return std::make_unique<ShmTransport>(ShmParams{rank, size, 0, kPayload, cells, copy});
}

// Names in /dev/shm that belong to pid.
std::vector<std::string> segments_of(int pid) {
  std::vector<std::string> out;
  const std::string prefix = "ferry-" + std::to_string(pid) + "-";
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) out.emplace_back(e->d_name);
    }
    closedir(d);
  }
  return out;
}

std::uint8_t pattern(std::size_t i, unsigned seed) {
  return static_cast<std::uint8_t>(i * 131u + seed * 7u + (i >> 12) + (i >> 20) * 3u);
}
void fill(unsigned char* p, std::size_t n, unsigned seed) {
  for (std::size_t i = 0; i < n; ++i) p[i] = pattern(i, seed);
}
// Index of the first wrong byte, or n.
std::size_t check(const unsigned char* p, std::size_t n, unsigned seed) {
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != pattern(i, seed)) return i;
  }
  return n;
}

// Polls until `done` says so or the deadline passes; every event goes to `on`.
bool poll_until(ShmTransport& t, const std::function<void(const Event&)>& on, const std::function<bool()>& done,
                double seconds = 60) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  Event ev[16];
  while (!done()) {
    const int n = t.poll(ev, 16);
    for (int i = 0; i < n; ++i) on(ev[i]);
    if (n == 0 && Clock::now() > deadline) return false;
  }
  return true;
}

// One event for ctx (other events are passed to `other`).
bool wait_for(ShmTransport& t, OpContext* ctx, Event& out, const std::function<void(const Event&)>& other = {}) {
  bool got = false;
  return poll_until(
      t,
      [&](const Event& e) {
        if (!got && e.context == ctx) {
          out = e;
          got = true;
        } else if (other) {
          other(e);
        }
      },
      [&] { return got; });
}

// --- One process ---------------------------------------------------------------------------

TEST(ShmTransport, ParametersAreChecked) {
  EXPECT_THROW(ShmTransport(ShmParams{2, 2, 0, kPayload, 256, ShmCopy::automatic}), ferry::Error);
  EXPECT_THROW(ShmTransport(ShmParams{0, 1, 0, kPayload, 100, ShmCopy::automatic}), ferry::Error);
  EXPECT_THROW(ShmTransport(ShmParams{0, 1, 0, 4, 256, ShmCopy::automatic}), ferry::Error);
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

  // Nothing posted: the messages wait (only send's local event comes out).
  Event ev[8];
  int n = t->poll(ev, 8);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(ev[0].context, &send_ctx);
  EXPECT_EQ(ev[0].length, kPayload);
  EXPECT_EQ(ev[0].error, 0);
  EXPECT_EQ(t->poll(ev, 8), 0);

  OpContext r[3];
  std::vector<unsigned char> b0(64), b1(kPayload), b2(8);
  ASSERT_EQ(t->post_recv(b0.data(), b0.size(), nullptr, &r[0]), 0);
  ASSERT_EQ(t->post_recv(b1.data(), b1.size(), nullptr, &r[1]), 0);
  ASSERT_EQ(t->post_recv(b2.data(), b2.size(), nullptr, &r[2]), 0);
  n = t->poll(ev, 8);
  ASSERT_EQ(n, 3);
  EXPECT_EQ(ev[0].context, &r[0]);
  EXPECT_EQ(ev[0].length, 8u);
  EXPECT_EQ(ev[0].rank, 0);
  EXPECT_EQ(ev[0].error, 0);
  EXPECT_EQ(std::memcmp(b0.data(), &eight, 8), 0);
  EXPECT_EQ(ev[1].context, &r[1]);
  EXPECT_EQ(ev[1].length, kPayload);
  EXPECT_EQ(check(b1.data(), kPayload, 5), kPayload);
  EXPECT_EQ(ev[2].context, &r[2]);
  EXPECT_EQ(ev[2].error, -EMSGSIZE) << "16 bytes into an 8-byte receive";
  EXPECT_EQ(ev[2].length, 8u);
  EXPECT_EQ(check(b2.data(), 8, 5), 8u);

  // A full queue refuses, and cancel_all forgets posted receives.
  int accepted = 0;
  while (t->inject(0, &eight, 8) == 0) ++accepted;
  EXPECT_EQ(accepted, 256);
  EXPECT_EQ(t->inject(0, &eight, 8), -EAGAIN);
  ASSERT_EQ(t->post_recv(b0.data(), b0.size(), nullptr, &r[0]), 0);
  t->cancel_all();
  EXPECT_EQ(t->poll(ev, 8), 0);
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
  EXPECT_EQ(t->poll(ev, 8), 0) << "no room for the notice, no receive for the messages";
  OpContext r[4];
  std::uint64_t b[4];
  for (int i = 0; i < 4; ++i) t->post_recv(&b[i], 8, nullptr, &r[i]);
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
        } else {
          ++recvs;
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
  constexpr int kRecvs = 32;
  OpContext rctx[kRecvs];
  std::uint64_t rbuf[kRecvs][2];
  for (int i = 0; i < kRecvs; ++i) ASSERT_EQ(t->post_recv(rbuf[i], sizeof rbuf[i], nullptr, &rctx[i]), 0);
  gate.open();
  std::vector<std::uint64_t> next(kThreads, 0);
  std::vector<std::vector<char>> seen(kThreads, std::vector<char>(per / 4 + 1, 0));
  std::size_t received = 0, send_events = 0;
  bool ok = true;
  const std::size_t sends_total = kThreads * ((per + 3) / 4);
  const bool done = poll_until(
      *t,
      [&](const Event& e) {
        if (e.context >= &rctx[0] && e.context < &rctx[kRecvs]) {
          const auto i = static_cast<std::size_t>(e.context - &rctx[0]);
          const std::uint64_t th = rbuf[i][0], seq = rbuf[i][1];
          if (e.error != 0 || e.length != 16 || th >= kThreads || seq != next[th]) {
            if (ok) ADD_FAILURE() << "thread " << th << " message " << seq << " (error " << e.error << ")";
            ok = false;
          } else {
            ++next[th];
          }
          ++received;
          ASSERT_EQ(t->post_recv(rbuf[i], sizeof rbuf[i], nullptr, &rctx[i]), 0);
          return;
        }
        for (int th = 0; th < kThreads; ++th) {
          const auto& v = send_ctx[th];
          if (e.context >= &v.front() && e.context <= &v.back()) {
            char& s = seen[th][static_cast<std::size_t>(e.context - &v.front())];
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
  OpContext r;
  unsigned char buf[16] = {};
  ASSERT_EQ(t->post_recv(buf, sizeof buf, nullptr, &r), 0);
  Event ev[4];
  int n = 0;
  for (int i = 0; i < 4 && n == 0; ++i) n = t->poll(ev, 4);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(ev[0].context, &r);
  EXPECT_EQ(ev[0].length, 8u);
  EXPECT_EQ(buf[0], 0x5a);
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

// --- Two processes -------------------------------------------------------------------------

// A byte pipe each way between parent (rank 0) and child (rank 1).
struct Link {
  int in = -1, out = -1;
  bool put(const void* p, std::size_t n) const {
    const auto* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = write(out, c, n);
      if (w <= 0) return false;
      c += w;
      n -= static_cast<std::size_t>(w);
    }
    return true;
  }
  bool get(void* p, std::size_t n, int timeout_ms = 60000) const {
    auto* c = static_cast<char*>(p);
    while (n > 0) {
      pollfd pfd{in, POLLIN, 0};
      if (::poll(&pfd, 1, timeout_ms) <= 0) return false;
      const ssize_t r = read(in, c, n);
      if (r <= 0) return false;
      c += r;
      n -= static_cast<std::size_t>(r);
    }
    return true;
  }
  bool put_string(const std::string& s) const {
    const std::uint64_t n = s.size();
    return put(&n, 8) && put(s.data(), s.size());
  }
  bool get_string(std::string& s) const {
    std::uint64_t n = 0;
    if (!get(&n, 8) || n > 4096) return false;
    s.resize(n);
    return get(s.data(), n);
  }
  bool barrier() const {
    char b = 'b';
    return put(&b, 1) && get(&b, 1);
  }
};

// Forks rank 1 and guarantees it is gone when the test is: the child dies with the parent
// (PR_SET_PDEATHSIG), and the guard's destructor — reached also when an assertion or an
// exception ends the test early — waits for it a while, then kills it.
class ChildGuard {
 public:
  // Runs body(link) in a child process and exits with its result; returns in the parent.
  template <class Body>
  explicit ChildGuard(Body body) {
    int up[2], down[2];
    if (pipe(up) != 0 || pipe(down) != 0) throw std::runtime_error("pipe failed");
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(4);  // the parent is gone already
      close(up[0]);
      close(down[1]);
      int rc = 3;
      try {
        rc = body(Link{down[0], up[1]});
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank 1] exception: %s\n", e.what());
      }
      _exit(rc);
    }
    close(up[1]);
    close(down[0]);
    link_ = Link{up[0], down[1]};
  }
  ChildGuard(const ChildGuard&) = delete;
  ChildGuard& operator=(const ChildGuard&) = delete;
  ~ChildGuard() {
    if (pid_ > 0 && !reaped_) wait(false);
  }
  const Link& link() const { return link_; }
  pid_t pid() const { return pid_; }
  // Closes the pipes (the child sees EOF), waits up to 30 s, then kills. Returns the exit
  // code, or -1 when the child had to be killed or did not exit normally.
  int wait(bool report = true) {
    close(link_.in);
    close(link_.out);
    int status = 0;
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    pid_t w;
    while ((w = waitpid(pid_, &status, WNOHANG)) == 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    reaped_ = true;
    if (w == 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      if (report) ADD_FAILURE() << "rank 1 did not exit; killed";
      return -1;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  Link link_;
};

// Commands rank 0 sends rank 1 through the transport itself, so in copy mode they arrive
// after the chunks of the puts before them.
struct Cmd {
  std::uint32_t op;  // 0 verify window, 1 verify guard untouched, 2 quit
  std::uint32_t seed;
  std::uint64_t len;
};
struct Reply {
  std::uint64_t ok;  // 1: as expected
  std::uint64_t data;
  std::uint64_t len;
};
enum : std::uint32_t { kVerify = 0, kVerifyGuard = 1, kQuit = 2, kRemoteWrite = 3 };
// 64 MiB; a quarter of that under TSan, whose instrumented fill and check take ~20 s for it.
constexpr std::size_t kBig = std::size_t{FERRY_TEST_TSAN ? 16 : 64} << 20;
constexpr std::size_t kMiB = std::size_t{1} << 20;

std::uint64_t as_addr(const void* p) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)); }

// Failures in a process that is not the test's own: count and print them.
struct Checks {
  const char* who;
  int failures = 0;
  void expect(bool ok, const std::string& what) {
    if (!ok) {
      ++failures;
      std::fprintf(stderr, "[%s] FAILED: %s\n", who, what.c_str());
    }
  }
};

struct Side {
  std::unique_ptr<ShmTransport> t;
  std::vector<unsigned char> win, guard;
  ferry::net::Registration* reg = nullptr;
  std::uint64_t peer_win = 0, peer_guard = 0;
};

// Both processes: build, exchange addresses and window addresses, connect, connected.
bool setup(Side& s, const Link& link, int rank, ShmCopy copy, Checks& ck) {
  s.t = make(rank, 2, copy);
  s.win.assign(kBig, 0);
  s.guard.assign(4096, 0xee);
  s.reg = s.t->register_memory(s.win.data(), s.win.size(), Access::remote_read | Access::remote_write);
  std::string peer;
  if (!link.put_string(s.t->address()) || !link.get_string(peer)) return false;
  std::vector<std::string> addrs(2);
  addrs[static_cast<std::size_t>(rank)] = s.t->address();
  addrs[static_cast<std::size_t>(1 - rank)] = peer;
  try {
    s.t->connect(addrs);
  } catch (const ferry::Error& e) {
    ck.expect(false, e.what());
    return false;
  }
  const std::uint64_t mine[2] = {as_addr(s.win.data()), as_addr(s.guard.data())};
  std::uint64_t theirs[2];
  if (!link.put(mine, sizeof mine) || !link.get(theirs, sizeof theirs) || !link.barrier()) return false;
  s.peer_win = theirs[0];
  s.peer_guard = theirs[1];
  s.t->connected();
  return link.barrier();  // both have unlinked their segments
}

// Rank 1: sends rank 0 a few messages, then serves commands until told to quit.
int child_main(const Link& link, ShmCopy copy) {
  Checks ck{"rank 1"};
  Side s;
  if (!setup(s, link, 1, copy, ck)) return 2;
  ShmTransport& t = *s.t;

  // Messages to rank 0: 8 B and a whole cell by inject, one send with its event, one too long
  // for the receive rank 0 posts for it.
  std::vector<unsigned char> big(kPayload);
  fill(big.data(), big.size(), 9);
  const std::uint64_t eight = 0x1122334455667788ULL;
  OpContext sctx;
  ck.expect(t.inject(0, &eight, 8) == 0, "inject 8 B");
  ck.expect(t.inject(0, big.data(), kPayload) == 0, "inject a whole cell");
  ck.expect(t.send(0, big.data(), 100, nullptr, &sctx) == 0, "send");
  ck.expect(t.inject(0, big.data(), 16) == 0, "inject 16 B");
  Event e{};
  ck.expect(wait_for(t, &sctx, e) && e.error == 0 && e.length == 100 && e.rank == 0, "send event");

  constexpr int kRecvs = 4;
  OpContext rctx[kRecvs];
  Cmd cmd[kRecvs];
  for (int i = 0; i < kRecvs; ++i) t.post_recv(&cmd[i], sizeof cmd[i], nullptr, &rctx[i]);
  const auto reply = [&](const Reply& r) {
    int rc;
    Event ev[8];
    while ((rc = t.inject(0, &r, sizeof r)) == -EAGAIN) t.poll(ev, 0);
    ck.expect(rc == 0, "reply");
  };
  bool quit = false;
  const bool ok = poll_until(
      t,
      [&](const Event& ev) {
        if (ev.remote_write) {
          const auto seed = static_cast<unsigned>(ev.data >> 32);
          const bool good = ev.rank == 0 && ev.context == nullptr && ev.length <= kBig &&
                            check(s.win.data(), ev.length, seed) == ev.length;
          reply(Reply{good ? 1u : 0u, ev.data, ev.length});
          return;
        }
        for (int i = 0; i < kRecvs; ++i) {
          if (ev.context != &rctx[i]) continue;
          const Cmd c = cmd[i];
          t.post_recv(&cmd[i], sizeof cmd[i], nullptr, &rctx[i]);
          if (c.op == kQuit) {
            quit = true;
          } else if (c.op == kVerify) {
            const bool good = c.len <= kBig && check(s.win.data(), c.len, c.seed) == c.len;
            reply(Reply{good ? 1u : 0u, 0, c.len});
          } else if (c.op == kVerifyGuard) {
            bool good = true;
            for (unsigned char b : s.guard) good = good && b == 0xee;
            reply(Reply{good ? 1u : 0u, 0, 0});
          } else if (c.op == kRemoteWrite) {
            // Rank 1 writes into rank 0's window and notifies (the other direction).
            std::vector<unsigned char> src(c.len);
            fill(src.data(), src.size(), c.seed);
            OpContext pctx;
            int rc;
            Event dummy[8];
            while ((rc = t.put_data(0, src.data(), src.size(), nullptr, std::uint64_t{c.seed} << 32, s.peer_win, 0,
                                    &pctx)) == -EAGAIN) {
              t.poll(dummy, 0);
            }
            ck.expect(rc == 0, "put_data to rank 0");
            Event pe{};
            ck.expect(wait_for(t, &pctx, pe) && pe.error == 0, "put_data event at rank 1");
          }
          return;
        }
      },
      [&] { return quit; }, 120);
  ck.expect(ok, "rank 1 timed out waiting for commands");
  ck.expect(link.barrier(), "final barrier");
  t.deregister(s.reg);
  return ck.failures == 0 ? 0 : 1;
}

// Rank 0 (the test process): receives rank 1's messages, then drives RMA into rank 1's
// window and asks rank 1 to check what landed.
void parent_main(const Link& link, ShmCopy copy, pid_t child) {
  Checks ck{"rank 0"};
  Side s;
  ASSERT_TRUE(setup(s, link, 0, copy, ck)) << "setup failed";
  ShmTransport& t = *s.t;
  EXPECT_TRUE(segments_of(getpid()).empty()) << "rank 0's segment is unlinked after connected()";
  EXPECT_TRUE(segments_of(child).empty()) << "rank 1's segment is unlinked after connected()";
  EXPECT_TRUE(t.peer_alive(1));
  if (copy == ShmCopy::copy) {
    EXPECT_STREQ(t.copy_mode(1), "copy");
    EXPECT_EQ(t.copy_summary(), "copy");
  } else {
    EXPECT_STREQ(t.copy_mode(1), "cma");
    EXPECT_EQ(t.copy_summary(), "cma");
  }
  EXPECT_STREQ(t.copy_mode(0), copy == ShmCopy::copy ? "copy" : "self");

  // Rank 1's four messages, into 8 KiB, 8 KiB, 8 KiB and 8-byte receives.
  std::vector<std::vector<unsigned char>> bufs = {std::vector<unsigned char>(kPayload),
                                                   std::vector<unsigned char>(kPayload),
                                                   std::vector<unsigned char>(kPayload), std::vector<unsigned char>(8)};
  OpContext rctx[4];
  for (int i = 0; i < 4; ++i) t.post_recv(bufs[i].data(), bufs[i].size(), nullptr, &rctx[i]);
  std::vector<Event> got;
  ASSERT_TRUE(poll_until(t, [&](const Event& e) { got.push_back(e); }, [&] { return got.size() >= 4; }));
  ASSERT_EQ(got.size(), 4u);
  const std::uint64_t eight = 0x1122334455667788ULL;
  EXPECT_EQ(got[0].context, &rctx[0]);
  EXPECT_EQ(got[0].length, 8u);
  EXPECT_EQ(got[0].rank, 1);
  EXPECT_EQ(std::memcmp(bufs[0].data(), &eight, 8), 0);
  EXPECT_EQ(got[1].length, kPayload);
  EXPECT_EQ(check(bufs[1].data(), kPayload, 9), kPayload);
  EXPECT_EQ(got[2].length, 100u);
  EXPECT_EQ(check(bufs[2].data(), 100, 9), 100u);
  EXPECT_EQ(got[3].error, -EMSGSIZE);
  EXPECT_EQ(got[3].length, 8u);

  // A self-send alongside.
  OpContext self_r, self_s;
  std::uint64_t self_in = 0;
  const std::uint64_t self_out = 77;
  t.post_recv(&self_in, 8, nullptr, &self_r);
  ASSERT_EQ(t.send(0, &self_out, 8, nullptr, &self_s), 0);
  int self_events = 0;
  ASSERT_TRUE(poll_until(
      t, [&](const Event& e) { self_events += (e.context == &self_r || e.context == &self_s) ? 1 : 0; },
      [&] { return self_events == 2; }));
  EXPECT_EQ(self_in, 77u);

  // Replies from rank 1 land in these.
  constexpr int kRecvs = 4;
  OpContext rr[kRecvs];
  Reply rbuf[kRecvs];
  for (int i = 0; i < kRecvs; ++i) t.post_recv(&rbuf[i], sizeof rbuf[i], nullptr, &rr[i]);
  const auto next_reply = [&](Reply& out, const std::function<void(const Event&)>& other = {}) {
    bool have = false;
    const bool ok = poll_until(
        t,
        [&](const Event& e) {
          for (int i = 0; i < kRecvs; ++i) {
            if (e.context == &rr[i] && !have) {
              out = rbuf[i];
              have = true;
              t.post_recv(&rbuf[i], sizeof rbuf[i], nullptr, &rr[i]);
              return;
            }
          }
          if (other) other(e);
        },
        [&] { return have; }, 120);
    return ok;
  };
  const auto command = [&](Cmd c) {
    int rc;
    Event ev[1];
    while ((rc = t.inject(1, &c, sizeof c)) == -EAGAIN) t.poll(ev, 0);
    ASSERT_EQ(rc, 0);
  };
  const auto rma = [&](auto post, OpContext* ctx) {
    int rc;
    Event ev[1];
    while ((rc = post()) == -EAGAIN) t.poll(ev, 0);
    ASSERT_EQ(rc, 0);
    Event e{};
    ASSERT_TRUE(wait_for(t, ctx, e));
    EXPECT_EQ(e.error, 0);
    EXPECT_EQ(e.rank, 1);
  };

  std::vector<unsigned char> src(kBig), dst(kBig);
  unsigned seed = 20;
  for (const std::size_t len : {kMiB, kBig}) {
    SCOPED_TRACE("length " + std::to_string(len));
    // put, then rank 1 checks its window.
    ++seed;
    fill(src.data(), len, seed);
    OpContext c;
    rma([&] { return t.put(1, src.data(), len, nullptr, s.peer_win, 0, &c); }, &c);
    command(Cmd{kVerify, seed, len});
    Reply r{};
    ASSERT_TRUE(next_reply(r));
    EXPECT_EQ(r.ok, 1u) << "put landed byte-exact";

    // put_data: rank 1 checks its window when the notice arrives.
    ++seed;
    fill(src.data(), len, seed);
    rma([&] { return t.put_data(1, src.data(), len, nullptr, std::uint64_t{seed} << 32 | 7, s.peer_win, 0, &c); }, &c);
    ASSERT_TRUE(next_reply(r));
    EXPECT_EQ(r.ok, 1u) << "put_data's data was visible at its notice";
    EXPECT_EQ(r.data, std::uint64_t{seed} << 32 | 7);
    EXPECT_EQ(r.len, len);

    // get it back.
    std::memset(dst.data(), 0, len);
    rma([&] { return t.get(1, dst.data(), len, nullptr, s.peer_win, 0, &c); }, &c);
    EXPECT_EQ(check(dst.data(), len, seed), len) << "get is byte-exact";

    // The other direction: rank 1 put_data's into rank 0's window.
    ++seed;
    command(Cmd{kRemoteWrite, seed, len});
    Event notice{};
    bool noticed = false;
    ASSERT_TRUE(poll_until(
        t,
        [&](const Event& e) {
          if (e.remote_write) {
            notice = e;
            noticed = true;
          }
        },
        [&] { return noticed; }, 120));
    EXPECT_EQ(notice.rank, 1);
    EXPECT_EQ(notice.length, len);
    EXPECT_EQ(notice.data, std::uint64_t{seed} << 32);
    EXPECT_EQ(check(s.win.data(), len, seed), len) << "rank 1's put_data landed before its notice";
  }

  if (copy == ShmCopy::copy) {
    // Outside rank 1's registrations: dropped there (logged), never written.
    OpContext c;
    rma([&] { return t.put(1, src.data(), 4096, nullptr, s.peer_guard, 0, &c); }, &c);
    ASSERT_EQ(t.inject_put(1, src.data(), 64, s.peer_guard + 128, 0), 0);
    command(Cmd{kVerifyGuard, 0, 0});
    Reply r{};
    ASSERT_TRUE(next_reply(r));
    EXPECT_EQ(r.ok, 1u) << "a put chunk outside the target's registrations was refused";
    Event e{};
    ASSERT_EQ(t.get(1, dst.data(), 4096, nullptr, s.peer_guard, 0, &c), 0);
    ASSERT_TRUE(wait_for(t, &c, e));
    EXPECT_EQ(e.error, -EACCES);
  }
  // A rank without an address.
  OpContext c;
  EXPECT_EQ(t.put(5, src.data(), 8, nullptr, s.peer_win, 0, &c), -EHOSTUNREACH);

  command(Cmd{kQuit, 0, 0});
  EXPECT_TRUE(link.barrier());
  t.deregister(s.reg);
  EXPECT_EQ(ck.failures, 0);
}

void two_process(ShmCopy copy) {
  ChildGuard child([copy](const Link& link) { return child_main(link, copy); });
  parent_main(child.link(), copy, child.pid());
  EXPECT_EQ(child.wait(), 0) << "rank 1 failed";
  EXPECT_TRUE(segments_of(getpid()).empty());
  EXPECT_TRUE(segments_of(child.pid()).empty()) << "rank 1 left a segment";
}

// Several threads of one process send to another process at once; the receiver gets every
// message exactly once, in order per thread, and the senders every send event.
TEST(ShmTransportTwoProcesses, ManyThreadsSendAcrossProcesses) {
  constexpr int kThreads = 3;
  const std::uint64_t per = ferry::test::scaled(20000, 2000);
  // Both sides: exchange addresses, connect, and unlink only once both have mapped.
  const auto join = [](ShmTransport& t, const Link& link, int rank) {
    std::string peer;
    if (!link.put_string(t.address()) || !link.get_string(peer)) return false;
    std::vector<std::string> addrs(2);
    addrs[static_cast<std::size_t>(rank)] = t.address();
    addrs[static_cast<std::size_t>(1 - rank)] = peer;
    t.connect(addrs);
    if (!link.barrier()) return false;
    t.connected();
    return true;
  };
  ChildGuard child([&](const Link& link) {
    auto t = make(1, 2, ShmCopy::automatic, 32);
    if (!join(*t, link, 1)) return 2;
    std::vector<std::vector<OpContext>> ctx(kThreads, std::vector<OpContext>(per / 2 + 1));
    std::atomic<int> failed{0}, finished{0};
    const auto deadline = Clock::now() + std::chrono::seconds(100);
    std::vector<std::thread> threads;
    for (int th = 0; th < kThreads; ++th) {
      threads.emplace_back([&, th] {
        std::size_t used = 0;
        for (std::uint64_t i = 0; i < per && failed.load(std::memory_order_relaxed) == 0; ++i) {
          const std::uint64_t msg[2] = {static_cast<std::uint64_t>(th), i};
          int r;
          while ((r = (i % 2) ? t->send(0, msg, sizeof msg, nullptr, &ctx[th][used]) : t->inject(0, msg, sizeof msg)) ==
                 -EAGAIN) {
            if (Clock::now() > deadline) break;
            std::this_thread::yield();
          }
          if (r != 0) failed.fetch_add(1);
          if (i % 2) ++used;
        }
        finished.fetch_add(1, std::memory_order_release);
      });
    }
    std::size_t events = 0;
    const bool ok = poll_until(
        *t, [&](const Event& e) { events += e.error == 0 ? 1 : 0; },
        [&] {
          return finished.load(std::memory_order_acquire) == kThreads &&
                 (failed.load() != 0 || events == kThreads * (per / 2));
        },
        120);
    for (auto& th : threads) th.join();
    if (!ok || failed.load() != 0) std::fprintf(stderr, "[rank 1] %d sends failed, %zu events\n", failed.load(), events);
    return (ok && failed.load() == 0 && link.barrier()) ? 0 : 1;
  });
  {
    auto t = make(0, 2, ShmCopy::automatic, 32);
    ASSERT_TRUE(join(*t, child.link(), 0));
    constexpr int kRecvs = 16;
    OpContext rctx[kRecvs];
    std::uint64_t rbuf[kRecvs][2];
    for (int i = 0; i < kRecvs; ++i) t->post_recv(rbuf[i], sizeof rbuf[i], nullptr, &rctx[i]);
    std::vector<std::uint64_t> next(kThreads, 0);
    std::uint64_t received = 0;
    bool ok = true;
    const bool done = poll_until(
        *t,
        [&](const Event& e) {
          const auto i = static_cast<std::size_t>(e.context - &rctx[0]);
          if (i >= kRecvs) {
            if (ok) ADD_FAILURE() << "an event with an unknown context";
            ok = false;
            return;
          }
          const std::uint64_t th = rbuf[i][0], seq = rbuf[i][1];
          if (e.error != 0 || e.rank != 1 || th >= kThreads || seq != next[th]) {
            if (ok) ADD_FAILURE() << "thread " << th << " message " << seq << ", error " << e.error;
            ok = false;
          } else {
            ++next[th];
          }
          ++received;
          t->post_recv(rbuf[i], sizeof rbuf[i], nullptr, &rctx[i]);
        },
        [&] { return !ok || received == kThreads * per; }, 120);
    EXPECT_TRUE(done) << received << " of " << kThreads * per;
    EXPECT_TRUE(ok);
    EXPECT_TRUE(child.link().barrier());
  }
  EXPECT_EQ(child.wait(), 0) << "rank 1 failed";
  EXPECT_TRUE(segments_of(child.pid()).empty());
}

TEST(ShmTransportTwoProcesses, CrossMemoryAttach) {
  // Skip where the kernel forbids CMA here (then the copy test covers the transport).
  {
    auto a = make(0, 2, ShmCopy::automatic);
    auto b = make(1, 2, ShmCopy::automatic);
    a->connect({a->address(), b->address()});
    if (std::string(a->copy_mode(1)) != "cma") GTEST_SKIP() << "process_vm_readv is not permitted here";
  }
  two_process(ShmCopy::cma);
}

TEST(ShmTransportTwoProcesses, CopyThroughSharedMemory) { two_process(ShmCopy::copy); }

}  // namespace
