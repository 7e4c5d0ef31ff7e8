// io.cpp — fd helpers and line-prefixed output forwarding.
#include "io.hpp"

#include <cerrno>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <utility>

namespace ferryrun {

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // A reader that stops reading for seconds is stuck; giving up beats stalling the
      // event loop that also has to reap and kill.
      pollfd p{fd, POLLOUT, 0};
      int r = ::poll(&p, 1, 5000);
      if (r > 0 || (r < 0 && errno == EINTR)) continue;
    }
    return false;
  }
  return true;
}

void set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

LineForwarder::LineForwarder(int src, int dst, int rank)
    : src_(src), dst_(dst), prefix_("[" + std::to_string(rank) + "] ") {
  set_nonblocking(src_);
}

LineForwarder& LineForwarder::operator=(LineForwarder&& o) noexcept {
  if (this != &o) {
    close();
    src_ = std::exchange(o.src_, -1);
    dst_ = o.dst_;
    prefix_ = std::move(o.prefix_);
    buf_ = std::move(o.buf_);
  }
  return *this;
}

void LineForwarder::close() { close_fd(src_); }

void LineForwarder::read_available(int max_reads) {
  char chunk[65536];
  for (int i = 0; i < max_reads && src_ >= 0; ++i) {
    ssize_t n = ::read(src_, chunk, sizeof chunk);
    if (n > 0) {
      buf_.append(chunk, static_cast<std::size_t>(n));
      emit(false);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    emit(true);  // EOF or a hard error: nothing more will come
    close();
  }
}

void LineForwarder::finish() {
  // Bounded: a surviving descendant could otherwise keep this loop fed indefinitely.
  read_available(64);
  emit(true);
  close();
}

void LineForwarder::emit(bool flush_tail) {
  // One write per batch of complete lines keeps a rank's lines contiguous in the output.
  std::string out;
  std::size_t start = 0;
  for (std::size_t nl; (nl = buf_.find('\n', start)) != std::string::npos; start = nl + 1) {
    out.append(prefix_).append(buf_, start, nl + 1 - start);
  }
  buf_.erase(0, start);
  // An endless line (a progress bar, binary junk) is cut rather than buffered forever.
  constexpr std::size_t kMaxLine = 1 << 16;
  if (!buf_.empty() && (flush_tail || buf_.size() >= kMaxLine)) {
    out.append(prefix_).append(buf_).append("\n");
    buf_.clear();
  }
  if (!out.empty() && !write_all(dst_, out) && errno == EPIPE) {
    // Nobody reads ferryrun's output any more (`ferryrun ... | head`). Closing our end
    // passes the broken pipe on, so the rank gets SIGPIPE as it would without ferryrun.
    close();
  }
}

}  // namespace ferryrun
