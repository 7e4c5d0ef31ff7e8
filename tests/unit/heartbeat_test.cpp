// The keepalive channel: its heartbeat encoded and decoded, every field checked before use, and
// the channel over a scripted transport.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../fuzz/scripted_transport.hpp"
#include "core/heartbeats.hpp"
#include "ferry/error.hpp"

namespace {

using ferry::detail::Beat;
using ferry::detail::decode_beat;
using ferry::detail::encode_beat;
using ferry::detail::kBeatBytes;

TEST(Heartbeat, RoundTrips) {
  for (Beat kind : {Beat::alive, Beat::departing}) {
    unsigned char frame[kBeatBytes];
    encode_beat(frame, kind, 5);
    Beat got{};
    int rank = -1;
    ASSERT_TRUE(decode_beat(frame, sizeof frame, 8, -1, got, rank));
    EXPECT_EQ(got, kind);
    EXPECT_EQ(rank, 5);
    ASSERT_TRUE(decode_beat(frame, sizeof frame, 8, 5, got, rank)) << "the transport names the same sender";
  }
}

TEST(Heartbeat, EveryFieldIsChecked) {
  unsigned char good[kBeatBytes];
  encode_beat(good, Beat::alive, 3);
  Beat kind{};
  int rank = -1;
  EXPECT_FALSE(decode_beat(nullptr, kBeatBytes, 8, -1, kind, rank));
  EXPECT_FALSE(decode_beat(good, kBeatBytes - 1, 8, -1, kind, rank)) << "short";
  EXPECT_FALSE(decode_beat(good, kBeatBytes + 1, 8, -1, kind, rank)) << "long";
  EXPECT_FALSE(decode_beat(good, kBeatBytes, 3, -1, kind, rank)) << "rank outside a job of 3";
  EXPECT_FALSE(decode_beat(good, kBeatBytes, 8, 2, kind, rank)) << "the transport names another sender";
  // Each byte changed: the magic, the kind, the padding and the rank's high bytes are refused;
  // only the rank's lowest byte may change to another rank inside the job.
  for (std::size_t i = 0; i < kBeatBytes; ++i) {
    for (unsigned v : {0x00u, 0x03u, 0x7Fu, 0xFFu}) {
      unsigned char frame[kBeatBytes];
      std::memcpy(frame, good, sizeof frame);
      if (frame[i] == v) continue;
      frame[i] = static_cast<unsigned char>(v);
      const bool ok = decode_beat(frame, sizeof frame, 8, -1, kind, rank);
      if (i == 4 && v == 0x02u) continue;  // not tried: 0x02 is departing
      if (i == 4 && v == 0x03u) {
        EXPECT_TRUE(ok) << "a notice from rank 3 that rank 0 failed";
        continue;
      }
      if (i == 8 && v < 8) {
        EXPECT_TRUE(ok) << "rank byte " << v;
        EXPECT_EQ(rank, static_cast<int>(v));
      } else {
        EXPECT_FALSE(ok) << "byte " << i << " = " << v;
      }
    }
  }
}

TEST(Heartbeat, ANoticeNamesAFailedRankInsideTheJobThatIsNotItsSender) {
  unsigned char frame[kBeatBytes];
  Beat kind{};
  int rank = -1, subject = -1;
  encode_beat(frame, Beat::failed, 3, 5);
  ASSERT_TRUE(decode_beat(frame, kBeatBytes, 8, 3, kind, rank, subject));
  EXPECT_EQ(kind, Beat::failed);
  EXPECT_EQ(rank, 3);
  EXPECT_EQ(subject, 5);
  encode_beat(frame, Beat::failed, 3, 8);
  EXPECT_FALSE(decode_beat(frame, kBeatBytes, 8, -1, kind, rank, subject)) << "subject outside a job of 8";
  encode_beat(frame, Beat::failed, 3, 3);
  EXPECT_FALSE(decode_beat(frame, kBeatBytes, 8, -1, kind, rank, subject)) << "a sender reporting itself";
  encode_beat(frame, Beat::alive, 3, 5);
  EXPECT_FALSE(decode_beat(frame, kBeatBytes, 8, -1, kind, rank, subject)) << "a heartbeat with a subject";
}

}  // namespace

