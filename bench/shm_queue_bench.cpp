// ferry-shm-bench: the shared-memory transport's small-message path between two processes,
// and the queue designs it was chosen among.
//
//   mpsc       the cell queue the transport uses: one per receiver, senders claim with a CAS
//   spsc       a per-(sender, receiver) ring of the same cells: the sender owns its tail, so a
//              post is plain stores (no CAS); a receiver then scans one ring per sender
//   transport  ShmTransport itself: inject() and poll() with posted receives
//
// For each: ping-pong (8-byte one-way latency = round trip / 2) and one-way message rate
// (one sending thread floods 8-byte messages, the receiver consumes them). Two processes
// (fork), pinned to --cpus; each measurement repeats --batches times and the median is
// reported, as JSON on stdout. The numbers and the choice are recorded in
// src/net/shm/README.md.
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/op_context.hpp"
#include "net/shm/cell_queue.hpp"
#include "net/shm/segment.hpp"
#include "net/shm/shm_transport.hpp"

namespace {

using ferry::net::shm::cell_payload;
using ferry::net::shm::CellHeader;
using ferry::net::shm::CellQueue;
using Clock = std::chrono::steady_clock;

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(static_cast<unsigned>(cpu), &set);
  sched_setaffinity(0, sizeof set, &set);
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// --- The per-pair SPSC variant ---------------------------------------------------------------
// Same cells as CellQueue, but one producer, and room found in each cell's seq (the consumer
// stores seq = head + count when done, the producer loads it before writing): its position is
// private, so a post is a load of the cell's seq, the stores, and the release of seq. Contract
// as CellQueue's with "one producer thread" in place of "any thread"; publication's memory
// orders as CellQueue's (no CAS, no tail, no shared head).
class SpscRing {
 public:
  SpscRing() = default;
  SpscRing(unsigned char* cells, std::uint64_t count, std::size_t stride) : cells_(cells), mask_(count - 1), stride_(stride) {}
  CellHeader* try_claim(std::uint64_t& pos) noexcept {
    CellHeader* c = cell(tail_);
    if (c->seq.load(std::memory_order_acquire) != tail_) return nullptr;
    pos = tail_++;
    return c;
  }
  CellHeader* peek(std::uint64_t head) noexcept {
    CellHeader* c = cell(head);
    return c->seq.load(std::memory_order_acquire) == head + 1 ? c : nullptr;
  }
  // The consumer is done with the cell at `head`.
  void done(CellHeader* c, std::uint64_t head) noexcept { c->seq.store(head + mask_ + 1, std::memory_order_release); }

 private:
  CellHeader* cell(std::uint64_t p) const noexcept { return reinterpret_cast<CellHeader*>(cells_ + (p & mask_) * stride_); }
  unsigned char* cells_ = nullptr;
  std::uint64_t mask_ = 0;
  std::size_t stride_ = 0;
  std::uint64_t tail_ = 0;  // producer only
};

// Two queues (0 -> 1 and 1 -> 0) of each kind in one anonymous shared mapping made before fork.
struct Shared {
  static constexpr std::uint64_t kCells = 256;
  static constexpr std::size_t kStride = CellQueue::stride_for(8192);
  // Each queue laid out as in a segment (segment.hpp): its counters and cells at the same
  // offsets, so the raw queue is measured with the transport's cache-line placement.
  static constexpr std::size_t kClaimsOffset = ferry::net::shm::claims_offset(kCells, kStride);
  static constexpr std::size_t kQueueBytes = kClaimsOffset + CellQueue::claims_bytes(kCells);
  unsigned char* base = nullptr;
  std::atomic<int>* go = nullptr;  // start flag per run

