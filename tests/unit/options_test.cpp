// options_test.cpp — the option tables of every layer, size parsing and resolution
// (explicit > env > default), and README's option table against them.
#include <gtest/gtest.h>

#include <algorithm>
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
#include "common/log.hpp"
#include "ferry/amt.hpp"
#include "ferry/error.hpp"
#include "ferry/options.hpp"
#include "ferry/parcel.hpp"
#include "ferry/runtime.hpp"
#include "net/registry.hpp"

namespace {

using ferry::detail::parse_size;

ferry::RuntimeSettings resolve_config(const ferry::RuntimeOptions& o) { return ferry::resolve_options(o).settings; }

// Every layer's rows, core first, then the backends'.
std::vector<const ferry::OptionInfo*> all_options() {
  std::vector<const ferry::OptionInfo*> out;
  for (const auto& r : ferry::runtime_option_table().rows()) out.push_back(&r.info);
  for (const auto& t : ferry::backend_option_tables())
    for (const auto& r : t.rows) out.push_back(&r.info);
  for (const auto& r : ferry::parcel::option_table().rows()) out.push_back(&r.info);
  for (const auto& r : ferry::amt::option_table().rows()) out.push_back(&r.info);
  return out;
}

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

// --- Resolution and the environment ---------------------------------------------------------

// Clears every FERRY_* option variable (and restores what the caller's environment had), so
// tests neither see the developer's settings nor leak their own into later tests.
class Env : public testing::Test {
 protected:
  void SetUp() override {
    for (const ferry::OptionInfo* o : all_options()) {
      for (const char* env : {o->env, o->deprecated_env}) {
        if (env == nullptr) continue;
        if (const char* v = std::getenv(env)) saved_[env] = v;
        ::unsetenv(env);
      }
    }
  }
  void TearDown() override {
    for (const ferry::OptionInfo* o : all_options()) {
      ::unsetenv(o->env);
      if (o->deprecated_env != nullptr) ::unsetenv(o->deprecated_env);
    }
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }
  static void set(const char* name, const char* value) { ASSERT_EQ(::setenv(name, value, 1), 0); }

