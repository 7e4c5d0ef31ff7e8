// Connect on first use (FERRY_CONNECT): a rank connects the peers on other hosts it sends to,
// and only those, reading one address for each; a rank that only heard from a peer connects
// back when it answers; threads racing to a peer not yet connected all get through, over one
// endpoint; an RMA read may be the first operation to a peer. Counted with Runtime::footprint.
//
// Its own job, so that nothing has talked before the counts start (ferry's barrier talks to
// log2(N) peers, so the tests synchronise through the bootstrap instead): 8 ranks, 2 per "host"
// (split_hosts.sh), ferry's shm within a host and the network backend between. Under
// FERRY_CONNECT=eager the same traffic leaves every count where start-up put it.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "mp_common.hpp"

namespace mp {
namespace {
std::unique_ptr<ferry::Runtime> g_runtime;
}
ferry::Runtime& rt() { return *g_runtime; }
}  // namespace mp

using namespace mp;

namespace {

ferry::Footprint g_start;               // right after start-up, before any traffic
std::vector<std::string> g_hosts;       // by rank: FERRY_HOST (split_hosts.sh)
std::set<int> g_talked;                 // ranks on other hosts this rank has posted to so far
std::vector<std::unique_ptr<ferry::CompletionQueue>> g_inbox;  // targets 21.. (exposed at start)
std::vector<ferry::Exposure> g_exposed;
constexpr std::uint16_t kFirstTarget = 21;

bool lazy() { return rt().options().settings.connect == ferry::ConnectMode::lazy; }
bool away(int r) { return g_hosts[static_cast<std::size_t>(r)] != g_hosts[static_cast<std::size_t>(rt().rank())]; }
int peer(int offset) { return (rt().rank() + offset) % rt().size(); }

std::size_t ranks_on_my_host() {
  std::size_t n = 0;
  for (int r = 0; r < rt().size(); ++r) n += away(r) ? 0 : 1;
  return n;
}

// What the footprint must say once this rank has posted to g_talked.
void expect_connected_as_talked(const char* when) {
  const ferry::Footprint now = rt().footprint();
  const std::size_t locals = ranks_on_my_host() - 1;
  const std::size_t devices = now.devices.size();
  for (std::size_t d = 0; d < devices; ++d) {
    const std::size_t expected = lazy() ? locals + (d == 0 ? g_talked.size() : 0) : static_cast<std::size_t>(rt().size() - 1);
    EXPECT_EQ(now.devices[d].peers_connected, expected) << when << ", device " << d;
  }
  const std::size_t talked = lazy() ? g_talked.size() : 0;
  EXPECT_EQ(now.address_reads, g_start.address_reads + talked) << when << ": one address read per peer connected";
  EXPECT_EQ(now.bootstrap_reads, g_start.bootstrap_reads + talked) << when;
}

void post_am(int to, std::uint16_t target, std::uint32_t tag) {
  ferry::Device& dev = rt().device();
  unsigned char msg[64];
  fill(msg, sizeof msg, rt().rank());
  const ferry::Status s = post_retry(dev, [&] {
    return dev.post_am({.rank = to, .buffer = msg, .size = sizeof msg, .target = {target}, .tag = tag});
  });
  ASSERT_FALSE(s.is_failed()) << "rank " << s.rank << " failed";
  if (away(to)) g_talked.insert(to);
}

// Waits for `n` messages on target `target`; returns their senders.
std::vector<int> receive(std::uint16_t target, std::size_t n) {
  std::vector<int> from;
  ferry::CompletionQueue& q = *g_inbox[target - kFirstTarget];
  const bool ok = wait_until(rt().device(), [&] {
    while (auto c = q.pop()) {
      EXPECT_EQ(first_mismatch(c->buffer.data(), c->buffer.size(), c->rank, 64), -1) << "from rank " << c->rank;
      from.push_back(c->rank);
    }
    return from.size() >= n;
  });
  EXPECT_TRUE(ok) << "timed out with " << from.size() << " of " << n << " messages on target " << target;
  return from;
}

}  // namespace

TEST(Connect, AtStartUpOnlyThePeersOfThisHostAreConnected) {
  const std::size_t on_host = ranks_on_my_host();
  ASSERT_LT(on_host, static_cast<std::size_t>(rt().size())) << "the job must span hosts (split_hosts.sh)";
  for (const ferry::DeviceFootprint& d : g_start.devices) {
    EXPECT_EQ(d.peers_connected, lazy() ? on_host - 1 : static_cast<std::size_t>(rt().size() - 1));
  }
  // Each device read the addresses of this host's ranks (itself included: its route to itself),
  // or, connecting eagerly, of every rank; and the keepalive its ring links'.
  const std::size_t per_device = lazy() ? on_host : static_cast<std::size_t>(rt().size());
  EXPECT_EQ(g_start.address_reads, per_device * g_start.devices.size() + g_start.keepalive_links);
  EXPECT_LE(g_start.address_reads, g_start.bootstrap_reads);
}

