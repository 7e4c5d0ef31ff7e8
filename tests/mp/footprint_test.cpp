// Runtime::footprint on every transport: what the devices made, the peers they connected, the
// bootstrap reads start-up made and the keepalive's links, checked against the job's shape.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "core/job_plan.hpp"
#include "mp_common.hpp"

using namespace mp;

namespace {

// FI_OFI_RXM_MSG_RX_SIZE and FI_OFI_RXM_BUFFER_SIZE as the process began, before the runtime
// (made in main) set them.
std::string env_text(const char* name) {
  const char* v = std::getenv(name);
  return std::string(v != nullptr ? v : "");
}
const std::string kRxmRxAtStart = env_text("FI_OFI_RXM_MSG_RX_SIZE");
const std::string kRxmBufferAtStart = env_text("FI_OFI_RXM_BUFFER_SIZE");

// The host this rank counts as on: FERRY_HOST, or the machine's name (as start-up decides).
std::string my_host() {
  const std::string& set = rt().options().settings.host;
  return set.empty() ? ferry::detail::hostname() : set;
}

bool job_spans_hosts() {
  const std::string mine = my_host();
  rt().kv_put("test.footprint.host", mine);
  rt().kv_fence();
  bool spans = false;
  for (int r = 0; r < rt().size(); ++r) spans = spans || rt().kv_get(r, "test.footprint.host") != mine;
  return spans;
}

void expect_consistent(const ferry::DeviceFootprint& d, const char* when) {
  EXPECT_LE(d.packets_made, d.packets_max) << when;
  EXPECT_EQ(d.packet_bytes == 0, d.packets_made == 0) << when;
  EXPECT_EQ(d.descriptor_bytes == 0, d.descriptors_made == 0) << when;
}

}  // namespace

TEST(Footprint, CountsTheConnectedPeersAndTheBootstrapReads) {
  const ferry::Footprint f = rt().footprint();
  const std::size_t peers = static_cast<std::size_t>(rt().size() - 1);
  const bool eager = rt().options().settings.connect == ferry::ConnectMode::eager;
  ASSERT_EQ(f.devices.size(), static_cast<std::size_t>(rt().options().settings.devices));
  for (const ferry::DeviceFootprint& d : f.devices) {
    expect_consistent(d, "at start");
    // Connecting on first use, the peers the suite talked to so far (connect_test.cpp counts them).
    if (eager) {
      EXPECT_EQ(d.peers_connected, peers) << "every peer has an endpoint after start-up";
    } else {
      EXPECT_LE(d.peers_connected, peers);
    }
    EXPECT_EQ(d.packets_max, static_cast<std::size_t>(rt().options().settings.packets));
  }
  // Each peer's record for the host map, and (eagerly) each device's endpoint of every peer.
  EXPECT_GE(f.bootstrap_reads, peers + (eager ? peers * f.devices.size() : 0));
  EXPECT_LE(f.address_reads, f.bootstrap_reads);
  const bool keepalive = job_spans_hosts() && rt().options().settings.peer_timeout_ms != 0;
  if (keepalive) {
    EXPECT_GT(f.keepalive_links, 0u) << "the job spans hosts: the ring links this rank";
    EXPECT_LE(f.keepalive_links, peers);
  } else {
    EXPECT_EQ(f.keepalive_links, 0u) << "one host (or no keepalive): no heartbeat links";
  }
  rt().barrier();
}

