// The shared-memory transport between two processes (fork): messages, and RMA of 1 MiB and
// 64 MiB with cross-memory attach and with copying through the queues; several threads of
// one process sending to the other; nothing left in /dev/shm.
#include <gtest/gtest.h>
#include <unistd.h>

#include "shm_test_util.hpp"

namespace {

using namespace ferry::test::shm;

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
  for (int i = 0; i < kRecvs; ++i) post(t, &cmd[i], sizeof cmd[i], &rctx[i]);
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
          post(t, &cmd[i], sizeof cmd[i], &rctx[i]);
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
  for (int i = 0; i < 4; ++i) post(t, bufs[i].data(), bufs[i].size(), &rctx[i]);
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
  post(t, &self_in, 8, &self_r);
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
  for (int i = 0; i < kRecvs; ++i) post(t, &rbuf[i], sizeof rbuf[i], &rr[i]);
  const auto next_reply = [&](Reply& out, const std::function<void(const Event&)>& other = {}) {
    bool have = false;
    const bool ok = poll_until(
        t,
        [&](const Event& e) {
          for (int i = 0; i < kRecvs; ++i) {
            if (e.context == &rr[i] && !have) {
              out = rbuf[i];
              have = true;
              post(t, &rbuf[i], sizeof rbuf[i], &rr[i]);
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
    for (int i = 0; i < kRecvs; ++i) post(*t, rbuf[i], sizeof rbuf[i], &rctx[i]);
    std::vector<std::uint64_t> next(kThreads, 0);
    std::uint64_t received = 0;
    bool ok = true;
    const bool done = poll_until(
        *t,
        [&](const Event& e) {
          const auto i = static_cast<std::size_t>(ferry::detail::OpContext::of(e.context) - &rctx[0]);
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
          post(*t, rbuf[i], sizeof rbuf[i], &rctx[i]);
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