TEST(Connect, ARankThatSendsToKPeersMakesKEndpointsAndReadsKAddresses) {
  const std::vector<int> offsets{2, 3};
  for (int o : offsets) post_am(peer(o), kFirstTarget, static_cast<std::uint32_t>(o));
  const std::vector<int> from = receive(kFirstTarget, offsets.size());  // each rank sends to the same offsets
  ASSERT_EQ(from.size(), offsets.size());
  // Hearing from a peer connects nothing: only what this rank sent to counts.
  expect_connected_as_talked("after sending to 2 peers and hearing from 2");
}

TEST(Connect, ARankThatOnlyHeardFromAPeerConnectsBackToAnswerIt) {
  // The previous test's senders: the ranks 2 and 3 before this one.
  for (int o : {2, 3}) post_am(peer(rt().size() - o), kFirstTarget + 1, 0);
  const std::vector<int> from = receive(kFirstTarget + 1, 2);
  std::set<int> got(from.begin(), from.end());
  EXPECT_EQ(got, (std::set<int>{peer(2), peer(3)})) << "each answer comes from the rank first sent to";
  expect_connected_as_talked("after answering");
}

TEST(Connect, ThreadsRacingToAPeerNotYetConnectedGetThroughOverOneEndpoint) {
  MP_SKIP_IF_THREADS_SHARE_A_DEVICE();
  constexpr int kThreads = 4, kEach = 50;
  const int to = peer(4);
  ASSERT_EQ(g_talked.count(to), 0u);
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      ferry::Device& dev = rt().device();
      unsigned char msg[64];
      fill(msg, sizeof msg, rt().rank());
      for (int i = 0; i < kEach; ++i) {
        const ferry::Status s = post_retry(dev, [&] {
          return dev.post_am({.rank = to, .buffer = msg, .size = sizeof msg, .target = {kFirstTarget + 2}});
        });
        if (s.is_failed()) failed.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  if (away(to)) g_talked.insert(to);
  EXPECT_EQ(receive(kFirstTarget + 2, kThreads * kEach).size(), static_cast<std::size_t>(kThreads * kEach));
  expect_connected_as_talked("after 4 threads raced to one new peer");
}

TEST(Connect, AnRmaReadCanBeTheFirstOperationToAPeer) {
  ferry::Device& dev = rt().device();
  std::vector<unsigned char> mine(4096);
  fill(mine, rt().rank());
  ferry::MemoryRegion mr = dev.register_memory(mine.data(), mine.size());
  const std::vector<ferry::RemoteKey> keys = allgather<ferry::RemoteKey>("test.connect.key", mr.remote_key());
  int to = -1;
  for (int o = 1; o < rt().size() && to < 0; ++o) {
    if (away(peer(o)) && g_talked.count(peer(o)) == 0) to = peer(o);
  }
  ASSERT_GE(to, 0) << "no peer on another host left unconnected";
  std::vector<unsigned char> in(mine.size(), 0);
  ferry::Synchronizer sync(1);
  const ferry::Status s = post_retry(dev, [&] {
    return dev.post_get({.rank = to, .buffer = in.data(), .size = in.size(), .remote = keys[static_cast<std::size_t>(to)],
                         .local = &sync});
  });
  ASSERT_FALSE(s.is_failed());
  g_talked.insert(to);
  if (s.is_posted()) {
    ASSERT_TRUE(wait_until(dev, [&] { return sync.test(); }));
    EXPECT_TRUE(sync.results()[0].ok()) << sync.results()[0].error_string();
  }
  EXPECT_EQ(first_mismatch(in.data(), in.size(), to, in.size()), -1);
  expect_connected_as_talked("after a read from a new peer");
  rt().barrier();  // the others' reads of this rank's memory need its progress
}

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  g_runtime = std::make_unique<ferry::Runtime>();
  g_start = rt().footprint();
  for (std::uint16_t t = 0; t < 3; ++t) {
    g_inbox.push_back(std::make_unique<ferry::CompletionQueue>());
    g_exposed.push_back(rt().expose(*g_inbox.back(), static_cast<std::uint16_t>(kFirstTarget + t)));
  }
  const std::string host = rt().options().settings.host;
  rt().kv_put("test.connect.host", host);
  rt().kv_fence();
  for (int r = 0; r < rt().size(); ++r) g_hosts.push_back(rt().kv_get(r, "test.connect.host"));
  if (rt().rank() == 0) {
    std::printf("ferry connect test: %d ranks, transport %s, FERRY_CONNECT=%s\n", rt().size(), rt().transport().c_str(),
                rt().options().value("connect").c_str());
  }
  const int rc = RUN_ALL_TESTS();
  g_exposed.clear();
  rt().finalize();
  g_runtime.reset();
  return rc;
}