// Messages the application holds keep their packets: a device holding more than it made at
// start must have made more, and never more than FERRY_PACKETS.
TEST(Footprint, PacketsAreMadeAsTrafficNeedsThemAndNeverBeyondTheLimit) {
  ferry::Device& dev = rt().device();
  ferry::CompletionQueue inbox;
  ferry::Exposure ex = rt().expose(inbox, 11);
  rt().barrier();
  const std::size_t before = dev.footprint().packets_made;
  // Held at once, the same on every rank (each receives what its left neighbour sends): more
  // than any rank made before, a quarter of the limit at most (the 16-packet runs must keep
  // packets to send and receive with).
  const std::vector<std::size_t> made = allgather("test.footprint.made", before);
  const std::size_t most = *std::max_element(made.begin(), made.end());
  const std::size_t held_max = std::min<std::size_t>(most + 64, dev.footprint().packets_max / 4);
  std::vector<unsigned char> out(2000);
  fill(out, rt().rank());
  std::vector<ferry::Completion> held;
  const auto take = [&] {
    while (auto c = inbox.pop()) held.push_back(std::move(*c));
  };
  for (std::size_t i = 0; i < held_max; ++i) {
    const ferry::Status s = post_retry(dev, [&] {
      return dev.post_am({.rank = right(), .buffer = out.data(), .size = out.size(), .target = {11},
                          .tag = static_cast<ferry::Tag>(i)});
    });
    ASSERT_FALSE(s.is_failed()) << "peer " << s.rank << " failed";
    take();
  }
  ASSERT_TRUE(wait_until(dev, [&] {
    take();
    return held.size() == held_max;
  }));
  const ferry::DeviceFootprint d = dev.footprint();
  expect_consistent(d, "holding messages");
  EXPECT_GE(d.packets_made, held_max) << "each message held keeps a packet";
  EXPECT_GE(d.packets_made, before) << "packets once made stay made";
  EXPECT_EQ(d.packet_bytes % d.packets_made, 0u);
  EXPECT_GT(d.packet_bytes / d.packets_made, rt().options().settings.packet_size) << "a packet's header and payload";
  EXPECT_EQ(first_mismatch(held.back().buffer.data(), out.size(), left(), out.size()), -1);
  held.clear();
  rt().barrier();
}

namespace {

// This process's anonymous resident memory (RssAnon), in bytes.
std::size_t rss_anon_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::stoull(line.substr(8)) * 1024;
  }
  return 0;
}

// Holds `count` messages of `size` bytes from the left neighbour at once, checks each, and
// lets them go (their packets back to the pool). Returns once this rank's own messages are
// complete too: a large one is read from `out` by its receiver after the post returns.
void hold_and_release(ferry::Device& dev, ferry::CompletionQueue& inbox, std::size_t count, std::size_t size,
                      ferry::Tag first_tag) {
  std::vector<unsigned char> out(size);
  fill(out, rt().rank());
  std::vector<ferry::Completion> held;
  ferry::CompletionQueue sent;
  std::size_t sends_open = 0;
  const auto take = [&] {
    while (auto c = inbox.pop()) held.push_back(std::move(*c));
    while (auto c = sent.pop()) {
      EXPECT_EQ(c->error, 0) << "a send failed";
      --sends_open;
    }
  };
  for (std::size_t i = 0; i < count; ++i) {
    const ferry::Status s = post_retry(dev, [&] {
      return dev.post_am({.rank = right(), .buffer = out.data(), .size = out.size(), .target = {12},
                          .tag = first_tag + static_cast<ferry::Tag>(i), .local = &sent});
    });
    ASSERT_FALSE(s.is_failed()) << "peer " << s.rank << " failed";
    if (s.is_posted()) ++sends_open;
    take();
  }
  ASSERT_TRUE(wait_until(dev, [&] {
    take();
    return held.size() == count && sends_open == 0;
  }));
  for (const ferry::Completion& c : held) {
    ASSERT_EQ(c.buffer.size(), size);
    ASSERT_EQ(first_mismatch(c.buffer.data(), size, left(), size), -1) << "tag " << c.tag;
  }
}

// Nearly a packet's payload (a wire header and room to spare): each such message is held in a
// packet of its own, every page wholly inside the payload written.
std::size_t packet_filling_size(ferry::Device& dev) {
  return std::min<std::size_t>(dev.eager_limit(), rt().options().settings.packet_size - 256);
}
// Messages held at once to make the pool grow well past its first batch.
std::size_t packets_to_hold(ferry::Device& dev) { return std::min<std::size_t>(512, dev.footprint().packets_max / 4); }
// Whether this job's transports pin registered memory, so that no packet's pages are given back.
bool registrations_pin() {
  const std::string t = rt().transport();
  return t.find("ucx") != std::string::npos ||
         (t.find("ofi") != std::string::npos && t.find("tcp") == std::string::npos && t.find("ofi/shm") == std::string::npos);
}

}  // namespace

