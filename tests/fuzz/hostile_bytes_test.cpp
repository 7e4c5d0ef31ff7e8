// Bytes no ferry peer would send, into a real device's receive path (DeviceHarness): each is
// dropped and counted, never followed, and good messages around it still arrive intact.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "core/wire.hpp"
#include "device_harness.hpp"

namespace {

using namespace ferry;
using namespace ferry::detail;
using Frame = std::vector<unsigned char>;

template <class... Parts>
Frame frame(const WireHeader& h, const Parts&... parts) {
  Frame f(sizeof h);
  std::memcpy(f.data(), &h, sizeof h);
  auto append = [&f](const auto& part) {
    if constexpr (std::is_same_v<std::decay_t<decltype(part)>, Frame>) {
      f.insert(f.end(), part.begin(), part.end());
    } else {
      const auto* b = reinterpret_cast<const unsigned char*>(&part);
      f.insert(f.end(), b, b + sizeof part);
    }
  };
  (append(parts), ...);
  return f;
}

Frame good_am(std::uint32_t tag, unsigned char fill) {
  return frame(WireHeader{MsgKind::am, 0, 0, 0, tag, 0}, Frame(8, fill));
}

Frame fragment(std::uint32_t id, std::uint32_t offset, std::uint32_t total, std::size_t n, unsigned char fill) {
  return frame(WireHeader{MsgKind::frag, static_cast<std::uint8_t>(MsgKind::am), 0, 0, 7, id}, FragBody{offset, total},
               Frame(n, fill));
}

// Checks that exactly the good active message (tag 1, eight bytes of 0x5A) reached the target.
void expect_only_the_good_message(const fuzz::ScriptResult& r) {
  ASSERT_EQ(r.delivered.size(), 1u);
  EXPECT_EQ(r.delivered[0].op, OpKind::remote_am);
  EXPECT_EQ(r.delivered[0].tag, 1u);
  EXPECT_EQ(r.delivered[0].bytes, Frame(8, 0x5A));
}

TEST(HostileBytes, AFinNamingNoPendingSendIsCountedNotFollowed) {
  const auto r = fuzz::DeviceHarness::get().run(
      {frame(WireHeader{MsgKind::fin, 0, 0, 0, 0, 0}, FinBody{0xDEADBEEF12345678ull}), good_am(1, 0x5A)});
  EXPECT_EQ(r.malformed, 1u);
  expect_only_the_good_message(r);
}

TEST(HostileBytes, ALaterFragmentThatDisagreesWithItsMessageIsDropped) {
  // The first piece sizes the message at 3000 bytes (past a 2 KiB packet: a heap block); a
  // later one claims 16000, within the fragment limit, and an offset past the first's buffer.
  // Unchecked, its bytes went past the reassembly buffer.
  const auto r = fuzz::DeviceHarness::get().run(
      {fragment(9, 0, 3000, 1000, 1), fragment(9, 10000, 16000, 1000, 2), good_am(1, 0x5A)});
  EXPECT_EQ(r.malformed, 1u);
  expect_only_the_good_message(r);  // the 3000-byte message stays incomplete
}

TEST(HostileBytes, AFragmentCarryingMoreThanItsMessageHasLeftIsDropped) {
  // 2000 of 3000 bytes have come; a piece of 2000 more overlaps them and is dropped; the last
  // 1000 complete the message, which is delivered once.
  const auto r = fuzz::DeviceHarness::get().run({fragment(4, 0, 3000, 2000, 1), fragment(4, 1000, 3000, 2000, 2),
                                                 fragment(4, 2000, 3000, 1000, 3), good_am(1, 0x5A)});
  EXPECT_EQ(r.malformed, 1u);
  ASSERT_EQ(r.delivered.size(), 2u);
  EXPECT_EQ(r.delivered[0].size, 3000u);
  EXPECT_EQ(r.delivered[0].bytes[0], 1);
  EXPECT_EQ(r.delivered[0].bytes[2999], 3);
  EXPECT_EQ(r.delivered[1].bytes, Frame(8, 0x5A));
}

TEST(HostileBytes, AnIovecRequestWhosePartTableRunsPastItsPacketIsDropped) {
  // 16 eager bytes and a claim of 1000 parts, with room for none.
  const auto r = fuzz::DeviceHarness::get().run(
      {frame(WireHeader{MsgKind::rts_iovec, 0, 0, 0, 3, 1000}, RtsBody{16, 0, 0, 1}, Frame(16, 9)),
       // An eager part larger than what arrived.
       frame(WireHeader{MsgKind::rts_iovec, 0, 0, 0, 3, 0}, RtsBody{1u << 20, 0, 0, 1}, Frame(16, 9)),
       good_am(1, 0x5A)});
  EXPECT_EQ(r.malformed, 2u);
  expect_only_the_good_message(r);
}

TEST(HostileBytes, ControlPacketsShorterThanTheirBodyAreDropped) {
  const auto r = fuzz::DeviceHarness::get().run({frame(WireHeader{MsgKind::rts_am, 0, 0, 0, 3, 0}, Frame(8, 0)),
                                                 frame(WireHeader{MsgKind::fin, 0, 0, 0, 0, 0}, Frame(4, 0)),
                                                 good_am(1, 0x5A)});
  EXPECT_EQ(r.malformed, 2u);
  expect_only_the_good_message(r);
}

TEST(HostileBytes, ASenderNameOutsideTheJobOrAnUnknownKindIsDropped) {
  Frame bad_kind = good_am(1, 0);
  bad_kind[0] = 0x77;
  const auto r = fuzz::DeviceHarness::get().run(
      {frame(WireHeader{MsgKind::am, 0, 0, 5, 1, 0}, Frame(8, 0)), bad_kind, Frame(3, 0), good_am(1, 0x5A)});
  EXPECT_EQ(r.malformed, 3u);
  expect_only_the_good_message(r);
}

TEST(HostileBytes, AMessageForATargetPastTheLimitIsDroppedNotParkedForever) {
  // FERRY_MAX_TARGETS=4 in the harness: target 9 can never be exposed.
  const auto r = fuzz::DeviceHarness::get().run(
      {frame(WireHeader{MsgKind::am, 0, 9, 0, 2, 0}, Frame(8, 1)), good_am(1, 0x5A)});
  expect_only_the_good_message(r);
}

TEST(HostileBytes, ARendezvousLargerThanMemoryCompletesWithAnError) {
  // 2^60 bytes: the receive block cannot be had; the target is told, and nothing hangs.
  const auto r = fuzz::DeviceHarness::get().run(
      {frame(WireHeader{MsgKind::rts_am, 0, 2, 0, 6, 0}, RtsBody{std::uint64_t{1} << 60, 0x10000, 0, 1}),
       good_am(1, 0x5A)});
  EXPECT_EQ(r.malformed, 0u);
  EXPECT_TRUE(r.settled);
  ASSERT_EQ(r.delivered.size(), 2u);
  const auto& big = r.delivered[0].tag == 6 ? r.delivered[0] : r.delivered[1];
  EXPECT_EQ(big.error, -ENOMEM);
}

TEST(HostileBytes, WellFormedTrafficOfEveryKindArrives) {
  // A tagged message for the posted receives, a fragmented active message, a rendezvous
  // active message (the scripted transport's read completes at once).
  std::vector<Frame> frames{frame(WireHeader{MsgKind::msg, 0, 0, 0, 5, 0}, Frame(8, 3))};
  for (std::uint32_t off = 0; off < 3000; off += 1000) frames.push_back(fragment(2, off, 3000, 1000, 4));
  frames.push_back(frame(WireHeader{MsgKind::rts_am, 0, 1, 0, 6, 0}, RtsBody{100000, 0x10000, 0, 1}));
  const auto r = fuzz::DeviceHarness::get().run(std::move(frames));
  EXPECT_EQ(r.malformed, 0u);
  std::size_t am = 0, received = 0;
  for (const auto& d : r.delivered) {
    if (d.op == OpKind::remote_am) {
      ++am;
      EXPECT_TRUE(d.size == 3000 || d.size == 100000) << d.size;
    } else {
      ++received;
      EXPECT_EQ(d.size, 8u);
      EXPECT_EQ(d.tag, 5u);
    }
  }
  EXPECT_EQ(am, 2u);
  EXPECT_EQ(received, 1u);
  EXPECT_TRUE(r.settled);
}

// A put notification's rank (in its data, when the transport names none) and target come
// from the wire: one naming a rank outside the job or a target past FERRY_MAX_TARGETS is
// dropped and counted; a good one still reaches its target with its tag and size.
TEST(HostileBytes, APutNotificationNamingNoRankOrTargetIsDropped) {
  const auto notice = [](std::uint64_t data, std::size_t length, int rank) {
    net::Event e;
    e.remote_write = true;
    e.data = data;
    e.length = length;
    e.rank = rank;
    return e;
  };
  const std::uint64_t target1_tag7 = (std::uint64_t{1} << 16) | 7;
  const auto r = fuzz::DeviceHarness::get().run({good_am(1, 0x5A)}, true,
                                                {notice((std::uint64_t{5} << 32) | target1_tag7, 64, -1),  // rank 5 of 1
                                                 notice(target1_tag7, 64, 3),                            // rank 3 of 1
                                                 notice((std::uint64_t{60000} << 16) | 7, 64, 0),         // target 60000
                                                 notice(target1_tag7, 48, -1)});                         // rank 0: good
  EXPECT_EQ(r.malformed, 3u);
  std::size_t puts = 0;
  for (const auto& d : r.delivered) {
    if (d.op != OpKind::remote_put) continue;
    ++puts;
    EXPECT_EQ(d.rank, 0);
    EXPECT_EQ(d.tag, 7u);
    EXPECT_EQ(d.size, 48u);
  }
  EXPECT_EQ(puts, 1u);
}

// Not wire bytes, but the same device: a put that asks for a notification on a transport that
// cannot carry its 4 bytes of remote data is refused, naming the transport (every transport
// built here carries 8).
TEST(DeviceChecks, APutWithNotificationNeedsFourBytesOfRemoteData) {
  detail::RuntimeImpl& rt = fuzz::DeviceHarness::get().runtime();
  auto script = std::make_unique<fuzz::ScriptedTransport>(std::vector<Frame>{});
  script->set_remote_data_bytes(2);
  std::vector<std::unique_ptr<net::Transport>> transports;
  transports.push_back(std::move(script));
  detail::DeviceImpl dev(rt.device_parts(), 0, rt.config(), std::move(transports), std::vector<int>{0});
  dev.start();
  std::vector<unsigned char> region(64);
  std::string what = "no error";
  {
    MemoryRegion mr = dev.register_memory(region.data(), region.size());
    try {
      (void)dev.post_put(
          PutArgs{.rank = 0, .buffer = region.data(), .size = 8, .remote = mr.remote_key(), .notify = true});
    } catch (const Error& e) {
      what = e.what();
    }
    // Without a notification the same put is accepted.
    EXPECT_FALSE(dev.post_put(PutArgs{.rank = 0, .buffer = region.data(), .size = 8, .remote = mr.remote_key()}).is_failed());
    for (int i = 0; i < 16 && dev.in_flight() != 0; ++i) (void)dev.progress();
  }
  EXPECT_NE(what.find("post_put: notify needs 4 bytes of remote data; transport scripted offers 2"), std::string::npos)
      << what;
}

}  // namespace