 private:
  std::map<std::string, std::string> saved_;
};

TEST_F(Env, DefaultsMatchTheOptionTable) {
  const ferry::RuntimeSettings c = resolve_config({});
  EXPECT_EQ(c.bootstrap, ferry::BootstrapKind::automatic);
  EXPECT_EQ(c.provider, "auto");
  EXPECT_EQ(c.devices, 1);
  EXPECT_EQ(c.packet_size, 8192u);
  EXPECT_EQ(c.packets, 4096u);
  EXPECT_EQ(c.prepost, 256u);
  EXPECT_EQ(c.recv_descriptors, 16384u);
  EXPECT_EQ(c.send_credits, 0u);
  EXPECT_EQ(c.cq_capacity, 65536u);
  EXPECT_EQ(c.max_targets, 4096u);
  EXPECT_EQ(c.rdv_threshold, 0u);
  EXPECT_EQ(c.fragment, ferry::FragmentMode::on);
  EXPECT_EQ(c.fragment_max, 16384u);
  EXPECT_EQ(c.lock_model, ferry::LockModel::lockless);
  EXPECT_EQ(c.completion, ferry::CompletionMechanism::cq);
  EXPECT_EQ(c.progress.value, ferry::ProgressMode::explicit_calls);
  EXPECT_EQ(c.progress.count, 0u);
  EXPECT_EQ(c.log, ferry::LogLevel::warn);
  const ferry::parcel::Settings p = ferry::parcel::option_table().resolve().settings;
  EXPECT_EQ(p.header, ferry::parcel::HeaderPrimitive::am);
  EXPECT_EQ(p.device_polling, ferry::parcel::DevicePolling::local);
  EXPECT_EQ(p.parcel_queues, ferry::parcel::ParcelQueues::shared);
  const ferry::amt::Settings a = ferry::amt::option_table().resolve().settings;
  EXPECT_EQ(a.parcelport, "ferry");
  EXPECT_EQ(a.threads, 1);
  // Every value in force is the row's default, and says so.
  for (const ferry::ResolvedOption& o : ferry::resolve_options().options) {
    EXPECT_EQ(o.value, o.info->default_value) << o.info->name;
    EXPECT_EQ(o.source, ferry::OptionSource::default_value) << o.info->name;
  }
  ferry::RuntimeSettings one;
  ferry::runtime_option_table().resolve_one("cq_capacity", one);
  EXPECT_EQ(one.cq_capacity, 65536u);
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
  set("FERRY_LOCK_MODEL", "csync");
  set("FERRY_COMPLETION", "sync");
  set("FERRY_PROGRESS", "thread:3");
  set("FERRY_LOG", "debug");
  const ferry::RuntimeSettings c = resolve_config({});
  EXPECT_EQ(c.bootstrap, ferry::BootstrapKind::single);
  EXPECT_EQ(c.provider, "tcp");
  EXPECT_EQ(c.devices, 4);
  EXPECT_EQ(c.packet_size, 16384u);
  EXPECT_EQ(c.packets, 1024u);
  EXPECT_EQ(c.prepost, 64u);
  EXPECT_EQ(c.send_credits, 32u);
  EXPECT_EQ(c.cq_capacity, 1u << 20);
  EXPECT_EQ(c.max_targets, 16u);
  EXPECT_EQ(c.rdv_threshold, 4096u);
  EXPECT_EQ(c.lock_model, ferry::LockModel::csync);
  EXPECT_EQ(c.completion, ferry::CompletionMechanism::sync);
  EXPECT_EQ(c.progress.value, ferry::ProgressMode::thread);
  EXPECT_EQ(c.progress.count, 3u);
  EXPECT_EQ(c.log, ferry::LogLevel::debug);
  ferry::RuntimeSettings one;
  ferry::runtime_option_table().resolve_one("cq_capacity", one);
  EXPECT_EQ(one.cq_capacity, 1u << 20);

  set("FERRY_HEADER", "sendrecv");
  set("FERRY_DEVICE_POLLING", "global");
  set("FERRY_AMT_THREADS", "3");
  set("FERRY_PARCELPORT", "mpi");
  EXPECT_EQ(ferry::parcel::option_table().resolve().settings.header, ferry::parcel::HeaderPrimitive::sendrecv);
  EXPECT_EQ(ferry::parcel::option_table().resolve().settings.device_polling, ferry::parcel::DevicePolling::global);
  EXPECT_EQ(ferry::amt::option_table().resolve().settings.threads, 3);
  EXPECT_EQ(ferry::amt::option_table().resolve().settings.parcelport, "mpi");
}

TEST_F(Env, LogLevelIsOneOfItsNamesAndAnythingElseListsThem) {
  set("FERRY_LOG", "off");
  EXPECT_EQ(resolve_config({}).log, ferry::LogLevel::off);
  EXPECT_EQ(resolve_config({.log = "error"}).log, ferry::LogLevel::error) << "the program's value wins";
  set("FERRY_LOG", "verbose");
  const std::optional<std::string> what = error_of([] { (void)resolve_config({}); });
  ASSERT_TRUE(what.has_value());
  EXPECT_NE(what->find("FERRY_LOG"), std::string::npos) << *what;
  EXPECT_NE(what->find("verbose"), std::string::npos) << *what;
  EXPECT_NE(what->find("off, error, warn, info, debug"), std::string::npos) << *what;
}

TEST_F(Env, FragmentIsAutoOffOrOnAndAnythingElseListsThem) {
  set("FERRY_FRAGMENT", "off");
  EXPECT_EQ(resolve_config({}).fragment, ferry::FragmentMode::off);
  set("FERRY_FRAGMENT", "auto");
  EXPECT_EQ(resolve_config({}).fragment, ferry::FragmentMode::automatic);
  set("FERRY_FRAGMENT", "on");
  EXPECT_EQ(resolve_config({}).fragment, ferry::FragmentMode::on);
  set("FERRY_FRAGMENT", "always");
  const std::optional<std::string> what = error_of([] { (void)resolve_config({}); });
  ASSERT_TRUE(what.has_value());
  EXPECT_TRUE(contains(*what, "FERRY_FRAGMENT='always'")) << *what;
  EXPECT_TRUE(contains(*what, "auto, off, on")) << *what;
}

TEST_F(Env, ParcelQueuesIsSharedOrDeviceAndAnythingElseListsBoth) {
  const auto& table = ferry::parcel::option_table();
  EXPECT_EQ(table.resolve().settings.parcel_queues, ferry::parcel::ParcelQueues::shared);
  set("FERRY_PARCEL_QUEUES", "device");
  EXPECT_EQ(table.resolve().settings.parcel_queues, ferry::parcel::ParcelQueues::device);
  set("FERRY_PARCEL_QUEUES", "per_thread");
  const std::optional<std::string> what = error_of([&] { (void)table.resolve(); });
  ASSERT_TRUE(what.has_value());
  EXPECT_TRUE(contains(*what, "FERRY_PARCEL_QUEUES='per_thread'")) << *what;
  EXPECT_TRUE(contains(*what, "shared, device")) << *what;
  // A parcel setting is the parcel layer's alone: the core does not read it.
  EXPECT_NO_THROW((void)resolve_config({}));
}

// An empty variable counts as unset (`FERRY_PACKETS= prog` should not be an error).
TEST_F(Env, EmptyVariableMeansUnset) {
  set("FERRY_PACKETS", "");
  set("FERRY_BOOTSTRAP", "");
  set("FERRY_AMT_THREADS", "");
  const ferry::Resolved<ferry::RuntimeSettings> r = ferry::resolve_options({});
  EXPECT_EQ(r.settings.packets, 4096u);
  EXPECT_EQ(r.settings.bootstrap, ferry::BootstrapKind::automatic);
  for (const ferry::ResolvedOption& o : r.options) EXPECT_EQ(o.source, ferry::OptionSource::default_value) << o.info->name;
  EXPECT_EQ(ferry::amt::option_table().resolve().settings.threads, 1);
}

TEST_F(Env, MalformedEnvironmentValueNamesVariableAndValue) {
  set("FERRY_PACKET_SIZE", "abc");
  const std::optional<std::string> what = error_of([] { (void)resolve_config({}); });
  ASSERT_TRUE(what.has_value());
  EXPECT_TRUE(contains(*what, "FERRY_PACKET_SIZE")) << *what;
  EXPECT_TRUE(contains(*what, "'abc'")) << *what;
}

// Every option of every layer that is not free text, set to a value its type cannot take, is
// refused by the layer that owns it, naming the variable and the value: the choice options
// (FERRY_LOCK_MODEL=bogus, FERRY_PROVIDER's and FERRY_PARCELPORT's neighbours...), counts,
// sizes and booleans alike.
TEST_F(Env, EveryOptionRefusesAValueOfTheWrongKindByName) {
  using T = ferry::OptionType;
  auto resolve_all = [] {
    (void)ferry::resolve_options();  // the core's table and the backends' rows
    (void)ferry::parcel::option_table().resolve();
    (void)ferry::amt::option_table().resolve();
  };
  int checked = 0;
  for (const ferry::OptionInfo* o : all_options()) {
    const char* bad = nullptr;
    switch (o->type) {
      case T::choice: bad = "bogus"; break;
      case T::size: bad = "12x"; break;
      case T::count: bad = "-3"; break;
      case T::boolean: bad = "maybe"; break;
      case T::text: continue;
    }
    set(o->env, bad);
    const std::optional<std::string> what = error_of(resolve_all);
    ::unsetenv(o->env);
    ASSERT_TRUE(what.has_value()) << o->env << "=" << bad << " was accepted";
    EXPECT_TRUE(contains(*what, o->env)) << *what;
    EXPECT_TRUE(contains(*what, bad)) << *what;
    ++checked;
  }
  EXPECT_GE(checked, 20);  // every layer's typed rows (24 when written)
}

TEST_F(Env, EveryMalformedSizeVariableIsReported) {
  for (const char* var : {"FERRY_DEVICES", "FERRY_PACKET_SIZE", "FERRY_PACKETS", "FERRY_PREPOST",
                          "FERRY_SEND_CREDITS", "FERRY_CQ_CAPACITY", "FERRY_MAX_TARGETS", "FERRY_RDV_THRESHOLD",
                          "FERRY_FRAGMENT_MAX", "FERRY_RECV_DESCRIPTORS"}) {
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
    const char* range;
  };
  for (const Case c : {Case{"FERRY_DEVICES", "0", "1 to 64"}, Case{"FERRY_DEVICES", "65", "1 to 64"},
                       Case{"FERRY_PACKET_SIZE", "32", "64 to 1073741824"},
                       Case{"FERRY_PACKET_SIZE", "2G", "64 to 1073741824"}, Case{"FERRY_PACKETS", "1", "2 to 16777216"},
                       Case{"FERRY_PREPOST", "5000", "1 to 4096 (at most FERRY_PACKETS=4096)"},
                       Case{"FERRY_CQ_CAPACITY", "1", "2 to 268435456"}, Case{"FERRY_MAX_TARGETS", "65536", "1 to 65535"},
                       Case{"FERRY_FRAGMENT_MAX", "2G", "0 to 1073741824"}}) {
    set(c.var, c.value);
    const std::optional<std::string> what = error_of([] { (void)resolve_config({}); });
    ASSERT_TRUE(what.has_value()) << c.var << "=" << c.value << " was accepted";
    EXPECT_TRUE(contains(*what, c.var)) << *what;
    EXPECT_TRUE(contains(*what, "out of range")) << *what;
    EXPECT_TRUE(contains(*what, std::string("valid values are ") + c.range)) << *what;
    ::unsetenv(c.var);
  }
  // The edges themselves are accepted.
  set("FERRY_DEVICES", "64");
  set("FERRY_PACKET_SIZE", "64");
  set("FERRY_PACKETS", "2");
  set("FERRY_PREPOST", "2");  // the table lets prepost equal packets; a device asks for one more (mp test)
  set("FERRY_CQ_CAPACITY", "2");
  set("FERRY_MAX_TARGETS", "65535");
  EXPECT_NO_THROW((void)resolve_config({}));
  // A count choice's N is range-checked too, and the message says which N is valid.
  set("FERRY_PROGRESS", "thread:0");
  const std::optional<std::string> what = error_of([] { (void)resolve_config({}); });
  ASSERT_TRUE(what.has_value());
  EXPECT_TRUE(contains(*what, "FERRY_PROGRESS='thread:0'")) << *what;
  EXPECT_TRUE(contains(*what, "1 to 999")) << *what;
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
  ferry::Resolved<ferry::RuntimeSettings> r;
  ASSERT_NO_THROW(r = ferry::resolve_options(o));
  EXPECT_EQ(r.settings.packet_size, 4096u);
  EXPECT_EQ(r.settings.bootstrap, ferry::BootstrapKind::single);
  EXPECT_EQ(r.settings.devices, 3);
  EXPECT_EQ(r.settings.packets, 1024u);  // not set explicitly: the environment still applies
}

// Each value says where it came from: the program, the environment, or the default.
TEST_F(Env, SourcesAreReported) {
  set("FERRY_PACKETS", "1024");
  set("FERRY_HEADER", "sendrecv");
  ferry::RuntimeOptions o;
  o.lock_model = "lockq";
  const ferry::Resolved<ferry::RuntimeSettings> r = ferry::resolve_options(o);
  std::map<std::string, ferry::OptionSource> source;
  for (const ferry::ResolvedOption& x : r.options) source[x.info->name] = x.source;
  EXPECT_EQ(source["lock_model"], ferry::OptionSource::program);
  EXPECT_EQ(source["packets"], ferry::OptionSource::environment);
  EXPECT_EQ(source["packet_size"], ferry::OptionSource::default_value);
  EXPECT_STREQ(ferry::to_string(ferry::OptionSource::program), "program");
  EXPECT_STREQ(ferry::to_string(ferry::OptionSource::environment), "environment");
  EXPECT_STREQ(ferry::to_string(ferry::OptionSource::default_value), "default");
  EXPECT_EQ(r.settings.lock_model, ferry::LockModel::lockq);

  ferry::parcel::ParcelportOptions t;
  t.device_polling = "random";
  const auto p = ferry::parcel::option_table().resolve(t);
  EXPECT_EQ(p.options[0].source, ferry::OptionSource::environment);  // header
  EXPECT_EQ(p.options[1].source, ferry::OptionSource::program);      // device_polling
  EXPECT_EQ(p.options[2].source, ferry::OptionSource::default_value);
  EXPECT_EQ(p.settings.device_polling, ferry::parcel::DevicePolling::random);
  EXPECT_EQ(p.value("header"), "sendrecv");
  EXPECT_TRUE(error_of([&] { (void)p.value("no_such_option"); }).has_value());
}

// Explicit values go through the same checks as the environment's, and the message names the
// field the program set.
TEST_F(Env, ExplicitValuesAreRangeChecked) {
  ferry::RuntimeOptions o;
  o.packet_size = 1;
  const std::optional<std::string> what = error_of([&] { (void)resolve_config(o); });
  ASSERT_TRUE(what.has_value());
  EXPECT_TRUE(contains(*what, "RuntimeOptions::packet_size=1")) << *what;
  EXPECT_TRUE(contains(*what, "64 to 1073741824")) << *what;

  ferry::RuntimeOptions negative;
  negative.devices = -2;
  const std::optional<std::string> neg = error_of([&] { (void)resolve_config(negative); });
  ASSERT_TRUE(neg.has_value());
  EXPECT_TRUE(contains(*neg, "RuntimeOptions::devices='-2'")) << *neg;

  ferry::RuntimeOptions model;
  model.lock_model = "spin";
  const std::optional<std::string> bad = error_of([&] { (void)resolve_config(model); });
  ASSERT_TRUE(bad.has_value());
  EXPECT_TRUE(contains(*bad, "RuntimeOptions::lock_model='spin'")) << *bad;
  EXPECT_TRUE(contains(*bad, "lockless, trylock, block, lockq, csync, offload")) << *bad;
}

// A bad value in every layer's table names the option and the value, and lists what is valid.
TEST_F(Env, EveryLayerReportsBadValues) {
  set("FERRY_HEADER", "rdma");
  std::optional<std::string> what = error_of([] { (void)ferry::parcel::option_table().resolve(); });
  ASSERT_TRUE(what.has_value());
  EXPECT_TRUE(contains(*what, "FERRY_HEADER='rdma'")) << *what;
  EXPECT_TRUE(contains(*what, "am, sendrecv")) << *what;
  ::unsetenv("FERRY_HEADER");

  ferry::parcel::ParcelportOptions t;
  t.parcel_queues = "thread";
  what = error_of([&] { (void)ferry::parcel::option_table().resolve(t); });
  ASSERT_TRUE(what.has_value());
  EXPECT_TRUE(contains(*what, "ParcelportOptions::parcel_queues='thread'")) << *what;

  set("FERRY_AMT_THREADS", "many");
  what = error_of([] { (void)ferry::amt::option_table().resolve(); });
  ASSERT_TRUE(what.has_value());
  EXPECT_TRUE(contains(*what, "FERRY_AMT_THREADS='many'")) << *what;
  EXPECT_TRUE(contains(*what, "1 to 4096")) << *what;
  set("FERRY_AMT_THREADS", "5000");
  what = error_of([] { (void)ferry::amt::option_table().resolve(); });
  ASSERT_TRUE(what.has_value());
  EXPECT_TRUE(contains(*what, "FERRY_AMT_THREADS=5000 is out of range: valid values are 1 to 4096")) << *what;
  ::unsetenv("FERRY_AMT_THREADS");

  // FERRY_PARCELPORT is any registered name: make_parcelport, not the table, refuses others.
  set("FERRY_PARCELPORT", "ucx");
  EXPECT_EQ(ferry::amt::option_table().resolve().settings.parcelport, "ucx");
  ::unsetenv("FERRY_PARCELPORT");

  ferry::amt::Options a;
  a.threads = -1;
  what = error_of([&] { (void)ferry::amt::option_table().resolve(a); });
  ASSERT_TRUE(what.has_value());
  EXPECT_TRUE(contains(*what, "amt::Options::threads='-1'")) << *what;
}

// The machinery is generic: any layer declares its own options and settings structs and a
// table over them (here every type, a row the program cannot set, and a bound by another row).
struct DemoOptions {
  bool verbose = false;
  std::string mode{};
  std::size_t limit = 0;
};
enum class DemoMode : std::uint8_t { fast, safe };
struct DemoSettings {
  bool verbose = false;
  DemoMode mode = DemoMode::fast;
  std::size_t limit = 0;
  std::size_t part = 0;
  std::string label;
};

TEST_F(Env, AnyLayerCanDeclareATable) {
  using T = ferry::OptionType;
  const ferry::OptionTable<DemoOptions, DemoSettings> table(
      "demo", "DemoOptions",
      {
          ferry::option({"verbose", "FERRY_DEMO_VERBOSE", T::boolean, "off", {}, 0, 0, nullptr, "print more than usual"},
                        &DemoOptions::verbose, &DemoSettings::verbose),
          ferry::option({"mode", "FERRY_DEMO_MODE", T::choice, "fast", {"fast", "safe"}, 0, 0, nullptr, "which way"},
                        &DemoOptions::mode, &DemoSettings::mode),
          ferry::option({"limit", "FERRY_DEMO_LIMIT", T::size, "1k", {}, 1, 1u << 20, nullptr, "bytes at most"},
                        &DemoOptions::limit, &DemoSettings::limit),
          ferry::option<DemoOptions>(
              {"part", "FERRY_DEMO_PART", T::size, "512", {}, 0, UINT64_MAX, "limit", "bytes of limit per part"},
              &DemoSettings::part),
          ferry::option<DemoOptions>({"label", "FERRY_DEMO_LABEL", T::text, "none", {}, 0, 0, nullptr, "any text"},
                                     &DemoSettings::label),
      });
  DemoSettings s = table.resolve().settings;
  EXPECT_FALSE(s.verbose);
  EXPECT_EQ(s.mode, DemoMode::fast);
  EXPECT_EQ(s.limit, 1024u);
  EXPECT_EQ(s.part, 512u);
  EXPECT_EQ(s.label, "none");
  set("FERRY_DEMO_VERBOSE", "yes");
  set("FERRY_DEMO_PART", "2k");
  set("FERRY_DEMO_LABEL", "x y");
  DemoOptions o;
  o.mode = "safe";
  o.limit = 4096;
  const auto r = table.resolve(o);
  EXPECT_TRUE(r.settings.verbose);
  EXPECT_EQ(r.settings.mode, DemoMode::safe);
  EXPECT_EQ(r.settings.part, 2048u);
  EXPECT_EQ(r.settings.label, "x y");
  EXPECT_EQ(r.value("verbose"), "1");
  EXPECT_EQ(r.value("limit"), "4096");
  // part is bounded by limit, whatever limit's source.
  set("FERRY_DEMO_PART", "8k");
  std::optional<std::string> what = error_of([&] { (void)table.resolve(o); });
  ASSERT_TRUE(what.has_value());
  EXPECT_TRUE(contains(*what, "FERRY_DEMO_PART=8192 is out of range: valid values are 0 to 4096 (at most FERRY_DEMO_LIMIT=4096)")) << *what;
  set("FERRY_DEMO_VERBOSE", "maybe");
  what = error_of([&] { (void)table.resolve(); });
  ASSERT_TRUE(what.has_value());
  EXPECT_TRUE(contains(*what, "FERRY_DEMO_VERBOSE='maybe'")) << *what;
  // ferry-info's listing reports every invalid value instead of stopping at the first.
  std::vector<std::string> errors;
  const auto listed = table.inspect(errors);
  EXPECT_EQ(listed.size(), 5u);
  EXPECT_EQ(errors.size(), 2u);
  EXPECT_EQ(listed[0].value, "(invalid)");
  for (const char* v : {"FERRY_DEMO_VERBOSE", "FERRY_DEMO_PART", "FERRY_DEMO_LABEL"}) ::unsetenv(v);
}

// --- The option tables ----------------------------------------------------------------------

std::string upper(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}

TEST(OptionTable, ListsEveryVariableOnceWithConsistentNames) {
  std::multiset<std::string> envs;
  for (const ferry::OptionInfo* o : all_options()) {
    ASSERT_NE(o->name, nullptr);
    ASSERT_NE(o->env, nullptr);
    ASSERT_NE(o->default_value, nullptr);
    ASSERT_NE(o->help, nullptr);
    envs.insert(o->env);
    // The variable is FERRY_ + the field's name (amt::Options::threads: FERRY_AMT_THREADS).
    const std::string env = o->env;
    std::string tail = upper(o->name);
    tail.insert(tail.begin(), '_');
    EXPECT_EQ(env.rfind("FERRY_", 0), 0u) << env;
    EXPECT_TRUE(env.size() >= tail.size() && env.compare(env.size() - tail.size(), tail.size(), tail) == 0)
        << "field and variable names disagree: " << o->name << ", " << env;
    EXPECT_GT(std::string(o->help).size(), 10u) << o->env << " has no real help text";
    if (o->type == ferry::OptionType::choice) {
      EXPECT_GE(o->names.size(), 2u) << o->env;
    }
    // Every default passes its own row's checks.
    EXPECT_NO_THROW((void)ferry::detail::resolve_option(*o, o->default_value, "default", UINT64_MAX)) << o->env;
  }
  // Which variables exist is the tables' word alone (README and the sources are checked
  // against them below); here each is declared once, by one layer.
  for (const std::string& e : envs) EXPECT_EQ(envs.count(e), 1u) << e << " is declared by two rows";
  EXPECT_GE(envs.size(), 20u) << "a layer's table is missing";
}

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Every "FERRY_..." variable name the library's sources mention as a string literal must be
// in a table, so ferry-info shows every knob (a new getenv without a table entry fails here);
// and only the resolver and the bootstrap (the launchers' own PMI, PMIx, Slurm variables)
// read the environment.
TEST(OptionTable, CoversEveryVariableTheSourcesRead) {
  std::set<std::string> table;
  for (const ferry::OptionInfo* o : all_options()) {
    table.insert(o->env);
    if (o->deprecated_env != nullptr) table.insert(o->deprecated_env);
  }
  const std::regex literal("\"(FERRY_[A-Z0-9_]+)\"");
  std::size_t files = 0;
  const std::filesystem::path src = std::filesystem::path(FERRY_SOURCE_DIR) / "src";
  ASSERT_TRUE(std::filesystem::is_directory(src)) << src;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(src)) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".cpp" && ext != ".hpp") continue;
    const std::string s = read_text(entry.path());
    ++files;
    for (std::sregex_iterator it(s.begin(), s.end(), literal), end; it != end; ++it) {
      EXPECT_EQ(table.count((*it)[1].str()), 1u) << (*it)[1].str() << " in " << entry.path() << " is not in a table";
    }
    const std::string rel = std::filesystem::relative(entry.path(), src).generic_string();
    if (rel != "core/options.cpp" && rel.rfind("bootstrap/", 0) != 0) {
      EXPECT_EQ(s.find("getenv("), std::string::npos) << rel << " reads the environment: add a table row instead";
    }
  }
  EXPECT_GT(files, 5u);
}

