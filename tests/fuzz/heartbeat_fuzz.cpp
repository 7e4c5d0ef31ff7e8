// heartbeat_fuzz.cpp — libFuzzer target: arbitrary messages into the keepalive's channel
// (core/heartbeats.hpp) through a ScriptedTransport. The input is a list of frames, each
// [u8 length][bytes] (a frame past the channel's 64-byte receives arrives truncated, as a
// transport reports it). The channel, rank 1 of 4, must drop every message that is not a
// well-formed heartbeat from the transport's sender (rank 0), repost every receive used up, and
// never crash or touch memory it does not own. Built as a fuzzer with clang (scripts/fuzz.sh),
// and with replay_main.cpp, which runs the committed corpus as an ordinary test.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "common/log.hpp"
#include "core/heartbeats.hpp"
#include "scripted_transport.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Each malformed heartbeat logs a warning: millions of lines a minute (FERRY_LOG=warn keeps them).
  static const bool quiet = [] {
    if (std::getenv("FERRY_LOG") == nullptr) ferry::detail::set_log_level(ferry::LogLevel::off);
    return true;
  }();
  (void)quiet;
  std::vector<std::vector<unsigned char>> frames;
  for (std::size_t at = 0; at < size && frames.size() < 512;) {
    const std::size_t n = data[at++];
    const std::size_t take = n < size - at ? n : size - at;
    frames.emplace_back(data + at, data + at + take);
    at += take;
  }
  const std::size_t sent = frames.size();
  auto owned = std::make_unique<ferry::fuzz::ScriptedTransport>(std::move(frames));
  ferry::fuzz::ScriptedTransport& transport = *owned;
  ferry::detail::HeartbeatChannel channel(std::move(owned), /*rank=*/1, /*size=*/4);
  channel.connect({"", "", "", ""});
  std::vector<ferry::detail::HeartbeatChannel::Arrived> arrived;
  // Each poll takes a bounded number of messages; every one must be taken within enough polls.
  for (std::size_t i = 0; i < sent + 1 && !transport.done(); ++i) channel.poll(arrived);
  if (!transport.done()) std::abort();  // a receive not reposted: the channel went deaf
  if (transport.posted_recvs() != 32) std::abort();  // every receive used up was posted again
  for (const auto& a : arrived) {
    if (a.rank != 0) std::abort();  // the transport named rank 0 as every message's sender
    using ferry::detail::Beat;
    if (a.kind != Beat::alive && a.kind != Beat::departing && a.kind != Beat::failed) std::abort();
    // A notice names a rank of the job other than its sender; the other kinds name none.
    if (a.kind == Beat::failed ? a.subject < 0 || a.subject >= 4 || a.subject == a.rank : a.subject != 0) std::abort();
  }
  if (arrived.size() + channel.malformed() > sent) std::abort();
  return 0;
}
