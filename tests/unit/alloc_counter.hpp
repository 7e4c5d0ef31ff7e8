// alloc_counter.hpp — counts operator new calls on the current thread, so tests can check
// ferry's "no allocation on this path" contracts. alloc_counter.cpp replaces the global
// operator new for the whole test binary; counting is off unless a scope enables it.
#pragma once

#include <cstddef>

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
