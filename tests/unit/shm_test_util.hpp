// shm_test_util.hpp — what the shared-memory transport tests share: building transports,
// data patterns, polling with deadlines, and a forked second rank that is always reaped.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ferry/error.hpp"
#include "core/op_context.hpp"
#include "net/shm/shm_transport.hpp"
#include "test_scale.hpp"

namespace ferry::test::shm {

using ferry::detail::OpContext;
using ferry::net::Access;
using ferry::net::Event;
using ferry::net::ShmCopy;
using ferry::net::ShmParams;
using ferry::net::shm::ShmTransport;

inline constexpr std::size_t kPayload = 8192;
using Clock = std::chrono::steady_clock;


// Names in /dev/shm that belong to pid.
inline std::vector<std::string> segments_of(int pid) {
  std::vector<std::string> out;
  const std::string prefix = "ferry-" + std::to_string(pid) + "-";
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) out.emplace_back(e->d_name);
    }
    closedir(d);
  }
  return out;
}

inline std::uint8_t pattern(std::size_t i, unsigned seed) {
  return static_cast<std::uint8_t>(i * 131u + seed * 7u + (i >> 12) + (i >> 20) * 3u);
}
inline void fill(unsigned char* p, std::size_t n, unsigned seed) {
  for (std::size_t i = 0; i < n; ++i) p[i] = pattern(i, seed);
}
// Index of the first wrong byte, or n.
inline std::size_t check(const unsigned char* p, std::size_t n, unsigned seed) {
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != pattern(i, seed)) return i;
  }
  return n;
}

// Polls until `done` says so or the deadline passes; every event goes to `on`.
// Receive buffers a test posts (post), as a posted-receive backend would take them: poll_until
// lends at most as many messages as are posted, copies each into the oldest posted buffer
// (-EMSGSIZE past its length) and reports it with that buffer's context. The transport itself
// lends (Receives::lent); tests that read the loans directly post nothing.
struct PostedRecv {
  void* buf;
  std::size_t len;
  OpContext* ctx;
};
inline std::map<const ShmTransport*, std::deque<PostedRecv>>& posted_recvs() {
  static std::map<const ShmTransport*, std::deque<PostedRecv>> m;
  return m;
}
inline void post(ShmTransport& t, void* buf, std::size_t len, OpContext* ctx) { posted_recvs()[&t].push_back({buf, len, ctx}); }
inline void forget_posted(ShmTransport& t) { posted_recvs().erase(&t); }

inline std::unique_ptr<ShmTransport> make(int rank, int size, ShmCopy copy, std::size_t cells = 256) {
  auto t = std::make_unique<ShmTransport>(ShmParams{rank, size, 0, kPayload, cells, copy});
  t->set_lend_limit(16);  // as many as poll_until takes in one poll
  posted_recvs().erase(t.get());  // a transport an earlier test made at this address posted these
  return t;
}

inline bool poll_until(ShmTransport& t, const std::function<void(const Event&)>& on, const std::function<bool()>& done,
                double seconds = 60) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  Event ev[16];
  while (!done()) {
    const auto found = posted_recvs().find(&t);
    std::deque<PostedRecv>* posted = found != posted_recvs().end() ? &found->second : nullptr;
    if (posted != nullptr) t.set_lend_limit(static_cast<int>(std::min<std::size_t>(posted->size(), 16)));
    const int n = t.poll(ev, 16);
    for (int i = 0; i < n; ++i) {
      if (posted != nullptr && ev[i].lent != nullptr) {
        const PostedRecv r = posted->front();
        posted->pop_front();
        const std::size_t copied = std::min(ev[i].length, r.len);
        std::memcpy(r.buf, ev[i].lent, copied);
        ev[i].error = ev[i].length <= r.len ? 0 : -EMSGSIZE;
        ev[i].length = copied;
        ev[i].context = r.ctx;
        ev[i].lent = nullptr;
      }
    }
    for (int i = 0; i < n; ++i) on(ev[i]);
    if (n == 0 && Clock::now() > deadline) return false;
  }
  return true;
}

// One event for ctx (other events are passed to `other`).
inline bool wait_for(ShmTransport& t, OpContext* ctx, Event& out, const std::function<void(const Event&)>& other = {}) {
  bool got = false;
  return poll_until(
      t,
      [&](const Event& e) {
        if (!got && e.context == ctx) {
          out = e;
          got = true;
        } else if (other) {
          other(e);
        }
      },
      [&] { return got; });
}



// A byte pipe each way between parent (rank 0) and child (rank 1).
struct Link {
  int in = -1, out = -1;
  bool put(const void* p, std::size_t n) const {
    const auto* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = write(out, c, n);
      if (w <= 0) return false;
      c += w;
      n -= static_cast<std::size_t>(w);
    }
    return true;
  }
  bool get(void* p, std::size_t n, int timeout_ms = 60000) const {
    auto* c = static_cast<char*>(p);
    while (n > 0) {
      pollfd pfd{in, POLLIN, 0};
      if (::poll(&pfd, 1, timeout_ms) <= 0) return false;
      const ssize_t r = read(in, c, n);
      if (r <= 0) return false;
      c += r;
      n -= static_cast<std::size_t>(r);
    }
    return true;
  }
  bool put_string(const std::string& s) const {
    const std::uint64_t n = s.size();
    return put(&n, 8) && put(s.data(), s.size());
  }
  bool get_string(std::string& s) const {
    std::uint64_t n = 0;
    if (!get(&n, 8) || n > 4096) return false;
    s.resize(n);
    return get(s.data(), n);
  }
  bool barrier() const {
    char b = 'b';
    return put(&b, 1) && get(&b, 1);
  }
};

// Forks rank 1 and guarantees it is gone when the test is: the child dies with the parent
// (PR_SET_PDEATHSIG), and the guard's destructor — reached also when an assertion or an
// exception ends the test early — waits for it a while, then kills it.
class ChildGuard {
 public:
  // Runs body(link) in a child process and exits with its result; returns in the parent.
  template <class Body>
  explicit ChildGuard(Body body) {
    int up[2], down[2];
    if (pipe(up) != 0 || pipe(down) != 0) throw std::runtime_error("pipe failed");
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(4);  // the parent is gone already
      close(up[0]);
      close(down[1]);
      int rc = 3;
      try {
        rc = body(Link{down[0], up[1]});
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank 1] exception: %s\n", e.what());
      }
      _exit(rc);
    }
    close(up[1]);
    close(down[0]);
    link_ = Link{up[0], down[1]};
  }
  ChildGuard(const ChildGuard&) = delete;
  ChildGuard& operator=(const ChildGuard&) = delete;
  ~ChildGuard() {
    if (pid_ > 0 && !reaped_) wait(false);
  }
  const Link& link() const { return link_; }
  pid_t pid() const { return pid_; }
  // Closes the pipes (the child sees EOF), waits up to 30 s, then kills. Returns the exit
  // code, or -1 when the child had to be killed or did not exit normally.
  int wait(bool report = true) {
    close(link_.in);
    close(link_.out);
    int status = 0;
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    pid_t w;
    while ((w = waitpid(pid_, &status, WNOHANG)) == 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    reaped_ = true;
    if (w == 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      if (report) ADD_FAILURE() << "rank 1 did not exit; killed";
      return -1;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  Link link_;
};

// Commands rank 0 sends rank 1 through the transport itself, so in copy mode they arrive
// after the chunks of the puts before them.

}  // namespace ferry::test::shm
