// One Runtime per process for the whole suite; every rank runs every test.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "mp_common.hpp"

namespace mp {
namespace {
std::unique_ptr<ferry::Runtime> g_runtime;
}
ferry::Runtime& rt() { return *g_runtime; }
}  // namespace mp

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  mp::g_runtime = std::make_unique<ferry::Runtime>();
  if (mp::rt().rank() != 0) {
    // Only rank 0 narrates; every rank still reports failures.
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    struct FailurePrinter : testing::EmptyTestEventListener {
      void OnTestPartResult(const testing::TestPartResult& r) override {
        if (r.failed()) std::fprintf(stderr, "%s:%d: Failure\n%s\n", r.file_name(), r.line_number(), r.summary());
      }
    };
    listeners.Append(new FailurePrinter);
  } else {
    for (int r = 1; r < mp::rt().size(); ++r) std::printf("rank 0 reaches rank %d by %s\n", r, mp::rt().transport_of(r).c_str());
    std::printf("ferry mp suite: %d ranks, transport %s, bootstrap %s\n", mp::rt().size(), mp::rt().transport().c_str(),
                mp::rt().bootstrap().c_str());
  }
  const int rc = RUN_ALL_TESTS();
  mp::rt().finalize();
  mp::g_runtime.reset();
  return rc;
}
