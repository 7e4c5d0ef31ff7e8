// pmi1.cpp — client for the PMI-1 wire protocol spoken over the inherited socket PMI_FD.
//
// This is what mpiexec.hydra and ferryrun serve. The protocol is line based: each request
// is "cmd=NAME key=value ...\n" and gets exactly one reply line, so every call is a
// synchronous round trip on one fd.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/hex.hpp"
#include "bootstrap/kinds.hpp"
#include "bootstrap/pmi1_wire.hpp"
#include "common/log.hpp"
#include "ferry/error.hpp"

namespace ferry::bootstrap::detail {

PmiReply parse_pmi_reply(std::string_view line) {
  PmiReply reply;
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  std::string* last = nullptr;
  std::size_t pos = 0;
  while (pos < line.size()) {
    while (pos < line.size() && (line[pos] == ' ' || line[pos] == '\t')) ++pos;
    if (pos >= line.size()) break;
    std::size_t end = pos;
    while (end < line.size() && line[end] != ' ' && line[end] != '\t') ++end;
    const std::string_view token = line.substr(pos, end - pos);
    pos = end;
    const std::size_t eq = token.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      if (last != nullptr) {
        last->push_back(' ');
        last->append(token);
      }
      continue;
    }
    auto [it, inserted] = reply.fields.insert_or_assign(std::string(token.substr(0, eq)),
                                                        std::string(token.substr(eq + 1)));
    (void)inserted;
    last = &it->second;
  }
  return reply;
}

namespace {

[[noreturn]] void fail(const std::string& what) { throw ferry::Error("bootstrap pmi1: " + what); }

std::optional<long long> parse_integer(std::string_view text) {
  long long v = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(first, last, v);
  if (text.empty() || ec != std::errc() || ptr != last) return std::nullopt;
  return v;
}

// Launch variables are the only place a misconfigured launcher shows up, so the message
// names the variable and quotes its value.
int env_int(const char* name, long long min, long long max, const std::string& meaning) {
  const char* raw = std::getenv(name);
  if (raw == nullptr) fail(std::string(name) + " is not set; a PMI-1 launcher sets it (the " + meaning + ")");
  const auto v = parse_integer(raw);
  if (!v || *v < min || *v > max) {
    fail(std::string(name) + "='" + raw + "' is not a valid " + meaning + " (expected an integer in [" +
         std::to_string(min) + ", " + std::to_string(max) + "])");
  }
  return static_cast<int>(*v);
}

bool valid_key_char(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u > 0x20 && u < 0x7f && c != '=';
}

class Pmi1 final : public Bootstrap {
 public:
  Pmi1() {
    fd_ = env_int("PMI_FD", 0, std::numeric_limits<int>::max(), "file descriptor number");
    if (::fcntl(fd_, F_GETFD) == -1) {
      fail("PMI_FD='" + std::to_string(fd_) + "' is not an open file descriptor (" +
           std::strerror(errno) + "); was this process started by a PMI-1 launcher?");
    }
    size_ = env_int("PMI_SIZE", 1, std::numeric_limits<int>::max(), "job size");
    rank_ = env_int("PMI_RANK", 0, size_ - 1, "rank for PMI_SIZE=" + std::to_string(size_));

    call("cmd=init pmi_version=1 pmi_subversion=1", "response_to_init");
    const PmiReply maxes = call("cmd=get_maxes", "maxes");
    keylen_max_ = positive_field(maxes, "keylen_max");
    vallen_max_ = positive_field(maxes, "vallen_max");
    // One byte of each limit goes to the terminating NUL in C servers; below 4 there is no
    // room for the one-character tag plus one hex byte.
    if (vallen_max_ < 4) fail("launcher reports vallen_max=" + std::to_string(vallen_max_) + ", too small to carry values");
    const PmiReply name = call("cmd=get_my_kvsname", "my_kvsname");
    const auto kvs = name.get("kvsname");
    if (!kvs || kvs->empty()) fail("reply to get_my_kvsname carries no kvsname");
    kvsname_ = std::string(*kvs);
  }

  ~Pmi1() override {
    if (!aborted_) {
      try {
        call("cmd=finalize", "finalize_ack");
      } catch (...) {
        // A launcher that has already gone away cannot be told anything more.
      }
    }
    ::close(fd_);
  }

