#include "common/log.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace ferry::detail {

// Constant-initialized: usable from any static constructor or destructor.
constinit std::atomic<int> log_threshold{static_cast<int>(LogLevel::warn)};

namespace {
constinit std::atomic<int> process_rank{-1};
}  // namespace

void set_log_level(LogLevel level) noexcept { log_threshold.store(static_cast<int>(level), std::memory_order_relaxed); }

LogLevel log_level() noexcept { return static_cast<LogLevel>(log_threshold.load(std::memory_order_relaxed)); }

void set_log_rank(int rank) noexcept { process_rank.store(rank, std::memory_order_relaxed); }

int log_rank() noexcept { return process_rank.load(std::memory_order_relaxed); }

void log_line(LogLevel, int rank, int device, const char* format, ...) noexcept {
  const int saved_errno = errno;  // a caller may log between a failing call and reading errno
  // The whole line is built on the stack and written at once: no allocation (this runs on
  // out-of-memory paths), and one write(2) so concurrent lines stay whole.
  char line[kMaxLogLine];
  constexpr std::size_t room = sizeof line;  // for the text and the '\0' that '\n' replaces
  int n;
  if (rank >= 0 && device >= 0) {
    n = std::snprintf(line, room, "ferry: rank %d device %d: ", rank, device);
  } else if (rank >= 0) {
    n = std::snprintf(line, room, "ferry: rank %d: ", rank);
  } else if (device >= 0) {
    n = std::snprintf(line, room, "ferry: device %d: ", device);
  } else {
    n = std::snprintf(line, room, "ferry: ");
  }
  std::size_t len = n > 0 ? static_cast<std::size_t>(n) : 0;
  va_list args;
  va_start(args, format);
  const int m = std::vsnprintf(line + len, room - len, format, args);
  va_end(args);
  if (m > 0) len += static_cast<std::size_t>(m);
  if (len >= room) {  // cut: the text filled room - 1 bytes
    len = room - 1;
    std::memcpy(line + len - 3, "...", 3);
  }
  line[len++] = '\n';
  // One write; retried only if a signal interrupted it before anything was written. A short
  // write (a full pipe) is not completed: that would split the line.
  while (::write(STDERR_FILENO, line, len) < 0 && errno == EINTR) {
  }
  errno = saved_errno;
}

}  // namespace ferry::detail
