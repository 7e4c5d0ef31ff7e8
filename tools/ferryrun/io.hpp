// io.hpp — small file-descriptor helpers and the per-rank output forwarder.
#pragma once

#include <string>
#include <string_view>

namespace ferryrun {

// Writes everything, retrying on EINTR and waiting out EAGAIN on non-blocking fds.
// Returns false if the peer is gone or stays unwritable; callers treat that as "drop it".
bool write_all(int fd, std::string_view data);

void set_nonblocking(int fd);

// Closes *fd if open and marks it closed, so every fd is closed exactly once.
void close_fd(int& fd);

// Copies a child's stdout or stderr to ferryrun's, one whole line at a time with a "[r] "
// prefix, so lines from different ranks never interleave mid-line.
class LineForwarder {
 public:
  LineForwarder() = default;
  LineForwarder(int src, int dst, int rank);
  LineForwarder(const LineForwarder&) = delete;
  LineForwarder& operator=(const LineForwarder&) = delete;
  LineForwarder(LineForwarder&& o) noexcept { *this = std::move(o); }
  LineForwarder& operator=(LineForwarder&& o) noexcept;
  ~LineForwarder() { close(); }

  [[nodiscard]] int fd() const { return src_; }
  [[nodiscard]] bool open() const { return src_ >= 0; }

  // Reads what is available (src is non-blocking), at most `max_reads` chunks so one chatty
  // rank cannot starve the others, and forwards complete lines. At EOF or a read error it
  // flushes the unterminated tail and closes src.
  void read_available(int max_reads = 4);

  // Forwards whatever is still buffered, then closes. Used once the rank is gone: a
  // descendant may hold the pipe open forever, so EOF cannot be waited for.
  void finish();

 private:
  void emit(bool flush_tail);
  void close();

  int src_ = -1;
  int dst_ = -1;
  std::string prefix_;
  std::string buf_;
};

}  // namespace ferryrun