namespace {

using ferry::detail::HeartbeatChannel;
using ferry::fuzz::ScriptedTransport;

std::vector<unsigned char> frame_of(Beat kind, int rank) {
  unsigned char f[kBeatBytes];
  encode_beat(f, kind, rank);
  return {f, f + kBeatBytes};
}

TEST(HeartbeatChannel, DeliversGoodBeatsAndCountsTheRest) {
  std::vector<std::vector<unsigned char>> frames;
  for (int i = 0; i < 100; ++i) frames.push_back(frame_of(Beat::alive, 2));  // more than its receives
  frames.push_back(frame_of(Beat::alive, 3));             // another sender than the transport names
  frames.push_back(std::vector<unsigned char>(200, 0));   // too long: truncated
  frames.push_back(std::vector<unsigned char>(3, 0));     // too short
  frames.push_back(frame_of(Beat::departing, 2));
  auto owned = std::make_unique<ScriptedTransport>(std::move(frames));
  ScriptedTransport& transport = *owned;
  transport.set_source(2);
  HeartbeatChannel channel(std::move(owned), 0, 4);
  channel.connect({"", "", "", ""});
  std::vector<HeartbeatChannel::Arrived> arrived;
  for (int i = 0; i < 10 && !transport.done(); ++i) channel.poll(arrived);
  ASSERT_TRUE(transport.done()) << "every receive is reposted";
  ASSERT_EQ(arrived.size(), 101u);
  for (std::size_t i = 0; i < 100; ++i) EXPECT_EQ(arrived[i].kind, Beat::alive);
  EXPECT_EQ(arrived.back().kind, Beat::departing);
  for (const auto& a : arrived) EXPECT_EQ(a.rank, 2);
  EXPECT_EQ(channel.malformed(), 3u);
}

TEST(HeartbeatChannel, ItsOwnRankIsNotHeard) {
  std::vector<std::vector<unsigned char>> frames{frame_of(Beat::alive, 1)};
  auto owned = std::make_unique<ScriptedTransport>(std::move(frames));
  owned->set_reports_source(false);  // the transport names no sender: the heartbeat's rank is taken
  owned->set_source(-1);
  HeartbeatChannel channel(std::move(owned), 1, 4);
  channel.connect({"", "", "", ""});
  std::vector<HeartbeatChannel::Arrived> arrived;
  channel.poll(arrived);
  EXPECT_TRUE(arrived.empty());
  EXPECT_EQ(channel.malformed(), 1u);
}

TEST(HeartbeatChannel, ASenderTheTransportCannotNameIsRefused) {
  // A transport that names senders reports -1 for one outside its address table.
  std::vector<std::vector<unsigned char>> frames{frame_of(Beat::departing, 2)};
  auto owned = std::make_unique<ScriptedTransport>(std::move(frames));
  owned->set_source(-1);
  HeartbeatChannel channel(std::move(owned), 0, 4);
  channel.connect({"", "", "", ""});
  std::vector<HeartbeatChannel::Arrived> arrived;
  channel.poll(arrived);
  EXPECT_TRUE(arrived.empty()) << "an unnamed sender could mark any rank departed";
  EXPECT_EQ(channel.malformed(), 1u);
}

TEST(HeartbeatChannel, EveryReceiveUsedUpByAMalformedMessageIsReposted) {
  // More malformed messages than the channel has receives, then a heartbeat: it arrives only
  // if each receive a malformed message used up was posted again.
  std::vector<std::vector<unsigned char>> frames(100, std::vector<unsigned char>(5, 0xAB));
  frames.push_back(frame_of(Beat::alive, 0));
  auto owned = std::make_unique<ScriptedTransport>(std::move(frames));
  ScriptedTransport& transport = *owned;
  HeartbeatChannel channel(std::move(owned), 1, 2);
  channel.connect({"", ""});
  const std::size_t receives = transport.posted_recvs();
  std::vector<HeartbeatChannel::Arrived> arrived;
  for (int i = 0; i < 10 && !transport.done(); ++i) channel.poll(arrived);
  ASSERT_TRUE(transport.done());
  ASSERT_EQ(arrived.size(), 1u);
  EXPECT_EQ(arrived[0].rank, 0);
  EXPECT_EQ(channel.malformed(), 100u);
  EXPECT_EQ(transport.posted_recvs(), receives) << "as many receives posted as before";
}

TEST(HeartbeatChannel, AReceiveTheTransportRefusesIsPostedAgainLater) {
  std::vector<std::vector<unsigned char>> frames{frame_of(Beat::alive, 0)};
  auto owned = std::make_unique<ScriptedTransport>(std::move(frames));
  ScriptedTransport& transport = *owned;
  transport.refuse_recvs(1000);  // every receive of connect() refused
  HeartbeatChannel channel(std::move(owned), 1, 2);
  channel.connect({"", ""});
  EXPECT_EQ(transport.posted_recvs(), 0u);
  transport.refuse_recvs(0);
  std::vector<HeartbeatChannel::Arrived> arrived;
  channel.poll(arrived);
  ASSERT_EQ(arrived.size(), 1u) << "the refused receives were posted at the next poll";
  channel.poll(arrived);
  EXPECT_GE(transport.posted_recvs(), 32u);
}

// A transport that lends its messages (UCX) takes no receives: the channel posts none, and
// checks each lent heartbeat as it checks a received one.
TEST(HeartbeatChannel, OverALendingTransportTakesLentBeatsAndPostsNothing) {
  std::vector<std::vector<unsigned char>> frames;
  for (int i = 0; i < 40; ++i) frames.push_back(frame_of(Beat::alive, 2));  // more than a poll lends
  frames.push_back(std::vector<unsigned char>(200, 0));  // too long for a heartbeat
  frames.push_back(std::vector<unsigned char>(3, 0));    // too short
  frames.push_back(frame_of(Beat::departing, 2));
  auto owned = std::make_unique<ScriptedTransport>(std::move(frames));
  ScriptedTransport& transport = *owned;
  transport.set_lends(true);
  transport.set_source(2);
  HeartbeatChannel channel(std::move(owned), 0, 4);
  channel.connect({"", "", "", ""});
  EXPECT_EQ(transport.posted_recvs(), 0u);
  std::vector<HeartbeatChannel::Arrived> arrived;
  for (int i = 0; i < 10 && !transport.done(); ++i) channel.poll(arrived);
  ASSERT_TRUE(transport.done()) << "every frame was lent";
  ASSERT_EQ(arrived.size(), 41u);
  for (std::size_t i = 0; i < 40; ++i) EXPECT_EQ(arrived[i].kind, Beat::alive);
  EXPECT_EQ(arrived.back().kind, Beat::departing);
  for (const auto& a : arrived) EXPECT_EQ(a.rank, 2);
  EXPECT_EQ(channel.malformed(), 2u);
  EXPECT_EQ(transport.posted_recvs(), 0u);
}

TEST(HeartbeatChannel, ATransportThatCannotInjectAHeartbeatIsRefusedByName) {
  auto owned = std::make_unique<ScriptedTransport>(std::vector<std::vector<unsigned char>>{});
  owned->set_inject_size(kBeatBytes - 1);
  try {
    HeartbeatChannel channel(std::move(owned), 0, 2);
    FAIL() << "a channel over a transport with a 15-byte inject size was made";
  } catch (const ferry::Error& e) {
    EXPECT_NE(std::string(e.what()).find("inject size 15"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("FERRY_PEER_TIMEOUT_MS=0"), std::string::npos) << e.what();
  }
}

}  // namespace