  Pmi1(const Pmi1&) = delete;
  Pmi1& operator=(const Pmi1&) = delete;

  [[nodiscard]] int rank() const override { return rank_; }
  [[nodiscard]] int size() const override { return size_; }
  [[nodiscard]] std::string_view kind() const override { return "pmi1"; }

  void put(std::string_view key, std::string_view value) override {
    check_key("put", key);
    const std::string base = std::string(key) + "-" + std::to_string(rank_);
    const std::string hex = hex_encode(value);
    const std::size_t room = vallen_max_ - 1;
    if (1 + hex.size() <= room) {
      check_key_length("put", key, base);
      put_raw(base, "v" + hex);
    } else {
      // Parts are bounded by vallen_max only; the head entry names how many there are, so
      // get() never has to probe for the end.
      const std::size_t chunk = room & ~std::size_t{1};
      const std::size_t parts = (hex.size() + chunk - 1) / chunk;
      if (parts > static_cast<std::size_t>(kMaxParts)) {
        fail("put: key '" + std::string(key) + "': a value of " + std::to_string(value.size()) + " bytes needs " +
             std::to_string(parts) + " parts of this launcher's vallen_max=" + std::to_string(vallen_max_) +
             "; at most " + std::to_string(kMaxParts) + " are read back");
      }
      check_key_length("put", key, base + "-p" + std::to_string(parts - 1));
      for (std::size_t i = 0; i < parts; ++i) {
        put_raw(base + "-p" + std::to_string(i), hex.substr(i * chunk, chunk));
      }
      put_raw(base, "p" + std::to_string(parts));
    }
    // Our own puts are readable before the next fence, as they are with every other kind.
    own_.insert_or_assign(std::string(key), std::string(value));
  }

  void fence() override { call("cmd=barrier_in", "barrier_out"); }
  void barrier() override { call("cmd=barrier_in", "barrier_out"); }

  [[nodiscard]] std::string get(int rank, std::string_view key) override {
    if (rank < 0 || rank >= size_) {
      fail("get(rank " + std::to_string(rank) + ", key '" + std::string(key) + "'): rank is out of range [0, " +
           std::to_string(size_) + ")");
    }
    check_key("get", key);
    if (rank == rank_) {
      auto it = own_.find(key);
      if (it != own_.end()) return it->second;
    }
    const std::string where = "get(rank " + std::to_string(rank) + ", key '" + std::string(key) + "')";
    const std::string base = std::string(key) + "-" + std::to_string(rank);
    const std::string head = get_raw(where, base);
    std::string hex;
    if (!head.empty() && head[0] == 'v') {
      hex = head.substr(1);
    } else if (!head.empty() && head[0] == 'p') {
      // Bounded before use: a launcher's bytes must not make this rank ask for parts forever.
      const auto parts = parse_integer(std::string_view(head).substr(1));
      if (!parts || *parts < 1 || *parts > kMaxParts) {
        fail(where + ": malformed part count '" + head.substr(0, 32) + "' (expected 1 to " + std::to_string(kMaxParts) + ")");
      }
      for (long long i = 0; i < *parts; ++i) hex += get_raw(where, base + "-p" + std::to_string(i));
    } else {
      fail(where + ": value '" + head.substr(0, 32) + "' was not written by ferry");
    }
    auto bytes = hex_decode(hex);
    if (!bytes) fail(where + ": value is not valid hex");
    return std::move(*bytes);
  }

  void abort(int code, std::string_view message) noexcept override {
    aborted_ = true;
    // PMI-1 has no field for the reason, so it goes to stderr, which launchers forward.
    // Always written, whatever FERRY_LOG says: it is the job's last word on why it ends.
    ::ferry::detail::log_line(::ferry::detail::LogLevel::error, rank_, -1, "aborting (exit code %d): %.*s", code, static_cast<int>(message.size()),
                 message.data());
    try {
      send_line("cmd=abort exitcode=" + std::to_string(code));
    } catch (...) {
    }
  }

 private:
  // The most parts one value may span (a value of kMaxParts x vallen_max hex characters).
  static constexpr long long kMaxParts = 65536;

  std::size_t positive_field(const PmiReply& reply, std::string_view name) {
    const auto raw = reply.get(name);
    const auto v = raw ? parse_integer(*raw) : std::nullopt;
    if (!v || *v <= 0) {
      fail("reply to get_maxes has no valid " + std::string(name) + " (got '" + std::string(raw.value_or("")) + "')");
    }
    return static_cast<std::size_t>(*v);
  }

