// harness.hpp — the job-wide bootstrap shared by the collective tests.
#pragma once

#include <string>

#include "bootstrap/bootstrap.hpp"

namespace ferry_test {

ferry::bootstrap::Bootstrap& job();
// What the launcher was supposed to give us; empty / 0 when the test was not told.
const std::string& expected_kind();
int expected_size();

}  // namespace ferry_test
