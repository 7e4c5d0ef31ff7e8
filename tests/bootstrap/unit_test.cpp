// unit_test.cpp — single-process tests: value encoding, the PMI-1 reply parser, error
// messages for broken launch environments, and the PMI-1 client against an in-process fake
// launcher (small vallen_max to force splitting, replies delivered in fragments).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/hex.hpp"
#include "bootstrap/pmi1_wire.hpp"
#include "ferry/error.hpp"

using namespace std::string_literals;

namespace {

using ferry::bootstrap::make_bootstrap;
using ferry::bootstrap::detail::hex_decode;
using ferry::bootstrap::detail::hex_encode;
using ferry::bootstrap::detail::parse_pmi_reply;

std::string all_bytes() {
  std::string s;
  for (int i = 0; i < 256; ++i) s.push_back(static_cast<char>(i));
  return s;
}

// Message of the ferry::Error that f throws; fails the test if it throws nothing.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ferry::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected ferry::Error";
  return {};
}

// Sets launch variables for one test and puts back what was there, so these tests can run
// inside a real launched job without disturbing it.
class ScopedEnv {
 public:
  ScopedEnv& set(const char* name, const std::string& value) {
    remember(name);
    ::setenv(name, value.c_str(), 1);
    return *this;
  }
  ScopedEnv& unset(const char* name) {
    remember(name);
    ::unsetenv(name);
    return *this;
  }
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) {
        ::setenv(it->first.c_str(), it->second->c_str(), 1);
      } else {
        ::unsetenv(it->first.c_str());
      }
    }
  }

 private:
  void remember(const char* name) {
    const char* old = std::getenv(name);
    saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST(Hex, RoundTripsEveryByte) {
  const std::string bytes = all_bytes();
  const std::string hex = hex_encode(bytes);
  ASSERT_EQ(hex.size(), 512u);
  EXPECT_EQ(hex.substr(0, 6), "000102");
  EXPECT_EQ(hex.substr(hex.size() - 4), "feff");
  EXPECT_EQ(hex.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(hex_decode(hex), bytes);
}

TEST(Hex, EmptyAndUpperCase) {
  EXPECT_EQ(hex_encode(""), "");
  EXPECT_EQ(hex_decode(""), std::string());
  EXPECT_EQ(hex_decode("DEADbeef"), std::string("\xde\xad\xbe\xef"));
}

TEST(Hex, RejectsMalformed) {
  EXPECT_FALSE(hex_decode("abc"));
  EXPECT_FALSE(hex_decode("zz"));
  EXPECT_FALSE(hex_decode("0g"));
  EXPECT_FALSE(hex_decode("a "));
}

TEST(PmiReply, FieldsInAnyOrderWithExtras) {
  const auto r = parse_pmi_reply("cmd=get_result rc=0 msg=success value=00ff\n");
  EXPECT_EQ(r.get("cmd"), "get_result");
  EXPECT_EQ(r.get("rc"), "0");
  EXPECT_EQ(r.get("value"), "00ff");
  EXPECT_FALSE(r.get("missing"));
  const auto s = parse_pmi_reply("value=ab   rc=0\tcmd=get_result foo=bar\r\n");
  EXPECT_EQ(s.get("cmd"), "get_result");
  EXPECT_EQ(s.get("value"), "ab");
  EXPECT_EQ(s.get("foo"), "bar");
}

TEST(PmiReply, EdgeCases) {
  EXPECT_TRUE(parse_pmi_reply("").fields.empty());
  EXPECT_TRUE(parse_pmi_reply("   \n").fields.empty());
  // Split at the first '=' only; an empty value is still a field.
  const auto r = parse_pmi_reply("cmd=x a==b empty=");
  EXPECT_EQ(r.get("a"), "=b");
  EXPECT_EQ(r.get("empty"), "");
  // Free text after msg= stays with msg.
  const auto m = parse_pmi_reply("cmd=get_result rc=-1 msg=key not found");
  EXPECT_EQ(m.get("msg"), "key not found");
  EXPECT_EQ(m.get("rc"), "-1");
  // A stray word before any field, or "=x", is ignored.
  const auto j = parse_pmi_reply("junk =x cmd=barrier_out");
  EXPECT_EQ(j.get("cmd"), "barrier_out");
  EXPECT_EQ(j.fields.size(), 1u);
}

TEST(Factory, UnknownKindNamesItAndTheValidOnes) {
  const std::string what = error_of([] { (void)make_bootstrap("bogus"); });
  EXPECT_NE(what.find("FERRY_BOOTSTRAP='bogus' is not a bootstrap; valid: auto, single, pmi1, pmix"),
            std::string::npos)
      << what;
}

TEST(Factory, DetectFollowsEnvironment) {
  ScopedEnv env;
  env.unset("PMIX_RANK").unset("PMI_FD");
  EXPECT_EQ(ferry::bootstrap::detect_bootstrap_kind(), "single");
  env.set("PMI_FD", "9");
  EXPECT_EQ(ferry::bootstrap::detect_bootstrap_kind(), "pmi1");
  env.set("PMIX_RANK", "0");
#ifdef FERRY_HAVE_PMIX
  EXPECT_EQ(ferry::bootstrap::detect_bootstrap_kind(), "pmix");
#else
  EXPECT_EQ(ferry::bootstrap::detect_bootstrap_kind(), "pmi1");
#endif
}

#ifndef FERRY_HAVE_PMIX
TEST(Factory, PmixWithoutSupportIsAClearError) {
  const std::string what = error_of([] { (void)make_bootstrap("pmix"); });
  EXPECT_NE(what.find("no PMIx support"), std::string::npos) << what;
}
#endif

TEST(Single, PutGetWithoutFence) {
  ScopedEnv env;
  env.unset("PMIX_RANK").unset("PMI_FD");
  auto b = make_bootstrap("auto");
  EXPECT_EQ(b->kind(), "single");
  EXPECT_EQ(b->rank(), 0);
  EXPECT_EQ(b->size(), 1);
  b->put("k", all_bytes());
  EXPECT_EQ(b->get(0, "k"), all_bytes());
  b->fence();
  b->barrier();
  b->put("k", "again");
  EXPECT_EQ(b->get(0, "k"), "again");
  EXPECT_NE(error_of([&] { (void)b->get(0, "nope"); }).find("'nope'"), std::string::npos);
  EXPECT_THROW((void)b->get(1, "k"), ferry::Error);
}

TEST(Pmi1Env, FdNotANumber) {
  ScopedEnv env;
  env.set("PMI_FD", "notanumber").set("PMI_RANK", "0").set("PMI_SIZE", "1");
  const std::string what = error_of([] { (void)make_bootstrap("pmi1"); });
  EXPECT_NE(what.find("PMI_FD='notanumber'"), std::string::npos) << what;
}

TEST(Pmi1Env, FdClosed) {
  const int fd = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(fd, 0);
  ::close(fd);
  ScopedEnv env;
  env.set("PMI_FD", std::to_string(fd)).set("PMI_RANK", "0").set("PMI_SIZE", "1");
  const std::string what = error_of([] { (void)make_bootstrap("pmi1"); });
  EXPECT_NE(what.find("PMI_FD='" + std::to_string(fd) + "'"), std::string::npos) << what;
  EXPECT_NE(what.find("not an open file descriptor"), std::string::npos) << what;
}

TEST(Pmi1Env, MissingOrBadRankAndSize) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  {
    ScopedEnv env;
    env.set("PMI_FD", std::to_string(sv[0])).set("PMI_SIZE", "4").unset("PMI_RANK");
    const std::string what = error_of([] { (void)make_bootstrap("pmi1"); });
    EXPECT_NE(what.find("PMI_RANK is not set"), std::string::npos) << what;
  }
  {
    ScopedEnv env;
    env.set("PMI_FD", std::to_string(sv[0])).set("PMI_SIZE", "4").set("PMI_RANK", "4");
    const std::string what = error_of([] { (void)make_bootstrap("pmi1"); });
    EXPECT_NE(what.find("PMI_RANK='4'"), std::string::npos) << what;
  }
  {
    ScopedEnv env;
    env.set("PMI_FD", std::to_string(sv[0])).set("PMI_SIZE", "2x").set("PMI_RANK", "0");
    const std::string what = error_of([] { (void)make_bootstrap("pmi1"); });
    EXPECT_NE(what.find("PMI_SIZE='2x'"), std::string::npos) << what;
  }
  ::close(sv[0]);
  ::close(sv[1]);
}

// A PMI-1 launcher in a thread per connection, sharing one key-value store. Barriers return
// at once: the tests drive all "ranks" from one thread, one call at a time.
class FakeLauncher {
 public:
  struct Options {
    std::size_t vallen_max = 40;
    std::size_t keylen_max = 64;
    int close_after = -1;  // close the connection after this many requests
  };

  explicit FakeLauncher(Options opt) : opt_(opt) {}
  ~FakeLauncher() { join(); }

  // Waits until every connection has been closed by either side.
  void join() {
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

  // The client's end of a new connection.
  int connect() {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return -1;
    threads_.emplace_back([this, fd = sv[1]] { serve(fd); });
    return sv[0];
  }

  std::mutex mu;
  std::map<std::string, std::string> store;
  std::vector<std::string> requests;
  std::size_t longest_value = 0;

 private:
  void reply(int fd, const std::string& line) {
    // Two writes with a pause between, so the client sees a partial line.
    const std::string full = line + "\n";
    const std::size_t half = full.size() / 2;
    (void)!::write(fd, full.data(), half);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    (void)!::write(fd, full.data() + half, full.size() - half);
  }

  void serve(int fd) {
    std::string buf;
    int handled = 0;
    for (;;) {
      std::size_t nl;
      while ((nl = buf.find('\n')) == std::string::npos) {
        char tmp[512];
        const ssize_t n = ::read(fd, tmp, sizeof tmp);
        if (n <= 0) {
          ::close(fd);
          return;
        }
        buf.append(tmp, static_cast<std::size_t>(n));
      }
      const std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      if (opt_.close_after >= 0 && handled++ >= opt_.close_after) {
        ::close(fd);
        return;
      }
      const auto req = parse_pmi_reply(line);
      const std::string cmd(req.get("cmd").value_or(""));
      std::lock_guard lock(mu);
      requests.push_back(line);
      if (cmd == "init") {
        reply(fd, "cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=1");
      } else if (cmd == "get_maxes") {
        reply(fd, "cmd=maxes kvsname_max=256 keylen_max=" + std::to_string(opt_.keylen_max) +
                      " vallen_max=" + std::to_string(opt_.vallen_max) + " extra=field");
      } else if (cmd == "get_my_kvsname") {
        reply(fd, "rc=0 kvsname=fake_kvs cmd=my_kvsname");
      } else if (cmd == "put") {
        const std::string key(req.get("key").value_or(""));
        const std::string value(req.get("value").value_or(""));
        longest_value = std::max(longest_value, value.size());
        if (key.size() >= opt_.keylen_max || value.size() >= opt_.vallen_max) {
          reply(fd, "cmd=put_result rc=-1 msg=too_long");
        } else {
          store[key] = value;
          reply(fd, "cmd=put_result rc=0 msg=success");
        }
      } else if (cmd == "get") {
        const std::string key(req.get("key").value_or(""));
        auto it = store.find(key);
        if (it == store.end()) {
          reply(fd, "cmd=get_result rc=-1 msg=key_" + key + "_not_found value=unknown");
        } else {
          reply(fd, "cmd=get_result msg=success value=" + it->second + " rc=0");
        }
      } else if (cmd == "barrier_in") {
        reply(fd, "cmd=barrier_out");
      } else if (cmd == "finalize") {
        reply(fd, "cmd=finalize_ack");
        ::close(fd);
        return;
      } else if (cmd == "abort") {
        ::close(fd);
        return;
      } else {
        reply(fd, "cmd=" + cmd + "_result rc=-1 msg=unknown_command");
      }
    }
  }

  Options opt_;
  std::vector<std::thread> threads_;
};

std::unique_ptr<ferry::bootstrap::Bootstrap> connect_rank(FakeLauncher& fake, int rank, int size) {
  ScopedEnv env;
  env.set("PMI_FD", std::to_string(fake.connect()))
      .set("PMI_RANK", std::to_string(rank))
      .set("PMI_SIZE", std::to_string(size));
  return make_bootstrap("pmi1");
}

TEST(Pmi1Fake, SplitsValuesAcrossParts) {
  FakeLauncher fake({});
  auto r0 = connect_rank(fake, 0, 2);
  auto r1 = connect_rank(fake, 1, 2);
  EXPECT_EQ(r0->kind(), "pmi1");
  EXPECT_EQ(r1->rank(), 1);
  EXPECT_EQ(r1->size(), 2);

  const std::string big = all_bytes() + all_bytes();
  r0->put("addr", big);
  r1->put("addr", "short\n= \0"s);
  r1->put("empty", "");
  // Exactly fills one entry: 'v' + 2*19 hex = 39 characters, the most below vallen_max 40.
  r1->put("edge", std::string(19, 'x'));
  r1->put("edge2", std::string(20, 'y'));
  r0->fence();
  r1->fence();
  EXPECT_EQ(r1->get(0, "addr"), big);
  EXPECT_EQ(r0->get(1, "addr"), "short\n= \0"s);
  EXPECT_EQ(r0->get(1, "empty"), "");
  EXPECT_EQ(r0->get(1, "edge"), std::string(19, 'x'));
  EXPECT_EQ(r0->get(1, "edge2"), std::string(20, 'y'));
  r0->barrier();

  std::lock_guard lock(fake.mu);
  EXPECT_LT(fake.longest_value, 40u);
  EXPECT_EQ(fake.store.count("addr-0"), 1u);
  EXPECT_EQ(fake.store.count("addr-0-p0"), 1u);
  EXPECT_EQ(fake.store.count("edge-1-p0"), 0u);
  EXPECT_EQ(fake.store.count("edge2-1-p0"), 1u);
}

// A part count from the launcher is bounded before the client asks for that many parts.
TEST(Pmi1Fake, AHugePartCountFromTheLauncherIsRefused) {
  FakeLauncher fake({});
  auto r0 = connect_rank(fake, 0, 2);
  {
    std::lock_guard lock(fake.mu);
    fake.store["addr-1"] = "p999999999999";
    fake.store["zero-1"] = "p0";
  }
  std::string what = error_of([&] { (void)r0->get(1, "addr"); });
  EXPECT_NE(what.find("malformed part count 'p999999999999' (expected 1 to 65536)"), std::string::npos) << what;
  what = error_of([&] { (void)r0->get(1, "zero"); });
  EXPECT_NE(what.find("malformed part count 'p0'"), std::string::npos) << what;
  std::lock_guard lock(fake.mu);
  EXPECT_LT(fake.requests.size(), 20u) << "the client asked for parts it had no bound on";
}

// A value that would need more parts than a reader accepts is refused at put, by name.
TEST(Pmi1Fake, AValueBeyondThePartBoundIsRefusedAtPut) {
  FakeLauncher fake({.vallen_max = 8});  // 6 hex characters (3 bytes) per part
  auto r0 = connect_rank(fake, 0, 1);
  const std::string what = error_of([&] { r0->put("big", std::string(3 * 65536 + 1, 'z')); });
  EXPECT_NE(what.find("key 'big'"), std::string::npos) << what;
  EXPECT_NE(what.find("at most 65536 are read back"), std::string::npos) << what;
}

TEST(Pmi1Fake, MissingKeyAndBadKeys) {
  FakeLauncher fake({});
  auto r0 = connect_rank(fake, 0, 2);
  const std::string what = error_of([&] { (void)r0->get(1, "absent"); });
  EXPECT_NE(what.find("bootstrap pmi1"), std::string::npos) << what;
  EXPECT_NE(what.find("'absent'"), std::string::npos) << what;
  EXPECT_THROW(r0->put("has space", "x"), ferry::Error);
  EXPECT_THROW(r0->put("a=b", "x"), ferry::Error);
  EXPECT_THROW(r0->put("", "x"), ferry::Error);
  const std::string too_long = error_of([&] { r0->put(std::string(70, 'k'), "x"); });
  EXPECT_NE(too_long.find("too long"), std::string::npos) << too_long;
  EXPECT_THROW((void)r0->get(2, "absent"), ferry::Error);
}

TEST(Pmi1Fake, FinalizeOnDestruction) {
  FakeLauncher fake({});
  connect_rank(fake, 0, 1).reset();
  fake.join();
  std::lock_guard lock(fake.mu);
  ASSERT_FALSE(fake.requests.empty());
  EXPECT_EQ(fake.requests.front(), "cmd=init pmi_version=1 pmi_subversion=1");
  EXPECT_EQ(fake.requests.back(), "cmd=finalize");
}

TEST(Pmi1Fake, AbortSkipsFinalize) {
  FakeLauncher fake({});
  auto r0 = connect_rank(fake, 0, 1);
  r0->abort(3, "test abort, ignore this line");
  r0.reset();
  fake.join();
  std::lock_guard lock(fake.mu);
  EXPECT_EQ(fake.requests.back(), "cmd=abort exitcode=3");
}

TEST(Pmi1Fake, LauncherClosingIsAnError) {
  FakeLauncher fake({.close_after = 1});
  const int fd = fake.connect();
  ScopedEnv env;
  env.set("PMI_FD", std::to_string(fd)).set("PMI_RANK", "0").set("PMI_SIZE", "1");
  const std::string what = error_of([] { (void)make_bootstrap("pmi1"); });
  EXPECT_NE(what.find("the launcher closed the PMI connection (PMI_FD=" + std::to_string(fd) + ")"),
            std::string::npos)
      << what;
  ::close(fd);
}

TEST(Pmi1Fake, LauncherClosingMidJob) {
  FakeLauncher fake({.close_after = 3});
  auto r0 = connect_rank(fake, 0, 1);
  const std::string what = error_of([&] { r0->fence(); });
  EXPECT_NE(what.find("closed the PMI connection"), std::string::npos) << what;
  // A later call fails the same way rather than raising SIGPIPE.
  EXPECT_THROW(r0->barrier(), ferry::Error);
}

}  // namespace
