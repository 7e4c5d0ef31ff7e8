// notify_fuzz.cpp — libFuzzer target: arbitrary put notifications into a real device (the
// DeviceHarness of wire_fuzz.cpp). The input is a list of 20-byte records [u64 data][u64
// length][i32 rank], each a remote write with data as a transport reports it (rank -1: the
// transport names no writer, so the data carries the rank). The device must drop each that
// names a rank outside the job or a target past FERRY_MAX_TARGETS, never crash or touch
// memory it does not own. Built as a fuzzer with clang (scripts/fuzz.sh), and with
// replay_main.cpp, which runs the committed corpus as an ordinary test.
#include <cstdint>
#include <cstring>
#include <vector>

#include "device_harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<ferry::net::Event> notices;
  for (std::size_t at = 0; at + 20 <= size && notices.size() < 256; at += 20) {
    ferry::net::Event e;
    e.remote_write = true;
    std::memcpy(&e.data, data + at, 8);
    std::uint64_t length;
    std::memcpy(&length, data + at + 8, 8);
    e.length = static_cast<std::size_t>(length);
    std::memcpy(&e.rank, data + at + 16, 4);
    notices.push_back(e);
  }
  (void)ferry::fuzz::DeviceHarness::get().run({}, /*copy_payloads=*/false, std::move(notices));
  return 0;
}