TEST_F(Env, ResolvedOptionsReportTheValuesInForce) {
  set("FERRY_PACKETS", "1024");
  set("FERRY_PROVIDER", "shm");
  set("FERRY_PREPOST", "128");
  set("FERRY_PROGRESS", "thread:2");
  ferry::RuntimeOptions o;
  o.prepost = 64;  // explicit beats FERRY_PREPOST
  const auto resolved = ferry::resolve_options(o).options;
  const auto& rows = ferry::runtime_option_table().rows();
  std::size_t backend_rows = 0;
  for (const auto& t : ferry::backend_option_tables()) backend_rows += t.rows.size();
  ASSERT_EQ(resolved.size(), rows.size() + backend_rows) << "the core's rows, then the backends'";
  std::map<std::string, std::string> value;
  for (std::size_t i = 0; i < resolved.size(); ++i) {
    if (i < rows.size()) {
      EXPECT_EQ(resolved[i].info, &rows[i].info) << "same order as the table";
    }
    value[resolved[i].info->env] = resolved[i].value;
  }
  EXPECT_EQ(value["FERRY_PACKETS"], "1024");
  EXPECT_EQ(value["FERRY_OFI_PROVIDER"], "shm");  // through its deprecated name FERRY_PROVIDER
  EXPECT_EQ(value["FERRY_PREPOST"], "64");
  EXPECT_EQ(value["FERRY_PACKET_SIZE"], "8192");  // default
  EXPECT_EQ(value["FERRY_BOOTSTRAP"], "auto");
  EXPECT_EQ(value["FERRY_PROGRESS"], "thread:2");
}

