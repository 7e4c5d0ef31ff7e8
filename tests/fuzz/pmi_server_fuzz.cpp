// pmi_server_fuzz.cpp — libFuzzer target: arbitrary bytes from ferryrun's ranks into its PMI-1
// server (tools/ferryrun/pmi_server.*), the decoder of the launcher's wire. The input is cut
// into chunks at each 0xFF byte; a chunk's first byte picks the rank of a 4-rank job (mod 4),
// or, at 0xFE, disconnects that rank; the rest is fed as that rank's bytes (partial lines,
// several lines, garbage). Replies and aborts go nowhere. Nothing may crash, read out of
// bounds or grow without bound.
#include <cstdint>
#include <string_view>

#include "pmi_server.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::size_t replies = 0;
  ferryrun::PmiServer server(4, "kvs_fuzz", {[&](int, std::string_view line) { replies += line.size(); },
                                             [&](int, int, std::string_view) { ++replies; }});
  const auto* p = reinterpret_cast<const char*>(data);
  std::size_t at = 0;
  while (at < size) {
    std::size_t end = at;
    while (end < size && data[end] != 0xFF) ++end;
    if (end > at) {
      const int rank = data[at] % 4;
      if (data[at] == 0xFE) {
        server.disconnect(rank);
      } else {
        server.feed(rank, std::string_view(p + at + 1, end - at - 1));
      }
    }
    at = end + 1;
  }
  volatile std::size_t keep = replies;
  (void)keep;
  return 0;
}
