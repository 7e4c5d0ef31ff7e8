// collective_test.cpp — tests that every rank of the job runs in the same order.
//
// gtest runs tests in declaration order, and every rank runs the same binary, so the
// collective calls below line up across ranks.
#include <gtest/gtest.h>

#include <string>

#include "ferry/error.hpp"
#include "harness.hpp"

namespace {

using ferry_test::job;

// Bytes that would break a text protocol if sent raw, plus the rank so peers differ.
std::string small_value(int rank) {
  std::string v = "ferry";
  v += '\0';
  v += "a=b c\nd\r\t";
  v += static_cast<char>(0xff);
  v += '\0';
  v += "rank-" + std::to_string(rank);
  return v;
}

std::string large_value(int rank, std::size_t n = 10 * 1024) {
  std::string v(n, '\0');
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<char>((i * 7 + static_cast<std::size_t>(rank) * 13) & 0xff);
  return v;
}

TEST(Collective, RankAndSize) {
  EXPECT_GE(job().size(), 1);
  EXPECT_GE(job().rank(), 0);
  EXPECT_LT(job().rank(), job().size());
  if (!ferry_test::expected_kind().empty()) {
    EXPECT_EQ(job().kind(), ferry_test::expected_kind());
  }
  if (ferry_test::expected_size() > 0) {
    EXPECT_EQ(job().size(), ferry_test::expected_size());
  }
}

TEST(Collective, PutFenceGetEveryPeer) {
  const int me = job().rank();
  job().put("small", small_value(me));
  job().put("large", large_value(me));
  job().put("empty", "");
  // Reading our own values before the fence is allowed.
  EXPECT_EQ(job().get(me, "small"), small_value(me));
  job().fence();
  for (int peer = 0; peer < job().size(); ++peer) {
    EXPECT_EQ(job().get(peer, "small"), small_value(peer)) << "peer " << peer;
    const std::string big = job().get(peer, "large");
    EXPECT_EQ(big.size(), 10u * 1024u) << "peer " << peer;
    EXPECT_TRUE(big == large_value(peer)) << "peer " << peer;
    EXPECT_EQ(job().get(peer, "empty"), "") << "peer " << peer;
  }
}

TEST(Collective, SecondRoundAfterBarriers) {
  for (int i = 0; i < 5; ++i) job().barrier();
  const int me = job().rank();
  // A value exactly around the PMI-1 split boundary (hydra: vallen_max 1024).
  job().put("round2", large_value(me + 100, 511));
  job().put("round2b", large_value(me + 200, 512));
  job().fence();
  for (int peer = 0; peer < job().size(); ++peer) {
    EXPECT_EQ(job().get(peer, "round2"), large_value(peer + 100, 511)) << "peer " << peer;
    EXPECT_EQ(job().get(peer, "round2b"), large_value(peer + 200, 512)) << "peer " << peer;
  }
  for (int i = 0; i < 3; ++i) job().barrier();
}

TEST(Collective, MissingKeyThrows) {
  for (int peer = 0; peer < job().size(); ++peer) {
    try {
      (void)job().get(peer, "no-such-key");
      ADD_FAILURE() << "get(" << peer << ", no-such-key) returned";
    } catch (const ferry::Error& e) {
      EXPECT_NE(std::string(e.what()).find("no-such-key"), std::string::npos) << e.what();
    }
  }
  job().barrier();
}

TEST(Collective, RankOutOfRangeThrows) {
  EXPECT_THROW((void)job().get(job().size(), "small"), ferry::Error);
  EXPECT_THROW((void)job().get(-1, "small"), ferry::Error);
}

}  // namespace
