// contract_test.cpp — the transport contract of src/net/transport.hpp, checked against one
// network backend taken from ferry's registry (so modules load as they do in a job).
//
// Checks: sane caps; injects of every interesting size arrive whole, with their length and
// source; oversized injects are refused; send's single local event; order from one sender;
// truncation reported as an error event, nothing written past the receive, and messages
// still flowing after it; put and get with the peer's key and address; put_data's remote
// event (data, length) after its bytes; inject_put's silence; an inline sink's order and lend
// limit; teardown with operations in flight. A skip names the backend's known deviation from
// the contract.
//
// Run: FERRY_TEST_BACKEND=self|shm|ofi|ucx (FERRY_TEST_PROVIDER=shm|tcp for ofi; UCX_TLS
// picks UCX's lanes) ferry-transport-tests. ctest registers one test per variant
// (transport.shm, transport.ofi_tcp, ...). Two transports in this process act as ranks 0 and
// 1 of a 2-rank job; the self backend has one transport, rank 0 of 1, talking to itself.
// Every wait is a bounded poll of both transports, so a broken backend fails, never hangs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ferry/error.hpp"
#include "net/backend.hpp"
#include "net/op_context.hpp"
#include "net/registry.hpp"
#include "net/transport.hpp"

namespace {

using namespace ferry::net;
using Clock = std::chrono::steady_clock;

constexpr double kWaitSeconds = 10;
constexpr std::size_t kArena = std::size_t{8} << 20;  // per side, registered once

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

unsigned char pattern(std::size_t i, unsigned seed) { return static_cast<unsigned char>(i * 131u + seed * 7u + (i >> 8)); }
void fill(unsigned char* p, std::size_t n, unsigned seed) {
  for (std::size_t i = 0; i < n; ++i) p[i] = pattern(i, seed);
}
// Index of the first byte that differs from the pattern, or n.
std::size_t check(const unsigned char* p, std::size_t n, unsigned seed) {
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] != pattern(i, seed)) return i;
  return n;
}

// One rank: its transport, the events its polls returned, and a registered arena that every
// buffer of a test comes from (so posts have a desc where caps().local_registration).
struct Side {
  std::unique_ptr<Transport> t;
  std::vector<Event> events;
  unsigned char* arena = nullptr;
  Registration* reg = nullptr;
  std::size_t used = 0;
};