// --- The backends' rows ---------------------------------------------------------------------

// The value in force of the row `name` and its source, from resolve_options().
std::pair<std::string, ferry::OptionSource> backend_value(const ferry::RuntimeOptions& o, const std::string& name) {
  for (const ferry::ResolvedOption& r : ferry::resolve_options(o).options) {
    if (name == r.info->name) return {r.value, r.source};
  }
  ADD_FAILURE() << name << " was not resolved";
  return {};
}

const ferry::BackendOption* backend_row(const std::string& name) {
  for (const auto& t : ferry::backend_option_tables())
    for (const auto& r : t.rows)
      if (name == r.info.name) return &r;
  return nullptr;
}

TEST_F(Env, BackendsDeclareTheirOwnRows) {
  std::map<std::string, std::set<std::string>> by_backend;
  for (const auto& t : ferry::backend_option_tables())
    for (const auto& r : t.rows) by_backend[t.backend].insert(r.info.env);
  EXPECT_EQ(by_backend["shm"], (std::set<std::string>{"FERRY_SHM_COPY", "FERRY_SHM_CELLS"}));
  EXPECT_EQ(by_backend["ofi"], (std::set<std::string>{"FERRY_OFI_PROVIDER", "FERRY_OFI_RXM_RX", "FERRY_OFI_RXM_BUFFER"}));
  EXPECT_EQ(by_backend.count("ucx"), 0u) << "ferry reads no UCX setting of its own";
  EXPECT_EQ(by_backend.count("self"), 0u);
  // The core's table no longer has them.
  for (const auto& r : ferry::runtime_option_table().rows()) {
    const std::string env = r.info.env;
    EXPECT_TRUE(env != "FERRY_PROVIDER" && env.rfind("FERRY_SHM_", 0) != 0 && env.rfind("FERRY_OFI_", 0) != 0) << env;
  }
  ASSERT_NE(backend_row("ofi_provider"), nullptr);
  EXPECT_TRUE(backend_row("ofi_provider")->job_wide) << "ranks on different providers cannot reach each other";
  EXPECT_STREQ(backend_row("ofi_provider")->info.deprecated_env, "FERRY_PROVIDER");
  ASSERT_NE(backend_row("ofi_rxm_rx"), nullptr);
  EXPECT_FALSE(backend_row("ofi_rxm_rx")->job_wide) << "each process's own memory";
  ASSERT_NE(backend_row("ofi_rxm_buffer"), nullptr);
  EXPECT_FALSE(backend_row("ofi_rxm_buffer")->job_wide) << "each process's own memory";
}

