// Bad input gets a ferry::Error whose message names the argument and its value.
#include <gmock/gmock.h>

#include "mp_common.hpp"

using namespace mp;
using testing::HasSubstr;

namespace {

// Runs f, expects ferry::Error, and returns its message.
template <class F>
std::string error_of(F&& f) {
  try {
    (void)f();
  } catch (const ferry::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no error";
}

}  // namespace

TEST(BadInput, EveryInvalidArgumentIsNamedWithItsValue) {
  ferry::Device& dev = rt().device();
  const int n = rt().size();
  char byte = 0;
  ferry::Synchronizer s(1);

  EXPECT_THAT(error_of([&] { return dev.post_am({.rank = n, .buffer = &byte, .size = 1}); }),
              HasSubstr("rank=" + std::to_string(n)));
  EXPECT_THAT(error_of([&] { return dev.post_send({.rank = -5, .buffer = &byte, .size = 1}); }), HasSubstr("rank=-5"));
  EXPECT_THAT(error_of([&] { return dev.post_recv({.rank = n + 3, .buffer = &byte, .size = 1}); }),
              HasSubstr("rank=" + std::to_string(n + 3)));
  EXPECT_THAT(error_of([&] { return dev.post_am({.rank = 0, .buffer = nullptr, .size = 8}); }),
              HasSubstr("buffer=null with size=8"));
  EXPECT_THAT(error_of([&] { return dev.post_send({.rank = 0, .buffer = nullptr, .size = 3}); }),
              HasSubstr("buffer=null with size=3"));
  EXPECT_THAT(error_of([&] { return dev.post_send({.rank = 0, .buffer = &byte, .size = ~std::size_t{0}}); }),
              HasSubstr("size=" + std::to_string(~std::size_t{0})));
  EXPECT_THAT(error_of([&] { return dev.post_send({.rank = 0, .buffer = &byte, .size = 1, .tag = ferry::max_tag + 1}); }),
              HasSubstr("tag=" + std::to_string(ferry::max_tag + 1)));
  EXPECT_THAT(error_of([&] { return dev.post_am({.rank = 0, .buffer = &byte, .size = 1, .target = {60000}}); }),
              HasSubstr("target=60000"));
  EXPECT_THAT(error_of([&] {
                return dev.post_am_iovec({.rank = 0, .eager = {&byte, 1}, .parts = {{nullptr, 10}}, .target = {1}});
              }),
              HasSubstr("parts[0].buffer=null with size=10"));
  EXPECT_THAT(error_of([&] { return rt().device(7); }), HasSubstr("index=7"));

  // RMA: keys from a real region on every rank.
  std::vector<unsigned char> region(4096);
  ferry::MemoryRegion mr = dev.register_memory(region.data(), region.size());
  const auto keys = allgather<ferry::RemoteKey>("mp.bad.rkey", mr.remote_key());
  const int peer = right();
  const ferry::RemoteKey& k = keys[static_cast<std::size_t>(peer)];
  std::vector<unsigned char> local(8192);
  EXPECT_THAT(error_of([&] { return dev.post_put({.rank = peer, .buffer = local.data(), .size = 4097, .remote = k}); }),
              HasSubstr("offset=0 + size=4097 is outside the remote region of 4096 bytes"));
  EXPECT_THAT(error_of([&] {
                return dev.post_get({.rank = peer, .buffer = local.data(), .size = 16, .remote = k, .offset = 4090});
              }),
              HasSubstr("offset=4090 + size=16"));
  EXPECT_THAT(error_of([&] {
                return dev.post_put({.rank = peer, .buffer = local.data(), .size = 8, .remote = k,
                                     .offset = ~std::size_t{0} - 2});
              }),
              HasSubstr("is outside the remote region"));
  if (n > 1) {
    const ferry::RemoteKey& other = keys[static_cast<std::size_t>(rt().rank())];  // mine, used for a peer
    EXPECT_THAT(error_of([&] { return dev.post_put({.rank = peer, .buffer = local.data(), .size = 8, .remote = other}); }),
                HasSubstr("remote key belongs to rank " + std::to_string(rt().rank()) + ", not rank=" + std::to_string(peer)));
  }
  EXPECT_THAT(error_of([&] { return dev.post_get({.rank = peer, .buffer = local.data(), .size = 8, .remote = {}}); }),
              HasSubstr("remote key is empty"));
  EXPECT_THAT(error_of([&] {
                return dev.post_put({.rank = peer, .buffer = local.data(), .size = 8, .remote = k, .notify = true,
                                     .notify_tag = 70000});
              }),
              HasSubstr("notify_tag=70000"));
  EXPECT_THAT(error_of([&] { return dev.register_memory(nullptr, 64); }), HasSubstr("data=null with size=64"));

  // Remote targets.
  ferry::CompletionQueue cq;
  EXPECT_THAT(error_of([&] { return rt().expose(cq, 65000); }), HasSubstr("id=65000"));
  ferry::Exposure e = rt().expose(cq, 30);
  EXPECT_THAT(error_of([&] { return rt().expose(cq, 30); }), HasSubstr("id=30 is already exposed"));
  EXPECT_THAT(error_of([&] { return ferry::Synchronizer(0); }), HasSubstr("n=0"));
  EXPECT_THAT(error_of([&] { return rt().kv_get(n, "x"); }), HasSubstr("rank=" + std::to_string(n)));
  rt().barrier();
}
