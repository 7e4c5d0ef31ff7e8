// log_test.cpp — the logger (common/log.hpp): level filtering, one whole line per call with
// the rank/device prefix, level names, and no allocation.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "alloc_counter.hpp"
#include "common/log.hpp"

namespace {

using ferry::detail::LogLevel;

// Restores the process-wide level and rank after each test; stderr is captured by gtest
// (fd 2 redirected to a file), which is what the logger's write(2) goes to.
class Log : public ::testing::Test {
 protected:
  void SetUp() override {
    level_ = ferry::detail::log_level();
    rank_ = ferry::detail::log_rank();
  }
  void TearDown() override {
    ferry::detail::set_log_level(level_);
    ferry::detail::set_log_rank(rank_);
  }

 private:
  LogLevel level_{};
  int rank_ = -1;
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST_F(Log, DefaultLevelIsWarn) { EXPECT_EQ(ferry::detail::log_level(), LogLevel::warn); }

TEST_F(Log, LinesBelowTheLevelAreNotWrittenNorTheirArgumentsEvaluated) {
  int evaluated = 0;
  auto arg = [&evaluated] { return ++evaluated; };
  ferry::detail::set_log_rank(-1);
  ferry::detail::set_log_level(LogLevel::warn);
  testing::internal::CaptureStderr();
  FERRY_LOG(debug, "debug %d", arg());
  FERRY_LOG(info, "info %d", arg());
  FERRY_LOG(warn, "warn %d", arg());
  FERRY_LOG(error, "error %d", arg());
  ferry::detail::set_log_level(LogLevel::off);
  FERRY_LOG(error, "silenced %d", arg());
  ferry::detail::set_log_level(LogLevel::debug);
  FERRY_LOG(debug, "debug %d", arg());
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "ferry: warn 1\nferry: error 2\nferry: debug 3\n");
  EXPECT_EQ(evaluated, 3);
}

TEST_F(Log, PrefixNamesRankAndDeviceWhenKnown) {
  ferry::detail::set_log_level(LogLevel::warn);
  ferry::detail::set_log_rank(3);
  testing::internal::CaptureStderr();
  FERRY_LOG(warn, "process rank, %s", "no device");
  FERRY_LOG_AT(error, 5, 2, "dropped a malformed packet of %zu bytes", std::size_t{7});
  FERRY_LOG_AT(warn, 5, -1, "no device");
  FERRY_LOG_AT(warn, -1, 1, "no rank");
  FERRY_LOG_AT(warn, -1, -1, "neither");
  EXPECT_EQ(testing::internal::GetCapturedStderr(),
            "ferry: rank 3: process rank, no device\n"
            "ferry: rank 5 device 2: dropped a malformed packet of 7 bytes\n"
            "ferry: rank 5: no device\n"
            "ferry: device 1: no rank\n"
            "ferry: neither\n");
}

TEST_F(Log, ALongLineIsCutAndStillEndsTheLine) {
  ferry::detail::set_log_level(LogLevel::warn);
  const std::string big(3 * ferry::detail::kMaxLogLine, 'x');
  testing::internal::CaptureStderr();
  FERRY_LOG_AT(warn, 1, 0, "%s", big.c_str());
  FERRY_LOG_AT(warn, 1, 0, "after");
  const auto lines = lines_of(testing::internal::GetCapturedStderr());
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].size() + 1, ferry::detail::kMaxLogLine);  // + the '\n'
  EXPECT_EQ(lines[0].rfind("ferry: rank 1 device 0: xxx", 0), 0u);
  EXPECT_EQ(lines[0].substr(lines[0].size() - 4), "x...");
  EXPECT_EQ(lines[1], "ferry: rank 1 device 0: after");
}

// Lines of concurrent threads come out whole: one write(2) per call.
TEST_F(Log, ConcurrentLinesDoNotInterleave) {
  ferry::detail::set_log_level(LogLevel::warn);
  constexpr int kThreads = 4, kLines = 200;
  const std::string filler(300, '.');
  testing::internal::CaptureStderr();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kLines; ++i) FERRY_LOG_AT(warn, t, t, "line %d %s end", i, filler.c_str());
    });
  }
  for (auto& th : threads) th.join();
  const auto lines = lines_of(testing::internal::GetCapturedStderr());
  ASSERT_EQ(lines.size(), static_cast<std::size_t>(kThreads * kLines));
  std::set<std::string> seen;
  for (const auto& line : lines) {
    int t = -1, d = -1, i = -1;
    ASSERT_EQ(std::sscanf(line.c_str(), "ferry: rank %d device %d: line %d", &t, &d, &i), 3) << line;
    EXPECT_EQ(line, "ferry: rank " + std::to_string(t) + " device " + std::to_string(t) + ": line " + std::to_string(i) +
                        " " + filler + " end");
    seen.insert(line);
  }
  EXPECT_EQ(seen.size(), lines.size()) << "every line once";
}

// Logging runs on out-of-memory paths: it must not allocate.
TEST_F(Log, WritingALineDoesNotAllocate) {
  FERRY_SKIP_UNLESS_COUNTING_ALLOCATIONS();
  ferry::detail::set_log_level(LogLevel::warn);
  testing::internal::CaptureStderr();
  {
    ferry::test::AllocationCounter allocs;
    FERRY_LOG_AT(error, 0, 0, "out of memory parking a message for target %u", 7u);
    EXPECT_EQ(allocs.count(), 0u);
  }
  (void)testing::internal::GetCapturedStderr();
}

}  // namespace