TEST_F(Env, BackendRowsResolveLikeTheCores) {
  const ferry::Resolved<ferry::RuntimeSettings> d = ferry::resolve_options();
  EXPECT_EQ(d.value("shm_copy"), "auto");
  EXPECT_EQ(d.value("shm_cells"), "256");
  EXPECT_EQ(d.value("ofi_provider"), "auto");
  EXPECT_EQ(d.value("ofi_rxm_rx"), "1024");
  EXPECT_EQ(d.value("ofi_rxm_buffer"), "0");
  set("FERRY_SHM_COPY", "copy");
  set("FERRY_SHM_CELLS", "1k");
  set("FERRY_OFI_PROVIDER", "tcp");
  const ferry::Resolved<ferry::RuntimeSettings> r = ferry::resolve_options();
  EXPECT_EQ(r.value("shm_copy"), "copy");
  EXPECT_EQ(r.value("shm_cells"), "1024");
  EXPECT_EQ(r.value("ofi_provider"), "tcp");
  // The neutral form a backend's open() receives: the typed value by row name.
  std::map<std::string, ferry::OptionValue> typed(r.settings.backends.begin(), r.settings.backends.end());
  EXPECT_EQ(typed["shm_copy"].index, 2u);  // auto, cma, copy
  EXPECT_EQ(typed["shm_cells"].number, 1024u);
  EXPECT_EQ(typed["ofi_provider"].text, "tcp");
  // The deprecated fields still report them.
  EXPECT_EQ(r.settings.provider, "tcp");
  EXPECT_EQ(r.settings.shm_cells, 1024u);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  EXPECT_EQ(r.settings.shm_copy, ferry::ShmCopyMode::copy);
#pragma GCC diagnostic pop
}

