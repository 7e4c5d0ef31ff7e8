// wire_test.cpp — the on-the-wire structs: sizes, layout and encode/decode round trips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/wire.hpp"

namespace {

using namespace ferry::detail;

// The sizes are the wire format: every rank must agree on them, and the eager limit is
// packet_size minus sizeof(WireHeader) (16, as documented in FERRY_PACKET_SIZE's help).
TEST(Wire, Sizes) {
  EXPECT_EQ(sizeof(WireHeader), 16u);
  EXPECT_EQ(sizeof(RtsBody), 32u);
  EXPECT_EQ(sizeof(RtsPart), 24u);
  EXPECT_EQ(sizeof(FinBody), 8u);
  EXPECT_EQ(sizeof(MsgKind), 1u);
}

// Field offsets, so a reordering (which would still pass the size checks) is caught.
TEST(Wire, HeaderLayout) {
  EXPECT_EQ(offsetof(WireHeader, kind), 0u);
  EXPECT_EQ(offsetof(WireHeader, reserved), 1u);
  EXPECT_EQ(offsetof(WireHeader, target), 2u);
  EXPECT_EQ(offsetof(WireHeader, src), 4u);
  EXPECT_EQ(offsetof(WireHeader, tag), 8u);
  EXPECT_EQ(offsetof(WireHeader, aux), 12u);
  EXPECT_EQ(offsetof(RtsBody, size), 0u);
  EXPECT_EQ(offsetof(RtsBody, addr), 8u);
  EXPECT_EQ(offsetof(RtsBody, key), 16u);
  EXPECT_EQ(offsetof(RtsBody, send_op), 24u);
}

// valid_kind accepts exactly the MsgKind enumerators (a receiver drops anything else).
TEST(Wire, ValidKind) {
  constexpr MsgKind kinds[] = {MsgKind::am,      MsgKind::msg, MsgKind::rts_am, MsgKind::rts_msg,
                               MsgKind::rts_iovec, MsgKind::fin, MsgKind::barrier, MsgKind::frag,
                               MsgKind::atomic, MsgKind::atomic_reply};
  std::uint8_t highest = 0;
  for (MsgKind k : kinds) {
    const auto v = static_cast<std::uint8_t>(k);
    EXPECT_TRUE(valid_kind(v)) << int(v);
    highest = std::max(highest, v);
  }
  // The values are dense from 1, so "valid" is exactly 1..highest.
  EXPECT_EQ(highest, std::size(kinds));
  EXPECT_FALSE(valid_kind(0)) << "0 is what a zeroed (never written) packet holds";
  EXPECT_FALSE(valid_kind(static_cast<std::uint8_t>(highest + 1)));
  EXPECT_FALSE(valid_kind(0x80));
  EXPECT_FALSE(valid_kind(0xFF));
}

// min_length is the receiver's one check of kind and length: every kind's header and fixed
// body for the enumerators, and for any other byte more than the largest packet (1 GiB).
TEST(Wire, MinLengthRejectsEveryOtherKind) {
  EXPECT_EQ(min_length(static_cast<std::uint8_t>(MsgKind::am)), sizeof(WireHeader));
  EXPECT_EQ(min_length(static_cast<std::uint8_t>(MsgKind::rts_am)), sizeof(WireHeader) + sizeof(RtsBody));
  EXPECT_EQ(min_length(static_cast<std::uint8_t>(MsgKind::fin)), sizeof(WireHeader) + sizeof(FinBody));
  for (int v = 0; v < 256; ++v) {
    const auto k = static_cast<std::uint8_t>(v);
    if (valid_kind(k)) {
      EXPECT_GE(min_length(k), sizeof(WireHeader)) << v;
    } else {
      EXPECT_GT(min_length(k), std::size_t{1} << 30) << v;
    }
  }
}

TEST(Wire, HeaderRoundTrip) {
  WireHeader h{};
  h.kind = MsgKind::rts_iovec;
  h.target = 0xBEEF;
  h.src = -7;  // signed on the wire; must survive
  h.tag = 0x7FFFFFFF;
  h.aux = 3;
  unsigned char bytes[sizeof(WireHeader)];
  encode(bytes, h);
  const WireHeader d = decode<WireHeader>(bytes);
  EXPECT_EQ(d.kind, MsgKind::rts_iovec);
  EXPECT_EQ(d.reserved, 0);
  EXPECT_EQ(d.target, 0xBEEF);
  EXPECT_EQ(d.src, -7);
  EXPECT_EQ(d.tag, 0x7FFFFFFFu);
  EXPECT_EQ(d.aux, 3u);
  EXPECT_TRUE(valid_kind(bytes[0])) << "the kind is the first byte";
}

// Encode/decode work at any alignment: bodies follow the header inside a payload and parts
// follow eager bytes of arbitrary length.
TEST(Wire, UnalignedRoundTrips) {
  std::vector<unsigned char> buf(256, 0xAA);
  for (std::size_t off = 0; off < 9; ++off) {
    RtsBody b{0x0123456789ABCDEFull, 0xFFFFFFFFFFFFFFFFull, 42, off};
    encode(buf.data() + off, b);
    const RtsBody d = decode<RtsBody>(buf.data() + off);
    EXPECT_EQ(d.size, b.size);
    EXPECT_EQ(d.addr, b.addr);
    EXPECT_EQ(d.key, b.key);
    EXPECT_EQ(d.send_op, off);
    EXPECT_EQ(buf[off + sizeof(RtsBody)], 0xAA) << "encode wrote past the struct";

    FinBody f{0xDEADBEEFCAFEull + off};
    encode(buf.data() + 100 + off, f);
    EXPECT_EQ(decode<FinBody>(buf.data() + 100 + off).send_op, f.send_op);
  }
}

// An iovec RTS as the protocol lays it out: header, RtsBody, eager bytes, then `aux` parts.
TEST(Wire, IovecRtsLayoutRoundTrip) {
  const char eager[] = "eager part, odd length";
  const std::size_t eager_len = sizeof eager;  // 23: the parts start unaligned
  const RtsPart parts[3] = {{100, 0x1000, 1}, {200, 0x2000, 2}, {0, 0, 0}};
  std::vector<unsigned char> pkt(sizeof(WireHeader) + sizeof(RtsBody) + eager_len + 3 * sizeof(RtsPart));

  WireHeader h{};
  h.kind = MsgKind::rts_iovec;
  h.src = 5;
  h.target = 9;
  h.aux = 3;
  std::size_t at = 0;
  encode(pkt.data() + at, h);
  at += sizeof h;
  encode(pkt.data() + at, RtsBody{eager_len, 0, 0, 77});
  at += sizeof(RtsBody);
  std::memcpy(pkt.data() + at, eager, eager_len);
  at += eager_len;
  for (const RtsPart& p : parts) {
    encode(pkt.data() + at, p);
    at += sizeof p;
  }
  ASSERT_EQ(at, pkt.size());

  at = 0;
  const auto dh = decode<WireHeader>(pkt.data());
  ASSERT_TRUE(valid_kind(static_cast<std::uint8_t>(dh.kind)));
  EXPECT_EQ(dh.kind, MsgKind::rts_iovec);
  EXPECT_EQ(dh.src, 5);
  EXPECT_EQ(dh.target, 9);
  at += sizeof(WireHeader);
  const auto body = decode<RtsBody>(pkt.data() + at);
  EXPECT_EQ(body.size, eager_len);
  EXPECT_EQ(body.send_op, 77u);
  at += sizeof(RtsBody);
  EXPECT_EQ(std::memcmp(pkt.data() + at, eager, eager_len), 0);
  at += body.size;
  for (std::uint32_t i = 0; i < dh.aux; ++i) {
    const auto p = decode<RtsPart>(pkt.data() + at + i * sizeof(RtsPart));
    EXPECT_EQ(p.size, parts[i].size);
    EXPECT_EQ(p.addr, parts[i].addr);
    EXPECT_EQ(p.key, parts[i].key);
  }
}

}  // namespace
