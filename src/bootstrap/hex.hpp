// hex.hpp — byte <-> hex text, for launchers whose key-value stores only carry text.
//
// PMI-1 values travel inside a space-separated, newline-terminated line, so bytes such as
// 0x00, ' ', '=' and '\n' must never reach the wire as themselves.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace ferry::bootstrap::detail {

inline std::string hex_encode(std::string_view bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.resize(bytes.size() * 2);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const auto b = static_cast<unsigned char>(bytes[i]);
    out[2 * i] = digits[b >> 4];
    out[2 * i + 1] = digits[b & 0x0f];
  }
  return out;
}

// nullopt on odd length or a non-hex character: the caller knows which key it was decoding
// and words the error.
inline std::optional<std::string> hex_decode(std::string_view text) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (text.size() % 2 != 0) return std::nullopt;
  std::string out;
  out.resize(text.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int hi = nibble(text[2 * i]);
    const int lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out[i] = static_cast<char>((hi << 4) | lo);
  }
  return out;
}

}  // namespace ferry::bootstrap::detail
