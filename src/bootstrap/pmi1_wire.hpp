// pmi1_wire.hpp — parsing of PMI-1 reply lines.
//
// Exposed separately from pmi1.cpp so the parser can be unit-tested without a launcher.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace ferry::bootstrap::detail {

// One reply line from the launcher, e.g. "cmd=get_result rc=0 msg=success value=ab12".
// Fields may come in any order and launchers add fields of their own, so a reply is a map,
// and callers look up only what they need.
struct PmiReply {
  std::map<std::string, std::string, std::less<>> fields;

  [[nodiscard]] std::optional<std::string_view> get(std::string_view name) const {
    auto it = fields.find(name);
    if (it == fields.end()) return std::nullopt;
    return std::string_view(it->second);
  }
};

// Splits on blanks into key=value tokens (split at the first '='; a trailing '\r' is
// dropped). A token with no '=' continues the previous value, joined by one space, because
// some launchers put free text in "msg=". Never throws.
PmiReply parse_pmi_reply(std::string_view line);

}  // namespace ferry::bootstrap::detail