// A device at rest gives its free packets' payload pages back (Device::trim_memory), unless a
// transport of it pins registrations; the packets then carry whole messages intact again.
TEST(Footprint, TrimmedPacketsGiveTheirPagesBackAndCarryMessagesAgain) {
  ferry::Device& dev = rt().device();
  ferry::CompletionQueue inbox;
  ferry::Exposure ex = rt().expose(inbox, 12);
  rt().barrier();
  const std::size_t size = packet_filling_size(dev);
  const std::size_t count = packets_to_hold(dev);
  hold_and_release(dev, inbox, count, size, 0);
  rt().barrier();  // every rank's packets are back: nothing of this test is in flight
  const std::size_t rss_before = rss_anon_bytes();
  const std::size_t given = dev.trim_memory();
  const std::size_t rss_after = rss_anon_bytes();
  const bool pins = registrations_pin();
  if (pins) {
    EXPECT_EQ(given, 0u) << rt().transport() << " pins its registrations: nothing is given back";
  } else {
    EXPECT_EQ(given % 4096, 0u);
    // At least a page of each packet in the shared free list (a thread's cache keeps up to 1/32
    // of the pool, 128 packets at most), and those pages were resident: the messages wrote them.
    const std::size_t listed = count - std::min<std::size_t>(count / 2, 128);
    EXPECT_GE(given, listed * 4096) << "made " << dev.footprint().packets_made;
    EXPECT_GE(rss_before, rss_after + listed * 4096 / 2)
        << "RssAnon " << rss_before << " -> " << rss_after << " after giving back " << given << " bytes";
  }
  rt().barrier();  // no rank sends again while another measures (a progress thread would take packets)
  // The same packets carry messages again: their pages fault back in (as zeros) and are filled.
  hold_and_release(dev, inbox, count, size, 100000);
  rt().barrier();
}

// Large messages arrive in blocks the process keeps for reuse (FERRY_RECV_CACHE); the
// runtime's trim_memory frees them, and they are made anew for the next large messages.
TEST(Footprint, TheRuntimeFreesItsCacheOfLargeReceiveBuffersWhenAsked) {
  if (rt().options().settings.recv_cache < (std::size_t{8} << 20)) GTEST_SKIP() << "FERRY_RECV_CACHE below 8 MiB";
  ferry::Device& dev = rt().device();
  ferry::CompletionQueue inbox;
  ferry::Exposure ex = rt().expose(inbox, 12);
  rt().barrier();
  constexpr std::size_t kLarge = std::size_t{1} << 20;
  hold_and_release(dev, inbox, 4, kLarge, 400000);
  rt().barrier();
  const std::size_t cached = rt().footprint().recv_cache_bytes;
  EXPECT_GE(cached, kLarge) << "the four 1 MiB messages' blocks are kept for reuse";
  EXPECT_GE(rt().trim_memory(), cached);
  EXPECT_EQ(rt().footprint().recv_cache_bytes, 0u);
  rt().barrier();  // no rank sends again while another measures (a progress thread would take blocks)
  hold_and_release(dev, inbox, 4, kLarge, 400100);
  rt().barrier();
}

