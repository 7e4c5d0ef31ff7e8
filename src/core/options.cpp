#include <cstdlib>
#include <limits>
#include <string>

#include "core/config.hpp"
#include "ferry/error.hpp"

namespace ferry {

const std::vector<OptionInfo>& option_table() {
  static const std::vector<OptionInfo> table = {
#define FERRY_X(field, env, def, help) OptionInfo{#field, env, def, help},
      FERRY_OPTIONS(FERRY_X)
#undef FERRY_X
  };
  return table;
}

namespace {

std::string text_of(const std::string& v) { return v; }
std::string text_of(int v) { return v == 0 ? std::string() : std::to_string(v); }
std::string text_of(std::size_t v) { return v == 0 ? std::string() : std::to_string(v); }

// The text in force for one option and where it came from.
std::string pick(const std::string& explicit_text, const char* env, const char* def) {
  if (!explicit_text.empty()) return explicit_text;
  if (const char* e = std::getenv(env); e != nullptr && *e != '\0') return e;
  return def;
}

}  // namespace

std::vector<std::pair<OptionInfo, std::string>> resolved_options(const RuntimeOptions& o) {
  std::vector<std::pair<OptionInfo, std::string>> out;
#define FERRY_X(field, env, def, help) \
  out.emplace_back(OptionInfo{#field, env, def, help}, pick(text_of(o.field), env, def));
  FERRY_OPTIONS(FERRY_X)
#undef FERRY_X
  return out;
}

}  // namespace ferry

namespace ferry::detail {

std::size_t parse_size(std::string_view what, std::string_view text) {
  auto fail = [&]() -> std::size_t {
    throw Error(std::string(what) + "='" + std::string(text) +
                "' is not a size: expected a whole number of bytes with an optional k, M or G suffix");
  };
  if (text.empty()) return fail();
  std::size_t i = 0;
  unsigned long long value = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    const unsigned digit = static_cast<unsigned>(text[i] - '0');
    if (value > (std::numeric_limits<unsigned long long>::max() - digit) / 10) return fail();
    value = value * 10 + digit;
    ++i;
  }
  if (i == 0) return fail();
  std::string_view suffix = text.substr(i);
  unsigned long long scale = 1;
  if (suffix.empty() || suffix == "B") {
  } else if (suffix == "k" || suffix == "K" || suffix == "KiB" || suffix == "kB") {
    scale = 1ull << 10;
  } else if (suffix == "M" || suffix == "m" || suffix == "MiB" || suffix == "MB") {
    scale = 1ull << 20;
  } else if (suffix == "G" || suffix == "g" || suffix == "GiB" || suffix == "GB") {
    scale = 1ull << 30;
  } else {
    return fail();
  }
  if (value > std::numeric_limits<unsigned long long>::max() / scale) return fail();
  return static_cast<std::size_t>(value * scale);
}

namespace {

std::size_t size_option(const RuntimeOptions& o, std::size_t explicit_value, const char* env, const char* def) {
  (void)o;
  if (explicit_value != 0) return explicit_value;
  const char* e = std::getenv(env);
  if (e != nullptr && *e != '\0') return parse_size(env, e);
  return parse_size(env, def);
}

void require_range(const char* env, std::size_t value, std::size_t lo, std::size_t hi) {
  if (value < lo || value > hi) {
    throw Error(std::string(env) + "=" + std::to_string(value) + " is out of range: valid values are " +
                std::to_string(lo) + " to " + std::to_string(hi));
  }
}

}  // namespace

Config resolve_config(const RuntimeOptions& o) {
  Config c;
  c.bootstrap = pick(o.bootstrap, "FERRY_BOOTSTRAP", "auto");
  c.provider = pick(o.provider, "FERRY_PROVIDER", "auto");
  if (o.devices < 0) throw Error("RuntimeOptions::devices=" + std::to_string(o.devices) + " must be positive");
  if (o.devices > 0) {
    c.devices = o.devices;
  } else {
    const char* e = std::getenv("FERRY_DEVICES");
    const std::string text = (e != nullptr && *e != '\0') ? e : "1";
    if (text.find_first_not_of("0123456789") != std::string::npos || text.size() > 9) {
      throw Error("FERRY_DEVICES='" + text + "' is not a count: expected a whole number from 1 to 64");
    }
    c.devices = std::stoi(text);
  }
  c.packet_size = size_option(o, o.packet_size, "FERRY_PACKET_SIZE", "8192");
  c.packets = size_option(o, o.packets, "FERRY_PACKETS", "4096");
  c.prepost = size_option(o, o.prepost, "FERRY_PREPOST", "256");
  c.recv_descriptors = size_option(o, o.recv_descriptors, "FERRY_RECV_DESCRIPTORS", "16384");
  c.send_credits = size_option(o, o.send_credits, "FERRY_SEND_CREDITS", "0");
  c.cq_capacity = size_option(o, o.cq_capacity, "FERRY_CQ_CAPACITY", "65536");
  c.max_targets = size_option(o, o.max_targets, "FERRY_MAX_TARGETS", "4096");
  c.rdv_threshold = size_option(o, o.rdv_threshold, "FERRY_RDV_THRESHOLD", "0");
  c.fragment_max = size_option(o, o.fragment_max, "FERRY_FRAGMENT_MAX", "16384");
  auto choice = [](const char* env, const std::string& explicit_value, const char* def,
                   std::initializer_list<const char*> valid) {
    std::string v = pick(explicit_value, env, def);
    for (const char* ok : valid) {
      if (v == ok) return v;
    }
    std::string list;
    for (const char* ok : valid) list += (list.empty() ? "" : ", ") + std::string(ok);
    throw Error(std::string(env) + "='" + v + "' is not valid; valid values: " + list);
  };
  c.lock_model = choice("FERRY_LOCK_MODEL", o.lock_model, "lockless",
                        {"lockless", "trylock", "block", "lockq", "csync", "offload"});
  c.completion = choice("FERRY_COMPLETION", o.completion, "cq", {"cq", "cq_ms", "cq_lock", "sync"});
  c.fragment = choice("FERRY_FRAGMENT", o.fragment, "auto", {"auto", "off"});
  c.header = choice("FERRY_HEADER", o.header, "am", {"am", "sendrecv"});
  c.device_polling = choice("FERRY_DEVICE_POLLING", o.device_polling, "local", {"local", "random", "global"});
  c.parcel_queues = choice("FERRY_PARCEL_QUEUES", o.parcel_queues, "shared", {"shared", "device"});
  c.progress = pick(o.progress, "FERRY_PROGRESS", "explicit");
  c.progress_threads = 0;
  if (c.progress.rfind("thread:", 0) == 0) {
    const std::string n = c.progress.substr(7);
    if (n.empty() || n.size() > 3 || n.find_first_not_of("0123456789") != std::string::npos || std::stoi(n) < 1) {
      throw Error("FERRY_PROGRESS='" + c.progress + "' is not valid: thread:N needs N from 1 to 999");
    }
    c.progress_threads = std::stoi(n);
  } else if (c.progress != "explicit" && c.progress != "implicit" && c.progress != "steal") {
    throw Error("FERRY_PROGRESS='" + c.progress + "' is not valid; valid values: explicit, implicit, thread:N, steal");
  }
  // Settings of the design space this build does not implement yet are refused, never ignored.
  auto not_yet = [](const char* env, const std::string& v, std::initializer_list<const char*> implemented) {
    for (const char* ok : implemented) {
      if (v == ok) return;
    }
    throw Error(std::string(env) + "='" + v + "' is not implemented in this build yet");
  };
  not_yet("FERRY_COMPLETION", c.completion, {"cq", "cq_ms", "cq_lock", "sync"});
  not_yet("FERRY_HEADER", c.header, {"am", "sendrecv"});
  not_yet("FERRY_PROGRESS", c.progress_threads != 0 ? "thread" : c.progress, {"explicit", "implicit", "thread", "steal"});
  not_yet("FERRY_DEVICE_POLLING", c.device_polling, {"local", "random", "global"});
  require_range("FERRY_DEVICES", static_cast<std::size_t>(c.devices), 1, 64);
  require_range("FERRY_PACKET_SIZE", c.packet_size, 64, 1u << 30);
  require_range("FERRY_PACKETS", c.packets, 2, 1u << 24);
  require_range("FERRY_PREPOST", c.prepost, 1, c.packets);
  require_range("FERRY_RECV_DESCRIPTORS", c.recv_descriptors, 1, 1u << 24);
  require_range("FERRY_CQ_CAPACITY", c.cq_capacity, 2, 1u << 28);
  require_range("FERRY_MAX_TARGETS", c.max_targets, 1, 65536);
  require_range("FERRY_FRAGMENT_MAX", c.fragment_max, 0, 1u << 30);
  return c;
}

std::size_t default_cq_capacity() {
  const char* e = std::getenv("FERRY_CQ_CAPACITY");
  std::size_t v = (e != nullptr && *e != '\0') ? parse_size("FERRY_CQ_CAPACITY", e) : 65536;
  require_range("FERRY_CQ_CAPACITY", v, 2, 1u << 28);
  return v;
}

}  // namespace ferry::detail