TEST_F(Env, BadBackendValuesNameTheVariableAndTheValue) {
  set("FERRY_SHM_COPY", "bogus");
  auto e = error_of([] { (void)ferry::resolve_options(); });
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(*e, "FERRY_SHM_COPY='bogus'") && contains(*e, "auto, cma, copy")) << *e;
  ::unsetenv("FERRY_SHM_COPY");
  set("FERRY_SHM_CELLS", "1");
  e = error_of([] { (void)ferry::resolve_options(); });
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(*e, "FERRY_SHM_CELLS=1 is out of range") && contains(*e, "2 to 1048576")) << *e;
  ::unsetenv("FERRY_SHM_CELLS");
  set("FERRY_SHM_CELLS", "many");
  e = error_of([] { (void)ferry::resolve_options(); });
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(*e, "FERRY_SHM_CELLS='many'")) << *e;
  // ferry-info's listing reports the same without throwing.
  std::vector<std::string> errors;
  for (const auto& t : ferry::backend_option_tables()) (void)t.inspect(errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_TRUE(contains(errors[0], "FERRY_SHM_CELLS='many'")) << errors[0];
}

TEST_F(Env, FerryProviderIsTheDeprecatedNameOfFerryOfiProvider) {
  set("FERRY_PROVIDER", "tcp");
  EXPECT_EQ(backend_value({}, "ofi_provider"), std::make_pair(std::string("tcp"), ferry::OptionSource::environment));
  set("FERRY_OFI_PROVIDER", "tcp");  // both, and the same: fine
  EXPECT_EQ(backend_value({}, "ofi_provider").first, "tcp");
  set("FERRY_OFI_PROVIDER", "verbs");
  const auto e = error_of([] { (void)ferry::resolve_options(); });
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(*e, "FERRY_OFI_PROVIDER='verbs'") && contains(*e, "FERRY_PROVIDER='tcp'") &&
              contains(*e, "deprecated"))
      << *e;
  // An empty variable counts as unset, for the old name too.
  set("FERRY_PROVIDER", "");
  EXPECT_EQ(backend_value({}, "ofi_provider").first, "verbs");
}

