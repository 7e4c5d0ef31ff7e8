// tsan.hpp — telling ThreadSanitizer about an ordering it cannot see.
//
// TSan watches one process. A queue in shared memory between processes can order two threads
// of this process through a third party in another one (its atomics are invisible here), and
// TSan would then report the two as racing. tsan_acquire(addr) says "what was released on
// addr in this process happens before this point"; it pairs with release stores (and
// __tsan_release) on the same address. Nothing in other builds.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define FERRY_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FERRY_TSAN 1
#endif
#endif

#ifdef FERRY_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace ferry::detail {

inline void tsan_acquire([[maybe_unused]] const void* addr) noexcept {
#ifdef FERRY_TSAN
  __tsan_acquire(const_cast<void*>(addr));
#endif
}

}  // namespace ferry::detail