  static void check_key(const char* op, std::string_view key) {
    if (key.empty()) fail(std::string(op) + ": the key is empty");
    for (char c : key) {
      if (!valid_key_char(c)) {
        fail(std::string(op) + ": key '" + std::string(key) +
             "' contains a blank, '=' or a non-printable character, which PMI-1 cannot carry");
      }
    }
  }

  void check_key_length(const char* op, std::string_view key, const std::string& longest) const {
    if (longest.size() + 1 > keylen_max_) {
      fail(std::string(op) + ": key '" + std::string(key) + "' is too long: '" + longest + "' has " +
           std::to_string(longest.size()) + " characters and the launcher allows " + std::to_string(keylen_max_ - 1));
    }
  }

  void put_raw(const std::string& key, const std::string& value) {
    call("cmd=put kvsname=" + kvsname_ + " key=" + key + " value=" + value, "put_result");
  }

  std::string get_raw(const std::string& where, const std::string& key) {
    send_line("cmd=get kvsname=" + kvsname_ + " key=" + key);
    const PmiReply reply = expect(read_line(), "get_result", false);
    const auto rc = reply.get("rc");
    if (!rc || *rc != "0") {
      fail(where + ": not found (launcher replied rc=" + std::string(rc.value_or("?")) +
           (reply.get("msg") ? " msg=" + std::string(*reply.get("msg")) : "") + " for '" + key + "')");
    }
    const auto value = reply.get("value");
    if (!value) fail(where + ": reply to get of '" + key + "' has no value");
    return std::string(*value);
  }

  PmiReply call(const std::string& request, std::string_view expect_cmd) {
    send_line(request);
    return expect(read_line(), expect_cmd, true);
  }

  PmiReply expect(const std::string& line, std::string_view expect_cmd, bool check_rc) {
    PmiReply reply = parse_pmi_reply(line);
    const auto cmd = reply.get("cmd");
    if (!cmd || *cmd != expect_cmd) {
      fail("expected a reply with cmd=" + std::string(expect_cmd) + ", got '" + line + "'");
    }
    // Launchers omit rc on some replies (barrier_out, finalize_ack); absent means success.
    const auto rc = reply.get("rc");
    if (check_rc && rc && *rc != "0") {
      fail("launcher failed cmd=" + std::string(expect_cmd) + ": '" + line + "'");
    }
    return reply;
  }

  void send_line(std::string line) {
    line.push_back('\n');
    std::size_t done = 0;
    while (done < line.size()) {
      // MSG_NOSIGNAL turns a vanished launcher into EPIPE instead of killing us with SIGPIPE.
      ssize_t n = ::send(fd_, line.data() + done, line.size() - done, MSG_NOSIGNAL);
      if (n < 0 && errno == ENOTSOCK) n = ::write(fd_, line.data() + done, line.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EPIPE || errno == ECONNRESET) closed();
        fail("write to PMI_FD=" + std::to_string(fd_) + " failed: " + std::strerror(errno));
      }
      done += static_cast<std::size_t>(n);
    }
  }

  std::string read_line() {
    for (;;) {
      const std::size_t nl = inbuf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = inbuf_.substr(0, nl);
        inbuf_.erase(0, nl + 1);
        return line;
      }
      char buf[4096];
      const ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n == 0) closed();
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == ECONNRESET) closed();
        fail("read from PMI_FD=" + std::to_string(fd_) + " failed: " + std::strerror(errno));
      }
      inbuf_.append(buf, static_cast<std::size_t>(n));
    }
  }

  [[noreturn]] void closed() const {
    fail("the launcher closed the PMI connection (PMI_FD=" + std::to_string(fd_) + ")");
  }

  int fd_ = -1;
  int rank_ = 0;
  int size_ = 1;
  std::size_t keylen_max_ = 0;
  std::size_t vallen_max_ = 0;
  std::string kvsname_;
  std::string inbuf_;
  std::map<std::string, std::string, std::less<>> own_;
  bool aborted_ = false;
};

}  // namespace

std::unique_ptr<Bootstrap> make_pmi1() { return std::make_unique<Pmi1>(); }

}  // namespace ferry::bootstrap::detail
