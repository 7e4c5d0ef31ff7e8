// membarrier.cpp — registration and the call (see membarrier.hpp).
#include "common/membarrier.hpp"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/log.hpp"
#include "common/tsan.hpp"

namespace ferry::detail::membarrier {

bool expedited() noexcept {
#ifdef FERRY_TSAN
  return false;
#else
  // Registered once, before any caller can act on the answer (a function-local static: its
  // initialisation happens before every read of it).
  static const bool registered = syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0) == 0;
  return registered;
#endif
}

void barrier_all() noexcept {
  if (syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) == 0) return;
  const int err = errno;
  FERRY_LOG(error,
            "membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) failed after registration: %s (%d); "
            "ferry's asymmetric fences cannot order memory without it",
            std::strerror(err), err);
  std::abort();
}

}  // namespace ferry::detail::membarrier
