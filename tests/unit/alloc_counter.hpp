// alloc_counter.hpp — counts operator new calls on the current thread, so tests can check
// ferry's "no allocation on this path" contracts. alloc_counter.cpp replaces the global
// operator new for the whole test binary; counting is off unless a scope enables it.
//
// clang's ThreadSanitizer links its own operator new statically into every program, so a
// second definition cannot be linked there: under it nothing is replaced and the tests that
// count skip (FERRY_SKIP_UNLESS_COUNTING_ALLOCATIONS); the plain and ASan builds count.
#pragma once

#include <cstddef>

#if defined(__clang__) && defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FERRY_TEST_NO_ALLOCATION_COUNT 1
#endif
#endif

// At the top of a test that uses AllocationCounter.
#ifdef FERRY_TEST_NO_ALLOCATION_COUNT
#define FERRY_SKIP_UNLESS_COUNTING_ALLOCATIONS() \
  GTEST_SKIP() << "clang's TSan owns operator new: allocations are not counted in this build"
#else
#define FERRY_SKIP_UNLESS_COUNTING_ALLOCATIONS() static_cast<void>(0)
#endif

namespace ferry::test {

// Counts allocations made by this thread while alive.
class AllocationCounter {
 public:
  AllocationCounter() noexcept;
  ~AllocationCounter();
  AllocationCounter(const AllocationCounter&) = delete;
  AllocationCounter& operator=(const AllocationCounter&) = delete;
  std::size_t count() const noexcept;

 private:
  std::size_t start_;
  bool outer_;
};

}  // namespace ferry::test
