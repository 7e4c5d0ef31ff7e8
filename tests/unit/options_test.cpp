// options_test.cpp — the option table, size parsing and resolution (explicit > env > default).
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "ferry/error.hpp"
#include "ferry/options.hpp"

namespace {

using ferry::detail::parse_size;
using ferry::detail::resolve_config;

// What a call's ferry::Error said, or nothing if it did not throw.
template <class F>
std::optional<std::string> error_of(F&& f) {
  try {
    f();
  } catch (const ferry::Error& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// --- parse_size -----------------------------------------------------------------------------

TEST(ParseSize, AcceptsNumbersWithUnitSuffixes) {
  const std::pair<const char*, std::size_t> cases[] = {
      {"0", 0},
      {"4096", 4096},
      {"8k", 8 << 10},
      {"8K", 8 << 10},
      {"8kB", 8 << 10},
      {"64KiB", 64 << 10},
      {"1M", 1 << 20},
      {"3m", 3 << 20},
      {"1MiB", 1 << 20},
      {"2g", std::size_t{2} << 30},
      {"1GiB", std::size_t{1} << 30},
      {"16GB", std::size_t{16} << 30},
      {"7B", 7},
      {"007", 7},
      {"18446744073709551615", 18446744073709551615ull},  // the largest value that fits
  };
  for (const auto& [text, bytes] : cases) {
    try {
      EXPECT_EQ(parse_size("FERRY_X", text), bytes) << text;
    } catch (const ferry::Error& e) {
      ADD_FAILURE() << "'" << text << "' was rejected: " << e.what();
    }
  }
}

// Every rejection is a ferry::Error naming the setting and quoting the bad text, so the user
// can find which variable to fix.
TEST(ParseSize, RejectsMalformedTextNamingVariableAndValue) {
  for (const char* bad : {"", "abc", "-1", "12x", "99999999999999999999", "1T", "1.5M", " 8k", "8 k", "0x10",
                          "k", "8kk", "+8", "17179869184G" /* 2^64 after scaling */}) {
    const std::optional<std::string> what = error_of([&] { (void)parse_size("FERRY_SOME_SIZE", bad); });
    ASSERT_TRUE(what.has_value()) << "'" << bad << "' was accepted";
    EXPECT_TRUE(contains(*what, "FERRY_SOME_SIZE")) << *what;
    EXPECT_TRUE(contains(*what, std::string("'") + bad + "'")) << *what;
    EXPECT_EQ(what->rfind("ferry: ", 0), 0u) << "ferry::Error prefixes its messages: " << *what;
  }
}

// --- resolve_config and the environment -----------------------------------------------------

// Clears every FERRY_* option variable (and restores what the caller's environment had), so
// tests neither see the developer's settings nor leak their own into later tests.
class Env : public testing::Test {
 protected:
  void SetUp() override {
    for (const ferry::OptionInfo& o : ferry::option_table()) {
      if (const char* v = std::getenv(o.env)) saved_[o.env] = v;
      ::unsetenv(o.env);
    }
  }
  void TearDown() override {
    for (const ferry::OptionInfo& o : ferry::option_table()) ::unsetenv(o.env);
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }
  static void set(const char* name, const char* value) { ASSERT_EQ(::setenv(name, value, 1), 0); }

 private:
  std::map<std::string, std::string> saved_;
};

TEST_F(Env, DefaultsMatchTheOptionTable) {
  const ferry::detail::Config c = resolve_config({});
  EXPECT_EQ(c.bootstrap, "auto");
  EXPECT_EQ(c.provider, "auto");
  EXPECT_EQ(c.devices, 1);
  EXPECT_EQ(c.packet_size, 8192u);
  EXPECT_EQ(c.packets, 4096u);
  EXPECT_EQ(c.prepost, 256u);
  EXPECT_EQ(c.send_credits, 0u);
  EXPECT_EQ(c.cq_capacity, 65536u);
  EXPECT_EQ(c.max_targets, 4096u);
  EXPECT_EQ(c.rdv_threshold, 0u);
  EXPECT_EQ(c.fragment, "auto");
  EXPECT_EQ(c.fragment_max, 16384u);
  // The defaults are written twice (the table, for ferry-info, and resolve_config): they
  // must agree, or ferry-info would print a value ferry does not use.
  const std::map<std::string, std::size_t> resolved = {
      {"devices", static_cast<std::size_t>(c.devices)}, {"packet_size", c.packet_size},
      {"packets", c.packets},         {"prepost", c.prepost}, {"recv_descriptors", c.recv_descriptors},
      {"send_credits", c.send_credits}, {"cq_capacity", c.cq_capacity},
      {"max_targets", c.max_targets}, {"rdv_threshold", c.rdv_threshold}, {"fragment_max", c.fragment_max}};
  for (const ferry::OptionInfo& o : ferry::option_table()) {
    auto it = resolved.find(o.name);
    if (it == resolved.end()) {
      // Text options, and the two ferry::amt reads itself (its defaults: ferry, 1 thread).
      const std::map<std::string, std::string> text = {
          {"bootstrap", "auto"}, {"provider", "auto"}, {"parcelport", "ferry"}, {"amt_threads", "1"},
          {"lock_model", "lockless"}, {"completion", "cq"}, {"header", "am"}, {"progress", "explicit"},
          {"device_polling", "local"}, {"parcel_queues", "shared"}, {"fragment", "auto"}};
      ASSERT_TRUE(text.count(o.name)) << o.name << " has no checked default";
      EXPECT_EQ(o.default_value, text.at(o.name)) << o.name;
      continue;
    }
    EXPECT_EQ(parse_size(o.env, o.default_value), it->second) << o.name;
  }
  EXPECT_EQ(ferry::detail::default_cq_capacity(), 65536u);
}

TEST_F(Env, EnvironmentValuesAreUsed) {
  set("FERRY_BOOTSTRAP", "single");
  set("FERRY_PROVIDER", "tcp");
  set("FERRY_DEVICES", "4");
  set("FERRY_PACKET_SIZE", "16k");
  set("FERRY_PACKETS", "1024");
  set("FERRY_PREPOST", "64");
  set("FERRY_SEND_CREDITS", "32");
  set("FERRY_CQ_CAPACITY", "1M");
  set("FERRY_MAX_TARGETS", "16");
  set("FERRY_RDV_THRESHOLD", "4KiB");
  const ferry::detail::Config c = resolve_config({});
  EXPECT_EQ(c.bootstrap, "single");
  EXPECT_EQ(c.provider, "tcp");
  EXPECT_EQ(c.devices, 4);
  EXPECT_EQ(c.packet_size, 16384u);
  EXPECT_EQ(c.packets, 1024u);
  EXPECT_EQ(c.prepost, 64u);
  EXPECT_EQ(c.send_credits, 32u);
  EXPECT_EQ(c.cq_capacity, 1u << 20);
  EXPECT_EQ(c.max_targets, 16u);
  EXPECT_EQ(c.rdv_threshold, 4096u);
  EXPECT_EQ(ferry::detail::default_cq_capacity(), 1u << 20);
}

TEST_F(Env, FragmentIsAutoOrOffAndAnythingElseListsBoth) {
  set("FERRY_FRAGMENT", "off");
  EXPECT_EQ(resolve_config({}).fragment, "off");
  set("FERRY_FRAGMENT", "always");
  const std::optional<std::string> what = error_of([] { (void)resolve_config({}); });
  ASSERT_TRUE(what.has_value());
  EXPECT_TRUE(contains(*what, "FERRY_FRAGMENT='always'")) << *what;
  EXPECT_TRUE(contains(*what, "auto, off")) << *what;
}

TEST_F(Env, ParcelQueuesIsSharedOrDeviceAndAnythingElseListsBoth) {
  EXPECT_EQ(resolve_config({}).parcel_queues, "shared");
  set("FERRY_PARCEL_QUEUES", "device");
  EXPECT_EQ(resolve_config({}).parcel_queues, "device");
  set("FERRY_PARCEL_QUEUES", "per_thread");
  const std::optional<std::string> what = error_of([] { (void)resolve_config({}); });
  ASSERT_TRUE(what.has_value());
  EXPECT_TRUE(contains(*what, "FERRY_PARCEL_QUEUES='per_thread'")) << *what;
  EXPECT_TRUE(contains(*what, "shared, device")) << *what;
}

// An empty variable counts as unset (`FERRY_PACKETS= prog` should not be an error).
TEST_F(Env, EmptyVariableMeansUnset) {
  set("FERRY_PACKETS", "");
  set("FERRY_BOOTSTRAP", "");
  const ferry::detail::Config c = resolve_config({});
  EXPECT_EQ(c.packets, 4096u);
  EXPECT_EQ(c.bootstrap, "auto");
}

TEST_F(Env, MalformedEnvironmentValueNamesVariableAndValue) {
  set("FERRY_PACKET_SIZE", "abc");
  const std::optional<std::string> what = error_of([] { (void)resolve_config({}); });
  ASSERT_TRUE(what.has_value());
  EXPECT_TRUE(contains(*what, "FERRY_PACKET_SIZE")) << *what;
  EXPECT_TRUE(contains(*what, "'abc'")) << *what;
}

TEST_F(Env, EveryMalformedSizeVariableIsReported) {
  for (const char* var : {"FERRY_DEVICES", "FERRY_PACKET_SIZE", "FERRY_PACKETS", "FERRY_PREPOST",
                          "FERRY_SEND_CREDITS", "FERRY_CQ_CAPACITY", "FERRY_MAX_TARGETS", "FERRY_RDV_THRESHOLD",
                          "FERRY_FRAGMENT_MAX"}) {
    set(var, "12x");
    const std::optional<std::string> what = error_of([] { (void)resolve_config({}); });
    ASSERT_TRUE(what.has_value()) << var;
    EXPECT_TRUE(contains(*what, var)) << *what;
    EXPECT_TRUE(contains(*what, "'12x'")) << *what;
    ::unsetenv(var);
  }
}

TEST_F(Env, OutOfRangeValuesNameVariableAndRange) {
  struct Case {
    const char* var;
    const char* value;
  };
  for (const Case c : {Case{"FERRY_DEVICES", "0"}, Case{"FERRY_DEVICES", "65"}, Case{"FERRY_PACKET_SIZE", "32"},
                       Case{"FERRY_PACKET_SIZE", "2G"}, Case{"FERRY_PACKETS", "1"}, Case{"FERRY_PREPOST", "5000"},
                       Case{"FERRY_CQ_CAPACITY", "1"}, Case{"FERRY_MAX_TARGETS", "65537"},
                       Case{"FERRY_FRAGMENT_MAX", "2G"}}) {
    set(c.var, c.value);
    const std::optional<std::string> what = error_of([] { (void)resolve_config({}); });
    ASSERT_TRUE(what.has_value()) << c.var << "=" << c.value << " was accepted";
    EXPECT_TRUE(contains(*what, c.var)) << *what;
    EXPECT_TRUE(contains(*what, "out of range")) << *what;
    ::unsetenv(c.var);
  }
  // The edges themselves are accepted.
  set("FERRY_DEVICES", "64");
  set("FERRY_PACKET_SIZE", "64");
  set("FERRY_PACKETS", "2");
  set("FERRY_PREPOST", "2");  // prepost may equal packets
  set("FERRY_CQ_CAPACITY", "2");
  set("FERRY_MAX_TARGETS", "65536");
  EXPECT_NO_THROW((void)resolve_config({}));
}

// FERRY_DEVICES is a count, not a size: a value too large for an int must be rejected, not
// wrapped (4294967297 once truncated to 1 and was accepted as one device), and a size suffix
// makes no sense for it.
TEST_F(Env, DeviceCountIsACount) {
  for (const char* bad : {"4294967297", "8589934592", "2k", "-1", "1.0"}) {
    set("FERRY_DEVICES", bad);
    const std::optional<std::string> what = error_of([] { (void)resolve_config({}); });
    ASSERT_TRUE(what.has_value()) << "FERRY_DEVICES=" << bad << " was accepted";
    EXPECT_TRUE(contains(*what, "FERRY_DEVICES")) << *what;
    EXPECT_TRUE(contains(*what, bad)) << *what;
  }
}

TEST_F(Env, ExplicitOptionsBeatTheEnvironment) {
  set("FERRY_PACKET_SIZE", "abc");  // never even parsed: the explicit value wins
  set("FERRY_BOOTSTRAP", "pmi1");
  set("FERRY_PACKETS", "1024");
  set("FERRY_DEVICES", "2");
  ferry::RuntimeOptions o;
  o.packet_size = 4096;
  o.bootstrap = "single";
  o.devices = 3;
  ferry::detail::Config c;
  ASSERT_NO_THROW(c = resolve_config(o));
  EXPECT_EQ(c.packet_size, 4096u);
  EXPECT_EQ(c.bootstrap, "single");
  EXPECT_EQ(c.devices, 3);
  EXPECT_EQ(c.packets, 1024u);  // not set explicitly: the environment still applies
}

// Explicit values go through the same range checks as the environment's.
TEST_F(Env, ExplicitValuesAreRangeChecked) {
  ferry::RuntimeOptions o;
  o.packet_size = 1;
  const std::optional<std::string> what = error_of([&] { (void)resolve_config(o); });
  ASSERT_TRUE(what.has_value());
  EXPECT_TRUE(contains(*what, "FERRY_PACKET_SIZE=1")) << *what;

  ferry::RuntimeOptions negative;
  negative.devices = -2;
  const std::optional<std::string> neg = error_of([&] { (void)resolve_config(negative); });
  ASSERT_TRUE(neg.has_value());
  EXPECT_TRUE(contains(*neg, "devices=-2")) << *neg;
}

// --- The option table -----------------------------------------------------------------------

std::string upper(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}

TEST(OptionTable, ListsEveryVariableOnceWithConsistentNames) {
  const std::set<std::string> expected = {"FERRY_BOOTSTRAP",   "FERRY_PROVIDER",     "FERRY_DEVICES",
                                          "FERRY_PACKET_SIZE", "FERRY_PACKETS",      "FERRY_PREPOST",
                                          "FERRY_SEND_CREDITS", "FERRY_CQ_CAPACITY", "FERRY_MAX_TARGETS",
                                          "FERRY_RDV_THRESHOLD", "FERRY_PARCELPORT",  "FERRY_AMT_THREADS",
                                          "FERRY_RECV_DESCRIPTORS", "FERRY_LOCK_MODEL",   "FERRY_COMPLETION",
                                          "FERRY_HEADER",      "FERRY_PROGRESS",     "FERRY_DEVICE_POLLING",
                                          "FERRY_FRAGMENT",    "FERRY_FRAGMENT_MAX", "FERRY_PARCEL_QUEUES"};
  std::multiset<std::string> envs, names;
  for (const ferry::OptionInfo& o : ferry::option_table()) {
    ASSERT_NE(o.name, nullptr);
    ASSERT_NE(o.env, nullptr);
    ASSERT_NE(o.default_value, nullptr);
    ASSERT_NE(o.help, nullptr);
    envs.insert(o.env);
    names.insert(o.name);
    EXPECT_EQ(std::string(o.env), "FERRY_" + upper(o.name)) << "field and variable names disagree";
    EXPECT_GT(std::string(o.help).size(), 10u) << o.env << " has no real help text";
  }
  EXPECT_EQ(std::set<std::string>(envs.begin(), envs.end()), expected);
  for (const std::string& e : expected) EXPECT_EQ(envs.count(e), 1u) << e;
  EXPECT_EQ(names.size(), std::set<std::string>(names.begin(), names.end()).size());
}

// Every "FERRY_..." variable name the library's sources mention as a string literal must be
// in the table, so ferry-info shows every knob (a new getenv without a table entry fails here).
TEST(OptionTable, CoversEveryVariableTheSourcesRead) {
  std::set<std::string> table;
  for (const ferry::OptionInfo& o : ferry::option_table()) table.insert(o.env);
  const std::regex literal("\"(FERRY_[A-Z0-9_]+)\"");
  std::size_t files = 0;
  const std::filesystem::path src = std::filesystem::path(FERRY_SOURCE_DIR) / "src";
  ASSERT_TRUE(std::filesystem::is_directory(src)) << src;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(src)) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".cpp" && ext != ".hpp") continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    ++files;
    for (std::sregex_iterator it(s.begin(), s.end(), literal), end; it != end; ++it) {
      EXPECT_EQ(table.count((*it)[1].str()), 1u) << (*it)[1].str() << " in " << entry.path() << " is not in option_table()";
    }
  }
  EXPECT_GT(files, 5u);
}

TEST_F(Env, ResolvedOptionsReportTheValuesInForce) {
  set("FERRY_PACKETS", "1024");
  set("FERRY_PROVIDER", "shm");
  set("FERRY_PREPOST", "128");
  ferry::RuntimeOptions o;
  o.prepost = 64;  // explicit beats FERRY_PREPOST
  const auto resolved = ferry::resolved_options(o);
  const auto& table = ferry::option_table();
  ASSERT_EQ(resolved.size(), table.size());
  std::map<std::string, std::string> value;
  for (std::size_t i = 0; i < resolved.size(); ++i) {
    EXPECT_STREQ(resolved[i].first.env, table[i].env) << "same order as the table";
    value[resolved[i].first.env] = resolved[i].second;
  }
  EXPECT_EQ(value["FERRY_PACKETS"], "1024");
  EXPECT_EQ(value["FERRY_PROVIDER"], "shm");
  EXPECT_EQ(value["FERRY_PREPOST"], "64");
  EXPECT_EQ(value["FERRY_PACKET_SIZE"], "8192");  // default
  EXPECT_EQ(value["FERRY_BOOTSTRAP"], "auto");
}

}  // namespace
