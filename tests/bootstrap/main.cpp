// main.cpp — ferry-bootstrap-test: gtest driver that runs on every rank of a job.
//
// Options (before gtest's own): --expect-kind=K and --expect-size=N. Under a launcher they
// catch the worst failure a bootstrap can have: detection falling back to "single", where
// every process passes alone and nothing was tested.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "bootstrap/bootstrap.hpp"
#include "ferry/error.hpp"
#include "harness.hpp"

namespace {
std::unique_ptr<ferry::bootstrap::Bootstrap> g_job;
std::string g_expected_kind;
int g_expected_size = 0;
}  // namespace

namespace ferry_test {
ferry::bootstrap::Bootstrap& job() { return *g_job; }
const std::string& expected_kind() { return g_expected_kind; }
int expected_size() { return g_expected_size; }
}  // namespace ferry_test

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--expect-kind=", 0) == 0) {
      g_expected_kind = arg.substr(std::strlen("--expect-kind="));
    } else if (arg.rfind("--expect-size=", 0) == 0) {
      g_expected_size = std::atoi(arg.c_str() + std::strlen("--expect-size="));
    } else {
      std::fprintf(stderr, "ferry-bootstrap-test: unknown argument '%s'\n", arg.c_str());
      return 2;
    }
  }

  const char* env_kind = std::getenv("FERRY_BOOTSTRAP");
  const std::string kind = env_kind != nullptr ? env_kind : "auto";
  try {
    g_job = ferry::bootstrap::make_bootstrap(kind);
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "ferry-bootstrap-test: cannot start bootstrap '%s': %s\n", kind.c_str(), e.what());
    return 2;
  }
  std::printf("ferry-bootstrap-test: rank %d of %d, bootstrap %.*s (requested '%s'), pid %d\n", g_job->rank(),
              g_job->size(), static_cast<int>(g_job->kind().size()), g_job->kind().data(), kind.c_str(),
              static_cast<int>(getpid()));
  std::fflush(stdout);

  const int rc = RUN_ALL_TESTS();
  g_job.reset();
  return rc;
}
