// coll_header_fuzz.cpp — libFuzzer target: arbitrary bytes as a collective's message
// (src/coll/wire.hpp's decode_coll). The first 4 bytes name the sender's rank, the rest is the
// active message's payload. A message the decoder accepts must be whole: a data message's
// bytes inside the input and as many as its header says, an rts's key its sender's and at
// least as large as the data, a fin empty; anything else is refused with a reason. Built as a
// fuzzer with clang (scripts/fuzz.sh), and with replay_main.cpp, which runs the committed
// corpus as an ordinary test.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "coll/wire.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 4) return 0;
  std::int32_t sender;
  std::memcpy(&sender, data, 4);
  const std::uint8_t* bytes = data + 4;
  const std::size_t length = size - 4;
  ferry::detail::CollMessage m;
  const char* why = ferry::detail::decode_coll(bytes, length, sender, m);
  if (why != nullptr) {
    if (why[0] == '\0') std::abort();  // a refusal always says why
    return 0;
  }
  using ferry::detail::CollKind;
  switch (m.kind) {
    case CollKind::data:
      if (m.data != bytes + sizeof(ferry::detail::CollHeader) || m.size != length - sizeof(ferry::detail::CollHeader)) std::abort();
      {
        // Every byte it names is readable: a sanitizer catches a read past the input.
        unsigned sum = 0;
        for (std::size_t i = 0; i < m.size; ++i) sum += m.data[i];
        if (sum == 0xFFFFFFFFu) std::abort();
      }
      break;
    case CollKind::rts:
      if (m.key.rank != sender || m.key.size < m.size || m.data != nullptr) std::abort();
      break;
    case CollKind::fin:
      if (m.size != 0 || length != sizeof(ferry::detail::CollHeader)) std::abort();
      break;
    default: std::abort();
  }
  return 0;
}
