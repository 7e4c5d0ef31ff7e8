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
  EXPECT_THAT(error_of([&] {
                return dev.post_put({.rank = peer, .buffer = local.data(), .size = 8, .remote = k, .notify = true,
                                     .notify_target = {60000}});
              }),
              HasSubstr("post_put: notify_target=60000 is out of range; FERRY_MAX_TARGETS="));
  {  // a key names the device its region was registered on (a real second device: below)
    ferry::RemoteKey other_device = k;
    other_device.device = 1;
    EXPECT_THAT(error_of([&] { return dev.post_get({.rank = peer, .buffer = local.data(), .size = 8, .remote = other_device}); }),
                HasSubstr("post_get: remote key was registered on device 1, but the operation uses device 0"));
  }
  EXPECT_THAT(error_of([&] { return dev.register_memory(nullptr, 64); }), HasSubstr("data=null with size=64"));
  EXPECT_THAT(error_of([&] { return dev.register_memory(local.data(), 0); }), HasSubstr("register_memory: size=0"));
  if (rt().device_count() > 1) {  // a key is for the device that registered its region
    ferry::MemoryRegion mr1 = rt().device(1).register_memory(region.data(), region.size());
    const auto keys1 = allgather<ferry::RemoteKey>("mp.bad.rkey1", mr1.remote_key());
    EXPECT_THAT(error_of([&] {
                  return dev.post_put({.rank = peer, .buffer = local.data(), .size = 8,
                                       .remote = keys1[static_cast<std::size_t>(peer)]});
                }),
                HasSubstr("remote key was registered on device 1, but the operation uses device 0"));
  }

  // iovec active messages: the descriptor must fit one packet, and the sizes one size_t.
  const std::vector<ferry::IoPart> many(4096, ferry::IoPart{local.data(), 1});
  EXPECT_THAT(error_of([&] { return dev.post_am_iovec({.rank = peer, .eager = {&byte, 1}, .parts = many, .target = {1}}); }),
              HasSubstr("post_am_iovec: eager.size=1 with 4096 parts needs"));
  EXPECT_THAT(error_of([&] {
                return dev.post_am_iovec(
                    {.rank = peer, .eager = {local.data(), 8192}, .parts = {{local.data(), 8}}, .target = {1}});
              }),
              HasSubstr("post_am_iovec: eager.size=8192 with 1 parts needs"));
  EXPECT_THAT(error_of([&] {
                // Four parts of 2^62 bytes (each within the size limit) sum past 2^64.
                const std::vector<ferry::IoPart> huge(4, ferry::IoPart{local.data(), std::size_t{1} << 62});
                return dev.post_am_iovec({.rank = peer, .parts = huge, .target = {1}});
              }),
              HasSubstr("the parts' sizes overflow"));

  // Completion objects.
  EXPECT_THAT(error_of([&] { return ferry::CompletionQueue({.capacity = (std::size_t{1} << 28) + 1}); }),
              HasSubstr("CompletionQueueOptions::capacity=268435457 is out of range"));

  // Remote targets.
  ferry::CompletionQueue cq;
  EXPECT_THAT(error_of([&] { return rt().expose(cq, 65000); }), HasSubstr("id=65000"));
  ferry::Exposure e = rt().expose(cq, 30);
  EXPECT_THAT(error_of([&] { return rt().expose(cq, 30); }), HasSubstr("id=30 is already exposed"));
  EXPECT_THAT(error_of([&] { return ferry::Synchronizer(0); }), HasSubstr("n=0"));
  EXPECT_THAT(error_of([&] { return rt().kv_get(n, "x"); }), HasSubstr("rank=" + std::to_string(n)));
  rt().barrier();
}