class Contract : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_name_ = env("FERRY_TEST_BACKEND");
    if (backend_name_.empty()) backend_name_ = "shm";
    try {
      // The backends' rows as a job resolves them (defaults, or the environment's FERRY_SHM_*).
      ferry::RuntimeOptions o;
      if (!env("FERRY_TEST_PROVIDER").empty()) o.backend_options = {{"ofi_provider", env("FERRY_TEST_PROVIDER")}};
      backend_ = backend(backend_name_, "FERRY_TEST_BACKEND").open(OpenParams{ferry::resolve_options(o).settings.backends});
    } catch (const std::exception& e) {
      open_error_ = e.what();
    }
  }
  static void TearDownTestSuite() { backend_.reset(); }

  void SetUp() override {
    ASSERT_TRUE(backend_ != nullptr) << "opening backend " << backend_name_ << ": " << open_error_;
    self_ = backend_name_ == "self";
    const int size = self_ ? 1 : 2;
    for (int r = 0; r < size; ++r) {
      TransportParams p{.rank = r,
                        .size = size,
                        .device = 0,
                        .packet_size = 8192,
                        .packets = 4096,
                        .serialized = true,
                        .heartbeat = false,
                        .away = std::vector<bool>(static_cast<std::size_t>(size), false)};
      sides_[r].t = backend_->make_transport(p);
    }
    std::vector<std::string> addresses;
    for (int r = 0; r < size; ++r) addresses.push_back(sides_[r].t->address());
    for (int r = 0; r < size; ++r) sides_[r].t->connect(addresses);
    for (int r = 0; r < size; ++r) sides_[r].t->connected();
    // Self: "side 1" is the same transport as side 0, with its own arena.
    for (int s = 0; s < 2; ++s) {
      Side& d = sides_[s];
      d.arena = static_cast<unsigned char*>(std::aligned_alloc(4096, kArena));
      ASSERT_NE(d.arena, nullptr);
      std::memset(d.arena, 0, kArena);
      d.reg = tr(s).register_memory(d.arena, kArena,
                                    Access::send | Access::recv | Access::remote_read | Access::remote_write);
    }
    caps_ = &tr(0).caps();
  }

  void TearDown() override { shutdown(); }

  // Teardown in the contract's order: cancel_all, close, deregister, destroy. The two ranks
  // close at once, as two processes would: a flush-close (UCX over tcp) waits for the peer's
  // progress, which a close run after the other's would never see.
  void shutdown() {
    const int n = self_ ? 1 : 2;
    for (int r = 0; r < n; ++r)
      if (sides_[r].t) sides_[r].t->cancel_all();
    std::thread peer;
    if (n == 2 && sides_[1].t) peer = std::thread([this] { sides_[1].t->close(); });
    if (sides_[0].t) sides_[0].t->close();
    if (peer.joinable()) peer.join();
    for (int s = 0; s < 2; ++s) {
      if (!sides_[self_ ? 0 : s].t) continue;
      for (Registration* r : extra_[s]) tr(s).deregister(r);
      extra_[s].clear();
      if (sides_[s].reg != nullptr) tr(s).deregister(sides_[s].reg);
      sides_[s].reg = nullptr;
    }
    for (int r = 0; r < 2; ++r) sides_[r].t.reset();
    for (int s = 0; s < 2; ++s) {
      std::free(sides_[s].arena);
      sides_[s].arena = nullptr;
    }
  }

  Transport& tr(int s) { return *sides_[self_ ? 0 : s].t; }
  int rank(int s) const { return self_ ? 0 : s; }
  // The events a side's transport returned (both sides share one list under self).
  std::vector<Event>& events(int s) { return sides_[self_ ? 0 : s].events; }
  void* desc(int s) { return sides_[s].reg->desc(); }
  unsigned char* alloc(int s, std::size_t n) {
    Side& d = sides_[s];
    const std::size_t at = (d.used + 63) & ~std::size_t{63};
    if (at + n > kArena) throw std::runtime_error("test arena exhausted");
    d.used = at + n;
    return d.arena + at;
  }
  OpContext* ctx() { return &contexts_.emplace_back(); }

  // A lent backend (Receives::lent) takes no posted receives: the buffers a test posts wait
  // here, each poll lends at most as many messages as are waiting, and each lent message is
  // copied into the oldest buffer (-EMSGSIZE past its length) and reported with its context,
  // as a posted backend reports it.
  struct Posted {
    unsigned char* b;
    std::size_t n;
    OpContext* c;
  };
  bool lends(int s) { return tr(s).caps().receives == ferry::net::Receives::lent; }
  int post_buffer(int s, unsigned char* b, std::size_t n, OpContext* c) {
    if (!lends(s)) return post([&] { return tr(s).post_recv(b, n, desc(s), c); });
    posted_[s].push_back({b, n, c});
    return 0;
  }
  void pump() {
    Event ev[16];
    for (int r = 0; r < (self_ ? 1 : 2); ++r) {
      const bool lent = lends(r);
      if (lent) sides_[r].t->set_lend_limit(static_cast<int>(std::min<std::size_t>(posted_[r].size(), 16)));
      const int n = sides_[r].t->poll(ev, 16);
      for (int i = 0; i < n; ++i) {
        Event e = ev[i];
        if (lent && e.lent != nullptr) {
          EXPECT_EQ(e.context, nullptr) << "a lent message has no context";
          if (posted_[r].empty()) {
            ADD_FAILURE() << "lent past the limit";
            continue;
          }
          const Posted p = posted_[r].front();
          posted_[r].pop_front();
          std::memcpy(p.b, e.lent, std::min(e.length, p.n));
          e.error = e.length <= p.n ? 0 : -EMSGSIZE;
          e.length = std::min(e.length, p.n);
          e.context = p.c;
          e.lent = nullptr;
        } else if (!lent) {
          EXPECT_EQ(e.lent, nullptr) << "a posted backend lends nothing";
        }
        sides_[r].events.push_back(e);
      }
    }
  }
  bool wait(const std::function<bool()>& done, double seconds = kWaitSeconds) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    while (!done()) {
      pump();
      if (Clock::now() > deadline) return false;
    }
    return true;
  }
  // Polls a while longer, for events that must not come.
  void settle(double seconds = 0.05) {
    const auto until = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < until) pump();
  }
  // A post, retried after polling while it answers -EAGAIN (the core's answer too).
  int post(const std::function<int()>& op) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(kWaitSeconds);
    for (;;) {
      const int rc = op();
      if (rc != -EAGAIN) return rc;
      if (Clock::now() > deadline) return -ETIMEDOUT;
      pump();
    }
  }
  int count(int s, const OpContext* c) {
    return static_cast<int>(std::count_if(events(s).begin(), events(s).end(), [&](const Event& e) { return e.context == c; }));
  }
  const Event* find(int s, const OpContext* c) {
    for (const Event& e : events(s))
      if (e.context == c) return &e;
    return nullptr;
  }
  bool wait_event(int s, const OpContext* c) { return wait([&] { return find(s, c) != nullptr; }); }
  // Posts a receive of n bytes on side s; the buffer is pre-filled with 0xee (and followed by
  // `guard` more such bytes) so writes past the message show.
  unsigned char* recv(int s, std::size_t n, OpContext* c, std::size_t guard = 0) {
    unsigned char* b = alloc(s, n + guard);
    std::memset(b, 0xee, n + guard);
    EXPECT_EQ(post_buffer(s, b, n, c), 0);
    return b;
  }
  // The address a peer names in RMA to [p, ...) of side s's arena.
  std::uint64_t remote_addr(int s, const unsigned char* p) const {
    return caps_->rma_virtual_address ? reinterpret_cast<std::uintptr_t>(p)
                                      : static_cast<std::uint64_t>(p - sides_[s].arena);
  }
  std::uint64_t key(int s) const { return sides_[s].reg->key(); }

  static inline std::string backend_name_, open_error_;
  static inline std::unique_ptr<Backend> backend_;
  bool self_ = false;
  const Caps* caps_ = nullptr;
  std::deque<OpContext> contexts_;  // outlive the transports: a backend may touch them until close
  Side sides_[2];
  std::vector<Registration*> extra_[2];
  std::deque<Posted> posted_[2];
};