// FERRY_TRIM_IDLE_MS: a device whose free list stays untouched that long gives the pages back
// by itself, seen from progress, once (until traffic touches the list again). Run where the
// suite sets a short time (mp_*_trim_idle); skipped under the 10 s default.
TEST(Footprint, ADeviceAtRestGivesItsFreePacketsPagesBackByItself) {
  const int idle_ms = rt().options().settings.trim_idle_ms;
  if (idle_ms == 0 || idle_ms > 2000) GTEST_SKIP() << "FERRY_TRIM_IDLE_MS=" << idle_ms << ": not a short rest";
  ferry::Device& dev = rt().device();
  ferry::CompletionQueue inbox;
  ferry::Exposure ex = rt().expose(inbox, 12);
  rt().barrier();
  const std::size_t size = packet_filling_size(dev);
  const std::size_t count = packets_to_hold(dev);
  hold_and_release(dev, inbox, count, size, 200000);
  hold_and_release(dev, inbox, 2, std::size_t{1} << 20, 250000);  // large buffers for the cache
  rt().barrier();
  const bool cache_kept = rt().footprint().recv_cache_bytes != 0;
  const ferry::DeviceFootprint before = dev.footprint();
  const auto rest = std::chrono::milliseconds(3 * idle_ms + 2000);
  const auto until = std::chrono::steady_clock::now() + rest;
  const auto resting = [&] {
    return dev.footprint().trims == before.trims || (cache_kept && rt().footprint().recv_cache_bytes != 0);
  };
  while (std::chrono::steady_clock::now() < until && resting()) dev.progress();
  const ferry::DeviceFootprint rested = dev.footprint();
  // The cache of large receive buffers rested as long: freed, over every transport.
  if (cache_kept) {
    EXPECT_EQ(rt().footprint().recv_cache_bytes, 0u) << "the cache of large receive buffers was kept";
  }
  const bool pins = registrations_pin();
  if (pins) {
    EXPECT_EQ(rested.trims, before.trims) << rt().transport() << " pins its registrations";
  } else {
    ASSERT_EQ(rested.trims, before.trims + 1) << "no trim within " << rest.count() << " ms of rest";
    const std::size_t listed = count - std::min<std::size_t>(count / 2, 128);
    EXPECT_GE(rested.trimmed_bytes - before.trimmed_bytes, listed * 4096);
    // At rest it stays trimmed: the trim's own take and return do not count as traffic.
    const auto more = std::chrono::steady_clock::now() + std::chrono::milliseconds(2 * idle_ms);
    while (std::chrono::steady_clock::now() < more) dev.progress();
    EXPECT_EQ(dev.footprint().trims, rested.trims) << "trimmed again with no traffic in between";
  }
  rt().barrier();  // every rank's rest is over before any sends again
  hold_and_release(dev, inbox, count, size, 300000);
  rt().barrier();
}

// FERRY_OFI_RXM_RX reaches ofi_rxm as FI_OFI_RXM_MSG_RX_SIZE, unless the user set that first.
TEST(Footprint, TheOfiBackendSizesRxmsReceiveBuffersUnlessTheEnvironmentDoes) {
  if (rt().transport().find("ofi") == std::string::npos) GTEST_SKIP() << "no ofi backend in this job";
  const char* env = std::getenv("FI_OFI_RXM_MSG_RX_SIZE");
  const std::string now = env != nullptr ? env : "";
  const std::string option = rt().options().value("ofi_rxm_rx");
  if (!kRxmRxAtStart.empty()) {
    EXPECT_EQ(now, kRxmRxAtStart) << "the environment's own value stands";
  } else {
    EXPECT_EQ(now, option == "0" ? "" : option) << "FERRY_OFI_RXM_RX=" << option;
  }
  // The buffer: FERRY_OFI_RXM_BUFFER, or a packet and 128 bytes (below libfabric's 16 KiB).
  const std::string buffer = env_text("FI_OFI_RXM_BUFFER_SIZE");
  const std::string set = rt().options().value("ofi_rxm_buffer");
  const std::size_t packet = rt().options().settings.packet_size;
  const std::string automatic = packet + 128 < 16384 ? std::to_string(packet + 128) : "";
  if (!kRxmBufferAtStart.empty()) {
    EXPECT_EQ(buffer, kRxmBufferAtStart) << "the environment's own value stands";
  } else {
    EXPECT_EQ(buffer, set == "0" ? automatic : set) << "FERRY_OFI_RXM_BUFFER=" << set;
  }
  rt().barrier();
}
