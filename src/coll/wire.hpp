// wire.hpp — the bytes of a collective's message (docs/collectives.md, "Messages") and their
// one decoder, which checks everything before the engine uses any of it. Header-only and
// free of the engine, so the fuzz target (tests/fuzz/coll_header_fuzz.cpp) runs it alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ferry/runtime.hpp"

namespace ferry::detail {

struct CollHeader {
  std::uint32_t magic;
  std::uint16_t step;
  std::uint16_t kind;  // CollKind
  std::uint64_t team;
  std::uint64_t seq;
  std::uint64_t size;  // data bytes
};
static_assert(sizeof(CollHeader) == 32, "part of the wire format");
inline constexpr std::uint32_t kCollMagic = 0x4C4F4346;  // "FCOL"
// data: the data follows (eager). rts: a RemoteKey follows; the receiver reads the `size` bytes
// with a get and answers fin, which ends the send.
enum class CollKind : std::uint16_t { data = 0, rts = 1, fin = 2 };

// A message that checked out: its header, and the data (data) or the key to read it (rts).
struct CollMessage {
  CollHeader header{};
  CollKind kind = CollKind::data;
  const unsigned char* data = nullptr;  // data: inside the decoded bytes
  std::size_t size = 0;
  RemoteKey key{};  // rts: names `sender`, covers `size` bytes
};

// Decodes `length` bytes an active message from job rank `sender` carried. Returns null and
// fills `out`, or the reason the bytes are refused.
inline const char* decode_coll(const void* bytes, std::size_t length, int sender, CollMessage& out) noexcept {
  if (bytes == nullptr || length < sizeof(CollHeader)) return "shorter than its header";
  std::memcpy(&out.header, bytes, sizeof(CollHeader));
  const CollHeader& h = out.header;
  if (h.magic != kCollMagic) return "bad magic";
  const std::size_t rest = length - sizeof(CollHeader);
  const auto* after = static_cast<const unsigned char*>(bytes) + sizeof(CollHeader);
  switch (static_cast<CollKind>(h.kind)) {
    case CollKind::data:
      if (rest != h.size) return "its size does not match its header";
      out.kind = CollKind::data;
      out.data = after;
      break;
    case CollKind::rts:
      if (rest != sizeof(RemoteKey)) return "a read request without its key";
      std::memcpy(&out.key, after, sizeof(RemoteKey));
      if (out.key.rank != sender || out.key.size < h.size) return "its key is not its sender's or is too small";
      out.kind = CollKind::rts;
      out.data = nullptr;
      break;
    case CollKind::fin:
      if (rest != 0 || h.size != 0) return "a fin with a payload";
      out.kind = CollKind::fin;
      out.data = nullptr;
      break;
    default: return "unknown kind";
  }
  out.size = static_cast<std::size_t>(h.size);
  return nullptr;
}

}  // namespace ferry::detail