TEST_F(Env, ProgramsSetBackendRowsByName) {
  set("FERRY_SHM_COPY", "copy");
  ferry::RuntimeOptions o;
  o.backend_options = {{"shm_copy", "cma"}, {"FERRY_OFI_PROVIDER", "verbs"}};
  EXPECT_EQ(backend_value(o, "shm_copy"), std::make_pair(std::string("cma"), ferry::OptionSource::program));
  EXPECT_EQ(backend_value(o, "ofi_provider").first, "verbs");
  // The deprecated fields are still honoured, below backend_options.
  ferry::RuntimeOptions old;
  old.provider = "tcp";
  old.shm_cells = 64;
  EXPECT_EQ(backend_value(old, "ofi_provider"), std::make_pair(std::string("tcp"), ferry::OptionSource::program));
  EXPECT_EQ(backend_value(old, "shm_cells").first, "64");
  old.backend_options = {{"ofi_provider", "efa"}};
  EXPECT_EQ(backend_value(old, "ofi_provider").first, "efa");
  // A bad value names where it came from; an unknown name is refused.
  ferry::RuntimeOptions bad;
  bad.backend_options = {{"shm_copy", "sometimes"}};
  auto e = error_of([&] { (void)ferry::resolve_options(bad); });
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(*e, "RuntimeOptions::backend_options[shm_copy]='sometimes'")) << *e;
  bad.backend_options = {{"ucx_tls", "tcp"}};
  e = error_of([&] { (void)ferry::resolve_options(bad); });
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(*e, "'ucx_tls' is not an option")) << *e;
}

TEST_F(Env, TransportAndNetworkChoicesAreTheRegistrysBackends) {
  const ferry::OptionInfo* transport = nullptr;
  const ferry::OptionInfo* network = nullptr;
  for (const auto& r : ferry::runtime_option_table().rows()) {
    if (std::string(r.info.name) == "transport") transport = &r.info;
    if (std::string(r.info.name) == "network") network = &r.info;
  }
  ASSERT_NE(transport, nullptr);
  ASSERT_NE(network, nullptr);
  std::vector<std::string> every{"auto"}, reaching;
  for (const std::string& n : ferry::net::backend_names()) {
    every.push_back(n);
    if (ferry::net::reaches(ferry::net::backend_reach(n), ferry::net::Reach::network)) reaching.push_back(n);
  }
  EXPECT_EQ(std::vector<std::string>(transport->names.begin(), transport->names.end()), every);
  EXPECT_EQ(std::vector<std::string>(network->names.begin(), network->names.end()), reaching);
  EXPECT_NE(std::find(every.begin(), every.end(), "self"), every.end());
  EXPECT_EQ(std::find(reaching.begin(), reaching.end(), "shm"), reaching.end()) << "shm reaches one host only";
  EXPECT_EQ(network->default_value, reaching.front());
  set("FERRY_TRANSPORT", "self");
  EXPECT_EQ(ferry::resolve_options().settings.transport, "self");
  set("FERRY_NETWORK", "shm");
  const auto e = error_of([] { (void)ferry::resolve_options(); });
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(*e, "FERRY_NETWORK='shm' is not valid")) << *e;
}

