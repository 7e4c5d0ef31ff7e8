// wire_fuzz.cpp — libFuzzer target: arbitrary bytes into a real device's receive path.
//
// The input is a script of frames ([u16 little-endian length][bytes], the last frame taking
// what is left when its length runs past the end). Each frame arrives as one message from rank
// 0 (DeviceHarness), so every decoder of core wire data sees it: the header checks, eager
// active messages and tagged messages (matched by receives the harness posts afterwards),
// fragments and their reassembly, rendezvous requests (active message, tagged and iovec, with
// their part tables), FINs and barrier steps. The device must not crash, touch memory it does
// not own (ASan+UBSan) or leak (LSan). Built as a fuzzer with clang (scripts/fuzz.sh), and with
// replay_main.cpp, which runs the committed corpus as an ordinary test.
#include <cstdint>
#include <cstring>
#include <vector>

#include "device_harness.hpp"

namespace {

// A rendezvous request makes the receiver allocate the size it announces, as the protocol
// has it (a size no allocation can meet completes with -ENOMEM; tested in
// hostile_bytes_test.cpp). Under ASan each such allocation maps fresh pages and writes their
// shadow, which at sizes up to 64 MiB held the target at about 450 inputs/s. Sizes are folded
// below 320 KiB here: that still spans two read budgets of the rendezvous (kReadBudget,
// 256 KiB), so reads that take several progress calls are exercised; larger sizes take the
// same code. Every other byte is left as the fuzzer made it.
void fold_sizes(std::vector<unsigned char>& f) {
  constexpr std::uint64_t kMax = std::uint64_t{320} << 10;
  auto fold = [&f](std::size_t at) {
    std::uint64_t v;
    std::memcpy(&v, f.data() + at, sizeof v);
    v %= kMax;
    std::memcpy(f.data() + at, &v, sizeof v);
  };
  if (f.size() < 48 || f[0] < 3 || f[0] > 5) return;  // rts_am, rts_msg, rts_iovec
  fold(16);
  if (f[0] != 5) return;
  std::uint64_t eager;
  std::memcpy(&eager, f.data() + 16, sizeof eager);
  for (std::size_t at = 48 + eager; at + 24 <= f.size(); at += 24) fold(at);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::vector<unsigned char>> frames;
  std::size_t at = 0;
  while (at + 2 <= size && frames.size() < 256) {
    std::size_t n = data[at] | (std::size_t{data[at + 1]} << 8);
    at += 2;
    if (n > size - at) n = size - at;
    frames.emplace_back(data + at, data + at + n);
    fold_sizes(frames.back());
    at += n;
  }
  (void)ferry::fuzz::DeviceHarness::get().run(std::move(frames), /*copy_payloads=*/false);
  return 0;
}
