// The keepalive channel's heartbeat: encoded and decoded, and every field checked before use.
#include <gtest/gtest.h>

#include <cstring>

#include "core/heartbeats.hpp"

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
      if (i == 8 && v < 8) {
        EXPECT_TRUE(ok) << "rank byte " << v;
        EXPECT_EQ(rank, static_cast<int>(v));
      } else {
        EXPECT_FALSE(ok) << "byte " << i << " = " << v;
      }
    }
  }
}

}  // namespace