// --- README's option table ------------------------------------------------------------------

// The cells of the markdown table rows (lines starting with '|') of the README section whose
// heading starts with `heading`.
std::vector<std::vector<std::string>> readme_rows(const std::string& readme, const std::string& heading) {
  std::vector<std::vector<std::string>> rows;
  const std::size_t at = readme.find("\n## " + heading);
  if (at == std::string::npos) return rows;
  std::istringstream in(readme.substr(at + 1));
  std::string line;
  std::getline(in, line);  // the heading
  while (std::getline(in, line) && line.rfind("## ", 0) != 0) {
    if (line.rfind("|", 0) != 0 || line.rfind("|---", 0) == 0) continue;
    std::vector<std::string> cells;
    std::size_t from = 1;
    for (std::size_t bar; (bar = line.find('|', from)) != std::string::npos; from = bar + 1) {
      std::string cell = line.substr(from, bar - from);
      cell.erase(0, cell.find_first_not_of(' '));
      cell.erase(cell.find_last_not_of(' ') + 1);
      cells.push_back(cell);
    }
    rows.push_back(cells);
  }
  return rows;
}

std::vector<std::string> backticked(const std::string& cell) {
  std::vector<std::string> out;
  const std::regex code("`([^`]*)`");
  for (std::sregex_iterator it(cell.begin(), cell.end(), code), end; it != end; ++it) out.push_back((*it)[1].str());
  return out;
}

// README's "Environment variables" table lists exactly the tables' variables with their
// defaults; a row naming several variables without a default refers to "The design space",
// whose value lists mark the default with "(default)".
TEST(OptionTable, ReadmeListsEveryOptionWithItsDefault) {
  const std::string readme = read_text(std::filesystem::path(FERRY_SOURCE_DIR) / "README.md");
  ASSERT_FALSE(readme.empty());
  // Variables README lists that are not library options: ferryrun's own.
  const std::set<std::string> not_options = {"FERRY_TIMEOUT"};
  std::map<std::string, std::string> readme_default;
  std::set<std::string> see_design_space;
  const auto env_rows = readme_rows(readme, "Environment variables");
  ASSERT_GT(env_rows.size(), 1u) << "README has no Environment variables table";
  for (std::size_t i = 1; i < env_rows.size(); ++i) {  // row 0 is the header
    const auto& cells = env_rows[i];
    ASSERT_GE(cells.size(), 3u) << "malformed README row";
    const std::vector<std::string> vars = backticked(cells[0]);
    const std::vector<std::string> def = backticked(cells[1]);
    for (const std::string& v : vars) {
      if (not_options.count(v)) continue;
      EXPECT_EQ(readme_default.count(v) + see_design_space.count(v), 0u) << v << " is listed twice in README";
      if (def.size() == 1) {
        readme_default[v] = def[0];
      } else {
        EXPECT_TRUE(def.empty() && vars.size() > 1) << v << ": README gives no single default";
        see_design_space.insert(v);
      }
    }
  }
  for (const auto& cells : readme_rows(readme, "The design space")) {
    const std::vector<std::string> vars = backticked(cells.empty() ? "" : cells[0]);
    if (vars.size() != 1 || !see_design_space.count(vars[0]) || cells.size() < 2) continue;
    const std::regex marked("`([^`]*)` \\(default\\)");
    std::smatch m;
    if (std::regex_search(cells[1], m, marked)) readme_default[vars[0]] = m[1].str();
  }
  std::set<std::string> tables;
  for (const ferry::OptionInfo* o : all_options()) {
    tables.insert(o->env);
    // A deprecated name is listed with the row's default, or not at all.
    if (o->deprecated_env != nullptr) {
      tables.insert(o->deprecated_env);
      if (readme_default.count(o->deprecated_env)) {
        EXPECT_EQ(readme_default[o->deprecated_env], o->default_value) << o->deprecated_env;
      }
    }
    auto it = readme_default.find(o->env);
    if (it == readme_default.end()) {
      ADD_FAILURE() << o->env << " is in a table but not in README's Environment variables (or its default is not "
                                 "marked in The design space)";
      continue;
    }
    EXPECT_EQ(it->second, o->default_value) << o->env << ": README's default differs from the table's";
  }
  for (const auto& [v, d] : readme_default) {
    EXPECT_EQ(tables.count(v), 1u) << v << " is in README but in no option table";
  }
}

}  // namespace

// FERRY_LOG's use: a runtime sets the process's log threshold from the row, so a program that
// asks for errors only sees no warning.
TEST_F(Env, RuntimeAppliesTheLogLevel) {
  const ferry::detail::LogLevel before = ferry::detail::log_level();
  set("FERRY_LOG", "error");
  {
    ferry::Runtime rt({.bootstrap = "single"});
    EXPECT_EQ(ferry::detail::log_level(), ferry::LogLevel::error);
    EXPECT_FALSE(ferry::detail::log_enabled(ferry::LogLevel::warn));
    rt.finalize();
  }
  {
    ferry::Runtime rt({.bootstrap = "single", .log = "debug"});
    EXPECT_EQ(ferry::detail::log_level(), ferry::LogLevel::debug) << "the program's value wins over FERRY_LOG";
    rt.finalize();
  }
  ferry::detail::set_log_level(before);
}
