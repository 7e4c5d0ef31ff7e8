// pmi_reply_fuzz.cpp — libFuzzer target: arbitrary bytes as the PMI-1 reply lines ferry's
// bootstrap reads from its launcher (src/bootstrap/pmi1_wire.hpp), each line parsed into its
// fields and every value hex-decoded as a key-value read would (src/bootstrap/hex.hpp). Lines
// are cut at '\n' as the client does. Nothing may crash or read out of bounds.
#include <cstdint>
#include <string_view>

#include "bootstrap/hex.hpp"
#include "bootstrap/pmi1_wire.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  std::size_t decoded = 0, at = 0;
  while (at <= all.size()) {
    std::size_t end = all.find('\n', at);
    if (end == std::string_view::npos) end = all.size();
    const auto reply = ferry::bootstrap::detail::parse_pmi_reply(all.substr(at, end - at));
    for (const auto& [key, value] : reply.fields) {
      if (auto bytes = ferry::bootstrap::detail::hex_decode(value)) decoded += bytes->size();
      if (reply.get(key) == std::nullopt) __builtin_trap();  // a parsed field is found by its name
    }
    at = end + 1;
  }
  volatile std::size_t keep = decoded;
  (void)keep;
  return 0;
}