  Shared() {
    void* p = mmap(nullptr, 4096 + 4 * kQueueBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::perror("mmap");
      std::exit(1);
    }
    base = static_cast<unsigned char*>(p);
    go = new (base) std::atomic<int>(0);
  }
  unsigned char* queue_mem(int i) const { return base + 4096 + static_cast<std::size_t>(i) * kQueueBytes; }
  void reset() {
    using namespace ferry::net::shm;
    for (int i = 0; i < 4; ++i) {
      CellQueue::initialize(queue_mem(i) + kTailOffset, queue_mem(i) + kHeadOffset, queue_mem(i) + kCellsOffset,
                            queue_mem(i) + kClaimsOffset, kCells, kStride);
    }
  }
  CellQueue mpsc(int to) const {
    using namespace ferry::net::shm;
    return CellQueue(reinterpret_cast<std::atomic<std::uint64_t>*>(queue_mem(to) + kTailOffset),
                     reinterpret_cast<std::atomic<std::uint64_t>*>(queue_mem(to) + kHeadOffset), queue_mem(to) + kCellsOffset,
                     reinterpret_cast<std::atomic<std::uint64_t>*>(queue_mem(to) + kClaimsOffset), kCells, kStride);
  }
  SpscRing spsc(int to) const { return SpscRing(queue_mem(2 + to) + ferry::net::shm::kCellsOffset, kCells, kStride); }
};

template <class Q>
bool post(Q& q, std::uint64_t value) {
  std::uint64_t pos = 0;
  CellHeader* c = q.try_claim(pos);
  if (c == nullptr) return false;
  c->length = 8;
  c->rank = 0;
  c->kind = 1;
  std::memcpy(cell_payload(c), &value, 8);
  CellQueue::publish(c, pos);
  return true;
}

template <class Q>
bool take(Q& q, std::uint64_t& head, std::uint64_t& value) {
  CellHeader* c = q.peek(head);
  if (c == nullptr) return false;
  std::memcpy(&value, cell_payload(c), 8);
  if constexpr (std::is_same_v<Q, CellQueue>) {
    q.free_below(++head);  // the transport does this once per poll; here a poll finds one message
  } else {
    q.done(c, head++);
  }
  return true;
}

// Raw queue ping-pong / rate; returns seconds measured by `rank` 0 (pingpong) or 1 (rate).
template <class Q>
double run_queue(int rank, Q to_peer, Q from_peer, bool pingpong, long n) {
  std::uint64_t head = 0, v = 0;
  if (pingpong) {
    const auto t0 = Clock::now();
    for (long i = 0; i < n; ++i) {
      if (rank == 0) {
        while (!post(to_peer, static_cast<std::uint64_t>(i))) {
        }
        while (!take(from_peer, head, v)) {
        }
      } else {
        while (!take(from_peer, head, v)) {
        }
        while (!post(to_peer, v)) {
        }
      }
    }
    return seconds_since(t0);
  }
  if (rank == 0) {
    for (long i = 0; i < n; ++i) {
      while (!post(to_peer, static_cast<std::uint64_t>(i))) {
      }
    }
    while (!take(from_peer, head, v)) {  // the receiver's "done"
    }
    return 0;
  }
  const auto t0 = Clock::now();
  for (long i = 0; i < n; ++i) {
    while (!take(from_peer, head, v)) {
    }
  }
  const double s = seconds_since(t0);
  while (!post(to_peer, 0)) {
  }
  return s;
}

// --- The transport -------------------------------------------------------------------------

struct Pipe {
  int fd[2];
};

double run_transport(int rank, const Pipe& out, const Pipe& in, bool pingpong, long n, int batches,
                     std::vector<double>& times) {
  using namespace ferry::net;
  auto t = make_shm_transport(ShmParams{rank, 2, 0, 8192, 256, ShmCopy::automatic});
  const std::string mine = t->address();
  const std::uint32_t len = static_cast<std::uint32_t>(mine.size());
  if (write(out.fd[1], &len, 4) != 4 || write(out.fd[1], mine.data(), len) != static_cast<ssize_t>(len)) std::exit(1);
  std::uint32_t plen = 0;
  if (read(in.fd[0], &plen, 4) != 4 || plen > 4096) std::exit(1);
  std::string peer(plen, '\0');
  if (read(in.fd[0], peer.data(), plen) != static_cast<ssize_t>(plen)) std::exit(1);
  std::vector<std::string> addrs(2);
  addrs[static_cast<std::size_t>(rank)] = mine;
  addrs[static_cast<std::size_t>(1 - rank)] = peer;
  t->connect(addrs);
  char b = 0;
  if (write(out.fd[1], &b, 1) != 1 || read(in.fd[0], &b, 1) != 1) std::exit(1);
  t->connected();

  constexpr int kRecvs = 64;
  ferry::detail::OpContext ctx[kRecvs];
  std::uint64_t buf[kRecvs];
  for (int i = 0; i < kRecvs; ++i) t->post_recv(&buf[i], 8, nullptr, &ctx[i]);
  Event ev[16];
  const auto recv_one = [&] {
    for (;;) {
      const int k = t->poll(ev, 1);
      if (k == 1) {
        const auto i = static_cast<int>(ferry::detail::OpContext::of(ev[0].context) - ctx);
        t->post_recv(&buf[i], 8, nullptr, &ctx[i]);
        return;
      }
    }
  };
  const int peer_rank = 1 - rank;
  const std::uint64_t value = 42;
  for (int bt = 0; bt < batches + 1; ++bt) {  // the first batch warms up
    if (write(out.fd[1], &b, 1) != 1 || read(in.fd[0], &b, 1) != 1) std::exit(1);
    double s = 0;
    if (pingpong) {
      const auto t0 = Clock::now();
      for (long i = 0; i < n; ++i) {
        if (rank == 0) {
          while (t->inject(peer_rank, &value, 8) != 0) {
          }
          recv_one();
        } else {
          recv_one();
          while (t->inject(peer_rank, &value, 8) != 0) {
          }
        }
      }
      s = seconds_since(t0);
    } else if (rank == 0) {
      for (long i = 0; i < n; ++i) {
        while (t->inject(peer_rank, &value, 8) != 0) {
        }
      }
      recv_one();
    } else {
      const auto t0 = Clock::now();
      for (long got = 0; got < n;) {
        const int k = t->poll(ev, 16);
        for (int j = 0; j < k; ++j) {
          const auto i = static_cast<int>(ferry::detail::OpContext::of(ev[j].context) - ctx);
          t->post_recv(&buf[i], 8, nullptr, &ctx[i]);
        }
        got += k;
      }
      s = seconds_since(t0);
      while (t->inject(peer_rank, &value, 8) != 0) {
      }
    }
    if (bt > 0) times.push_back(s);
  }
  return 0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  long pp_iters = 200000, rate_msgs = 2000000;
  int batches = 7, cpu_a = 0, cpu_b = 1;
  std::string which = "mpsc,spsc,transport";
  CLI::App app{"ferry-shm-bench: shared-memory queue designs and the shm transport, 2 processes", "ferry-shm-bench"};
  app.add_option("--pingpong-iters", pp_iters, "round trips per batch")->check(CLI::Range(1L, 100'000'000L));
  app.add_option("--rate-msgs", rate_msgs, "messages per rate batch")->check(CLI::Range(1L, 1'000'000'000L));
  app.add_option("--batches", batches, "batches per measurement (median reported)")->check(CLI::Range(1, 1000));
  app.add_option("--cpu-a", cpu_a, "core of the first process");
  app.add_option("--cpu-b", cpu_b, "core of the second process");
  app.add_option("--variants", which, "comma-separated: mpsc, spsc, transport");
  CLI11_PARSE(app, argc, argv);

  Shared sh;
  // Child's results come back through a pipe; both processes run the same schedule.
  Pipe p01, p10, res;
  if (pipe(p01.fd) != 0 || pipe(p10.fd) != 0 || pipe(res.fd) != 0) return 1;
  nlohmann::json out;
  out["benchmark"] = "ferry-shm-bench";
  out["transport"] = "shm";
  out["message_bytes"] = 8;
  out["cpus"] = {cpu_a, cpu_b};
  out["batches"] = batches;
  out["results"] = nlohmann::json::array();

  const pid_t child = fork();
  if (child < 0) return 1;
  const int rank = child == 0 ? 1 : 0;
  pin(rank == 0 ? cpu_a : cpu_b);
  const Pipe& out_pipe = rank == 0 ? p01 : p10;
  const Pipe& in_pipe = rank == 0 ? p10 : p01;
  const auto sync = [&] {
    char b = 0;
    if (write(out_pipe.fd[1], &b, 1) != 1 || read(in_pipe.fd[0], &b, 1) != 1) std::exit(1);
  };

  for (const char* variant : {"mpsc", "spsc", "transport"}) {
    if (which.find(variant) == std::string::npos) continue;
    for (const bool pingpong : {true, false}) {
      const long n = pingpong ? pp_iters : rate_msgs;
      std::vector<double> times;
      if (std::strcmp(variant, "transport") == 0) {
        run_transport(rank, out_pipe, in_pipe, pingpong, n, batches, times);
      } else {
        for (int bt = 0; bt < batches + 1; ++bt) {
          if (rank == 0) sh.reset();
          sync();
          double s;
          if (std::strcmp(variant, "mpsc") == 0) {
            s = run_queue(rank, sh.mpsc(1 - rank), sh.mpsc(rank), pingpong, n);
          } else {
            s = run_queue(rank, sh.spsc(1 - rank), sh.spsc(rank), pingpong, n);
          }
          sync();
          if (bt > 0) times.push_back(s);
        }
      }
      // The measuring side: rank 0 for ping-pong, rank 1 (the receiver) for the rate.
      const int measurer = pingpong ? 0 : 1;
      if (rank == 1 && measurer == 1) {
        const double m = median(times);
        if (write(res.fd[1], &m, sizeof m) != sizeof m) return 1;
      }
      if (rank == 0) {
        double m = median(times);
        if (measurer == 1 && read(res.fd[0], &m, sizeof m) != sizeof m) return 1;
        nlohmann::json r;
        r["variant"] = variant;
        r["test"] = pingpong ? "pingpong" : "msgrate";
        if (pingpong) {
          r["iterations"] = n;
          r["latency_us"] = m / static_cast<double>(n) / 2 * 1e6;
        } else {
          r["messages"] = n;
          r["rate_mmsg_s"] = static_cast<double>(n) / m / 1e6;
        }
        out["results"].push_back(r);
      }
    }
  }
  if (rank == 1) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  std::printf("%s\n", out.dump(2).c_str());
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