TEST_F(Contract, CapsAreSane) {
  EXPECT_FALSE(caps_->name.empty());
  EXPECT_GT(caps_->inject_size, 0u);
  EXPECT_GE(caps_->max_msg_size, caps_->inject_size);
  EXPECT_GT(caps_->max_rma_size, 0u);
  if (!self_) {
    EXPECT_EQ(tr(1).caps().name, caps_->name) << "both ranks' transports of one backend";
  }
}

// Sizes 1..64, then around each power of two, up to inject_size itself.
std::vector<std::size_t> inject_sizes(std::size_t limit) {
  std::vector<std::size_t> out;
  for (std::size_t n = 1; n <= std::min<std::size_t>(64, limit); ++n) out.push_back(n);
  for (std::size_t p = 128; p <= limit * 2; p *= 2)
    for (std::size_t n : {p - 1, p, p + 1})
      if (n > 64 && n <= limit) out.push_back(n);
  if (out.back() != limit) out.push_back(limit);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

TEST_F(Contract, InjectArrivesWithLengthBytesAndRank) {
  const std::size_t limit = caps_->inject_size;
  unsigned char* src = alloc(0, limit);
  unsigned seed = 0;
  for (const std::size_t n : inject_sizes(limit)) {
    ++seed;
    OpContext* c = ctx();
    unsigned char* b = recv(1, limit, c, 16);
    fill(src, n, seed);
    ASSERT_EQ(post([&] { return tr(0).inject(rank(1), src, n); }), 0) << n << " bytes";
    std::memset(src, 0, n);  // inject copied the message at once
    ASSERT_TRUE(wait_event(1, c)) << "no receive event for an inject of " << n << " bytes";
    const Event& e = *find(1, c);
    ASSERT_EQ(e.error, 0) << n << " bytes";
    ASSERT_EQ(e.length, n);
    ASSERT_FALSE(e.remote_write);
    if (caps_->reports_source) {
      ASSERT_EQ(e.rank, rank(0)) << n << " bytes";
    }
    ASSERT_EQ(check(b, n, seed), n) << "first wrong byte of an inject of " << n;
    for (std::size_t i = n; i < limit + 16; ++i) ASSERT_EQ(b[i], 0xee) << "byte " << i << " written past " << n;
  }
  EXPECT_EQ(count(0, nullptr), 0) << "inject produces no event";
}

TEST_F(Contract, InjectPastInjectSizeIsRefused) {
  const std::size_t n = caps_->inject_size + 1;
  unsigned char* src = alloc(0, n);
  fill(src, n, 3);
  // Refused means never accepted. -EAGAIN is let pass, though the core would retry it for
  // ever: it never posts past inject_size, and some backends answer so (the contract does not
  // name the errno). Backends that hand the size to their library unchecked (libfabric's shm
  // provider, UCX over tcp) may accept it once the connection is up: that gap is reported as
  // a skip, not hidden, since the core itself never posts past inject_size.
  int rc = 0;
  for (int attempt = 0; attempt < 20; ++attempt) {
    rc = tr(0).inject(rank(1), src, n);
    if (rc == 0) {
      GTEST_SKIP() << caps_->name << " accepted an inject of " << n << " bytes, past inject_size "
                   << caps_->inject_size << ": the backend does not check the size itself";
    }
    ASSERT_LT(rc, 0);
    if (rc != -EAGAIN) break;
    pump();
  }
  if (rc == -EAGAIN) std::printf("note: %s answers an oversized inject with -EAGAIN\n", caps_->name.c_str());
  // Nothing arrives for it, and the transport still works.
  OpContext* c = ctx();
  unsigned char* b = recv(1, caps_->inject_size, c);
  settle();
  EXPECT_EQ(find(1, c), nullptr) << "a refused inject delivered " << find(1, c)->length << " bytes";
  ASSERT_EQ(post([&] { return tr(0).inject(rank(1), src, 1); }), 0);
  ASSERT_TRUE(wait_event(1, c));
  EXPECT_EQ(find(1, c)->length, 1u);
  EXPECT_EQ(b[0], pattern(0, 3));
}

TEST_F(Contract, SendHasOneLocalEventAndArrives) {
  const std::size_t n = std::min<std::size_t>(caps_->max_msg_size, 8192);
  unsigned char* src = alloc(0, n);
  fill(src, n, 11);
  OpContext *s = ctx(), *r = ctx();
  unsigned char* b = recv(1, n, r);
  ASSERT_EQ(post([&] { return tr(0).send(rank(1), src, n, desc(0), s); }), 0);
  ASSERT_TRUE(wait([&] { return find(0, s) != nullptr && find(1, r) != nullptr; }))
      << "send event " << (find(0, s) != nullptr) << ", receive event " << (find(1, r) != nullptr);
  settle();
  EXPECT_EQ(count(0, s), 1) << "exactly one event per send";
  EXPECT_EQ(find(0, s)->error, 0);
  EXPECT_FALSE(find(0, s)->remote_write);
  const Event& e = *find(1, r);
  EXPECT_EQ(e.error, 0);
  EXPECT_EQ(e.length, n);
  if (caps_->reports_source) {
    EXPECT_EQ(e.rank, rank(0));
  }
  EXPECT_EQ(check(b, n, 11), n);
  EXPECT_EQ(count(1, r), 1) << "exactly one event per receive";
}

TEST_F(Contract, MessagesFromOneSenderArriveInOrder) {
  constexpr std::uint64_t kMessages = 200;
  constexpr int kPosted = 16;
  ASSERT_GE(caps_->inject_size, sizeof(std::uint64_t));
  struct Slot {
    OpContext* c;
    unsigned char* b;
  };
  std::vector<Slot> slots;
  for (int i = 0; i < kPosted; ++i) {
    slots.push_back({ctx(), nullptr});
    slots.back().b = recv(1, 64, slots.back().c);
  }
  std::uint64_t sent = 0, received = 0;
  const auto deadline = Clock::now() + std::chrono::duration<double>(kWaitSeconds);
  while (received < kMessages) {
    ASSERT_LT(Clock::now(), deadline) << "sent " << sent << ", received " << received;
    if (sent < kMessages) {
      const int rc = tr(0).inject(rank(1), &sent, sizeof sent);
      ASSERT_TRUE(rc == 0 || rc == -EAGAIN) << error_text("inject", rc);
      if (rc == 0) ++sent;
    }
    pump();
    std::vector<Event> got;
    got.swap(events(1));
    for (const Event& e : got) {
      auto slot = std::find_if(slots.begin(), slots.end(), [&](const Slot& s) { return s.c == e.context; });
      ASSERT_NE(slot, slots.end()) << "an event for no posted receive";
      ASSERT_EQ(e.error, 0);
      ASSERT_EQ(e.length, sizeof(std::uint64_t));
      std::uint64_t seq = 0;
      std::memcpy(&seq, slot->b, sizeof seq);
      ASSERT_EQ(seq, received) << "message " << seq << " arrived in place of " << received;
      ++received;
      ASSERT_EQ(post_buffer(1, slot->b, 64, slot->c), 0);
    }
  }
}

TEST_F(Contract, LongerMessageThanReceiveIsAnError) {
  if (lends(1)) GTEST_SKIP() << "a lent backend has no receive buffer to truncate into (the core checks lengths)";
  constexpr std::size_t kRoom = 16, kGuard = 48;
  const std::size_t n = std::min<std::size_t>(256, caps_->max_msg_size);
  ASSERT_GT(n, kRoom);
  unsigned char* src = alloc(0, n);
  fill(src, n, 21);
  OpContext *r = ctx(), *s = ctx();
  unsigned char* b = recv(1, kRoom, r, kGuard);
  if (n <= caps_->inject_size) {
    ASSERT_EQ(post([&] { return tr(0).inject(rank(1), src, n); }), 0);
  } else {
    ASSERT_EQ(post([&] { return tr(0).send(rank(1), src, n, desc(0), s); }), 0);
  }
  ASSERT_TRUE(wait_event(1, r)) << "no event for the receive a longer message met";
  const Event& e = *find(1, r);
  EXPECT_EQ(e.error, -EMSGSIZE) << "truncation is -EMSGSIZE; length " << e.length;
  EXPECT_LE(e.length, kRoom);
  EXPECT_EQ(check(b, std::min(e.length, kRoom), 21), std::min(e.length, kRoom));
  for (std::size_t i = kRoom; i < kRoom + kGuard; ++i) ASSERT_EQ(b[i], 0xee) << "byte " << i << " past the receive written";
}

TEST_F(Contract, MessagesFlowAfterATruncation) {
  if (lends(1)) GTEST_SKIP() << "a lent backend has no receive buffer to truncate into (the core checks lengths)";
  if (caps_->name.rfind("ofi/tcp", 0) == 0) {
    GTEST_SKIP() << "libfabric's tcp provider drops the connection on a truncated receive "
                    "(tcpx_process_recv: \"msg recv failed ret = -265\"); later messages never come";
  }
  const std::size_t n = std::min<std::size_t>(256, caps_->max_msg_size);
  unsigned char* src = alloc(0, n);
  fill(src, n, 21);
  OpContext *r = ctx(), *s = ctx();
  recv(1, 16, r);
  if (n <= caps_->inject_size) {
    ASSERT_EQ(post([&] { return tr(0).inject(rank(1), src, n); }), 0);
  } else {
    ASSERT_EQ(post([&] { return tr(0).send(rank(1), src, n, desc(0), s); }), 0);
  }
  ASSERT_TRUE(wait_event(1, r));
  ASSERT_NE(find(1, r)->error, 0);
  OpContext* r2 = ctx();
  unsigned char* b2 = recv(1, 64, r2);
  ASSERT_EQ(post([&] { return tr(0).inject(rank(1), src, 8); }), 0);
  ASSERT_TRUE(wait_event(1, r2));
  EXPECT_EQ(find(1, r2)->error, 0);
  EXPECT_EQ(find(1, r2)->length, 8u);
  EXPECT_EQ(check(b2, 8, 21), 8u);
}

// A lent backend lends no more than the limit: the rest wait for a poll with room, in order,
// and the poll's other events do not wait with them.
TEST_F(Contract, LentMessagesWaitForRoom) {
  if (!lends(1)) GTEST_SKIP() << "receives are posted on this backend";
  OpContext* c = ctx();
  unsigned char b[8];
  EXPECT_EQ(tr(1).post_recv(b, sizeof b, desc(1), c), -ENOSYS) << "a lent backend takes no posted receive";
  unsigned char* src = alloc(0, 8);
  for (std::uint64_t i = 0; i < 3; ++i) {
    std::memcpy(src, &i, 8);
    ASSERT_EQ(post([&] { return tr(0).inject(rank(1), src, 8); }), 0);
  }
  Event ev[16];
  tr(1).set_lend_limit(0);
  for (int i = 0; i < 20; ++i) {
    if (!self_) (void)tr(0).poll(ev, 16);
    const int n = tr(1).poll(ev, 16);
    for (int k = 0; k < n; ++k) ASSERT_EQ(ev[k].lent, nullptr) << "lent with a limit of 0";
  }
  std::uint64_t next = 0;
  const auto deadline = Clock::now() + std::chrono::duration<double>(kWaitSeconds);
  while (next < 3 && Clock::now() < deadline) {
    tr(1).set_lend_limit(1);
    const int n = tr(1).poll(ev, 16);
    int lent = 0;
    for (int k = 0; k < n; ++k) {
      if (ev[k].lent == nullptr) continue;
      ++lent;
      std::uint64_t v = ~0ULL;
      ASSERT_EQ(ev[k].length, 8u);
      std::memcpy(&v, ev[k].lent, 8);
      EXPECT_EQ(v, next) << "in order";
      if (caps_->reports_source) {
        EXPECT_EQ(ev[k].rank, rank(0));
      }
      ++next;
    }
    ASSERT_LE(lent, 1) << "past the limit of 1";
  }
  EXPECT_EQ(next, 3u);
}

// A transport that delivers inline hands messages to the sink only from inside its poll, and
// sink and poll events together keep the sender's order and the poll's lend limit.
struct SinkLog {
  std::vector<std::uint64_t> seq;  // every message's value, sink and poll alike, as it came
  int in_poll = 0;                 // set around tr(1).poll
  int outside = 0;                 // sink calls outside a poll
  int over = 0;                    // lent past the limit of one poll
  int lent_this_poll = 0;
  int limit = 0;
  int bad = 0;                     // not a lent 8-byte message
};
void record(SinkLog& log, const Event& e) {
  if (e.lent == nullptr || e.length != sizeof(std::uint64_t) || e.error != 0) {
    ++log.bad;
    return;
  }
  if (++log.lent_this_poll > log.limit) ++log.over;
  std::uint64_t v = 0;
  std::memcpy(&v, e.lent, sizeof v);
  log.seq.push_back(v);
}

TEST_F(Contract, InlineSinkKeepsOrderAndTheLendLimit) {
  if (!caps_->delivers_inline) GTEST_SKIP() << "this transport returns every message from its poll";
  ASSERT_TRUE(lends(1)) << "an inline sink gets lent events here";
  SinkLog log;
  tr(1).set_inline_sink(InlineSink{[](void* owner, void*, const Event& e) {
                                     auto& l = *static_cast<SinkLog*>(owner);
                                     if (l.in_poll == 0) ++l.outside;
                                     record(l, e);
                                   },
                                   &log, nullptr});
  constexpr std::uint64_t kMessages = 300;
  std::uint64_t sent = 0;
  int sink_calls_seen = 0;
  Event ev[16];
  const auto deadline = Clock::now() + std::chrono::duration<double>(kWaitSeconds);
  while (log.seq.size() < kMessages && Clock::now() < deadline) {
    for (int k = 0; k < 4 && sent < kMessages; ++k) {
      const int rc = tr(0).inject(rank(1), &sent, sizeof sent);
      ASSERT_TRUE(rc == 0 || rc == -EAGAIN) << error_text("inject", rc);
      if (rc == 0) ++sent;
    }
    if (!self_) (void)tr(0).poll(ev, 16);
    log.limit = 1 + static_cast<int>(sent % 5);  // limits of 1..5 in turn
    log.lent_this_poll = 0;
    tr(1).set_lend_limit(log.limit);
    const std::size_t before = log.seq.size();
    ++log.in_poll;
    const int n = tr(1).poll(ev, 16);
    --log.in_poll;
    sink_calls_seen += static_cast<int>(log.seq.size() - before);
    for (int k = 0; k < n; ++k) {
      if (ev[k].lent != nullptr) record(log, ev[k]);
    }
  }
  ASSERT_EQ(log.seq.size(), kMessages) << "sent " << sent;
  for (std::uint64_t i = 0; i < kMessages; ++i) ASSERT_EQ(log.seq[i], i) << "message " << log.seq[i] << " in place of " << i;
  EXPECT_EQ(log.outside, 0) << "the sink ran outside a poll";
  EXPECT_EQ(log.over, 0) << "sink and poll events lent past the poll's limit";
  EXPECT_EQ(log.bad, 0);
  EXPECT_GT(sink_calls_seen, 0) << "caps say inline, but no message reached the sink";
}

TEST_F(Contract, PutThenGetWithThePeersKey) {
  const std::size_t n = std::min<std::size_t>(caps_->max_rma_size, 64 * 1024);
  // A registration of its own on each side, as the core makes for a user's window.
  unsigned char* win[2] = {alloc(0, n), alloc(1, n)};
  Registration* reg[2];
  for (int s = 0; s < 2; ++s) {
    reg[s] = tr(s).register_memory(win[s], n, Access::remote_read | Access::remote_write | Access::send | Access::recv);
    extra_[s].push_back(reg[s]);
  }
  const std::uint64_t addr = caps_->rma_virtual_address ? reinterpret_cast<std::uintptr_t>(win[1]) : 0;
  unsigned char* src = alloc(0, n);
  fill(src, n, 31);
  OpContext* p = ctx();
  ASSERT_EQ(post([&] { return tr(0).put(rank(1), src, n, desc(0), addr, reg[1]->key(), p); }), 0);
  ASSERT_TRUE(wait_event(0, p)) << "no event for the put";
  ASSERT_EQ(find(0, p)->error, 0) << error_text("put", find(0, p)->error);
  ASSERT_TRUE(wait([&] { return check(win[1], n, 31) == n; })) << "first wrong byte " << check(win[1], n, 31);
  // The get must read what the target holds now, not what this side wrote.
  fill(win[1], n, 32);
  unsigned char* back = alloc(0, n);
  std::memset(back, 0, n);
  OpContext* g = ctx();
  ASSERT_EQ(post([&] { return tr(0).get(rank(1), back, n, desc(0), addr, reg[1]->key(), g); }), 0);
  ASSERT_TRUE(wait_event(0, g)) << "no event for the get";
  ASSERT_EQ(find(0, g)->error, 0) << error_text("get", find(0, g)->error);
  EXPECT_EQ(check(back, n, 32), n) << "the get's data, once its event came";
  settle();
  EXPECT_EQ(count(0, p), 1);
  EXPECT_EQ(count(0, g), 1);
}

TEST_F(Contract, PutDataNotifiesTheTargetAfterItsBytes) {
  if (caps_->remote_data_bytes == 0) GTEST_SKIP() << caps_->name << " delivers no remote data (remote_data_bytes 0)";
  const std::size_t n = std::min<std::size_t>(caps_->max_rma_size, 16 * 1024);
  unsigned char* dst = alloc(1, n);
  OpContext* r = ctx();
  if (caps_->remote_data_consumes_recv) recv(1, 64, r);
  unsigned char* src = alloc(0, n);
  fill(src, n, 41);
  const std::uint64_t data = 0x8877665544332211ULL;
  const std::uint64_t mask =
      caps_->remote_data_bytes >= 8 ? ~std::uint64_t{0} : (std::uint64_t{1} << (8 * caps_->remote_data_bytes)) - 1;
  OpContext* p = ctx();
  ASSERT_EQ(post([&] { return tr(0).put_data(rank(1), src, n, desc(0), data, remote_addr(1, dst), key(1), p); }), 0);
  // The bytes are checked in the same step that first sees the remote event.
  bool visible = false;
  std::size_t remote = 0;
  Event re{};
  ASSERT_TRUE(wait([&] {
    for (const Event& e : events(1)) {
      if (!e.remote_write || remote > 0) continue;
      re = e;
      remote = 1;
      visible = check(dst, n, 41) == n;
    }
    return remote > 0 && find(0, p) != nullptr;
  })) << "remote event " << remote << ", local event " << (find(0, p) != nullptr);
  EXPECT_TRUE(visible) << "the remote event came before the bytes";
  EXPECT_EQ(re.error, 0);
  EXPECT_EQ(re.data & mask, data & mask);
  if (caps_->reports_source) {
    EXPECT_EQ(re.rank, rank(0));
  }
  if (caps_->remote_data_consumes_recv) {
    EXPECT_EQ(re.context, r);
  }
  EXPECT_EQ(find(0, p)->error, 0);
  settle();
  EXPECT_EQ(count(0, p), 1);
  EXPECT_EQ(std::count_if(events(1).begin(), events(1).end(), [](const Event& e) { return e.remote_write; }), 1);
}

TEST_F(Contract, PutDataEventCarriesTheLength) {
  if (caps_->remote_data_bytes == 0) GTEST_SKIP() << caps_->name << " delivers no remote data (remote_data_bytes 0)";
  if (caps_->name.rfind("ofi/tcp", 0) == 0) {
    GTEST_SKIP() << "libfabric's tcp provider reports length 0 in a remote write's CQ entry";
  }
  const std::size_t n = 3000;
  unsigned char* dst = alloc(1, n);
  if (caps_->remote_data_consumes_recv) recv(1, 64, ctx());
  unsigned char* src = alloc(0, n);
  fill(src, n, 43);
  OpContext* p = ctx();
  ASSERT_EQ(post([&] { return tr(0).put_data(rank(1), src, n, desc(0), 7, remote_addr(1, dst), key(1), p); }), 0);
  const auto remote = [&]() -> const Event* {
    for (const Event& e : events(1))
      if (e.remote_write) return &e;
    return nullptr;
  };
  ASSERT_TRUE(wait([&] { return remote() != nullptr && find(0, p) != nullptr; }));
  EXPECT_EQ(remote()->length, n);
}

TEST_F(Contract, InjectPutLandsWithoutAnEvent) {
  const std::size_t n = std::min<std::size_t>(caps_->inject_size, 256);
  unsigned char* dst = alloc(1, n);
  unsigned char* src = alloc(0, n);
  fill(src, n, 51);
  ASSERT_EQ(post([&] { return tr(0).inject_put(rank(1), src, n, remote_addr(1, dst), key(1)); }), 0);
  std::memset(src, 0, n);
  ASSERT_TRUE(wait([&] { return check(dst, n, 51) == n; })) << "first wrong byte " << check(dst, n, 51);
  settle();
  EXPECT_TRUE(events(0).empty()) << events(0).size() << " events at the source";
  EXPECT_TRUE(events(1).empty()) << events(1).size() << " events at the target";
}

TEST_F(Contract, CloseWithOperationsInFlight) {
  // First a message each way, as in a job, whose ranks have exchanged messages by the time
  // they close: UCX destroying a worker whose wireup is still under way trips UCX's own
  // assertion (ucp_request.c, "got REQ message").
  for (int s = 0; s < 2; ++s) {
    OpContext* r = ctx();
    recv(1 - s, 64, r);
    const std::uint64_t hello = 1;
    ASSERT_EQ(post([&] { return tr(s).inject(rank(1 - s), &hello, sizeof hello); }), 0);
    ASSERT_TRUE(wait_event(1 - s, r));
  }
  const std::size_t n = std::min<std::size_t>(caps_->max_msg_size, 4096);
  for (int s = 0; s < 2; ++s)
    for (int i = 0; i < 4; ++i) recv(s, n, ctx());
  unsigned char* src = alloc(0, n);
  fill(src, n, 61);
  for (int i = 0; i < 6; ++i) {
    const int rc = tr(0).send(rank(1), src, n, desc(0), ctx());
    ASSERT_TRUE(rc == 0 || rc == -EAGAIN) << error_text("send", rc);
  }
  unsigned char* dst = alloc(1, n);
  const int rc = tr(0).put(rank(1), src, n, desc(0), remote_addr(1, dst), key(1), ctx());
  ASSERT_TRUE(rc == 0 || rc == -EAGAIN) << error_text("put", rc);
  shutdown();
}

}  // namespace
