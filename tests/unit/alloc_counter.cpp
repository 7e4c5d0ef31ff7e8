// alloc_counter.cpp — a replacement global operator new that counts per-thread allocations
// (in every build but clang's TSan: alloc_counter.hpp).
//
// Only the scalar forms are replaced: the array forms forward to these by the standard's
// default definitions, and ferry's fast paths use no aligned new.
#include "alloc_counter.hpp"

#include <cstdlib>
#include <new>

namespace {
thread_local bool counting = false;
thread_local std::size_t allocations = 0;
}  // namespace

#ifndef FERRY_TEST_NO_ALLOCATION_COUNT
void* operator new(std::size_t size) {
  if (counting) ++allocations;
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  if (counting) ++allocations;
  return std::malloc(size == 0 ? 1 : size);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
#endif

namespace ferry::test {

AllocationCounter::AllocationCounter() noexcept : start_(allocations), outer_(!counting) { counting = true; }
AllocationCounter::~AllocationCounter() {
  if (outer_) counting = false;
}
#ifdef FERRY_TEST_NO_ALLOCATION_COUNT
// Nothing is counted here: a test that forgot FERRY_SKIP_UNLESS_COUNTING_ALLOCATIONS fails
// rather than passes without a check.
std::size_t AllocationCounter::count() const noexcept {
  static_cast<void>(start_);
  return static_cast<std::size_t>(-1);
}
#else
std::size_t AllocationCounter::count() const noexcept { return allocations - start_; }
#endif

}  // namespace ferry::test
