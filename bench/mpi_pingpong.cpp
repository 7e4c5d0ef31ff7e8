// ferry-mpi-pingpong: the MPI baseline for ferry-bench, built against MPICH (and, as
// ferry-mpi-pingpong-openmpi, against Open MPI).
//
//   pingpong: rank 0 MPI_Send / MPI_Recv with rank 1, which answers each message with one of
//             the same size; half_rtt_us as in ferry-bench (median of --reps chunks).
//   msgrate:  rank 0 posts a window of MPI_Isend, waits for them, then MPI_Recv's an 8-byte
//             ack that rank 1 sends once its window of pre-posted MPI_Irecv completed.
//
// Same options, schedule and JSON keys as ferry-bench, so compare.py can put them side by side.
//   mpiexec.hydra -n 2 build/bin/ferry-mpi-pingpong pingpong --size 8 --iters 10000 --json
//   mpirun.openmpi -n 2 build/bin/ferry-mpi-pingpong-openmpi msgrate --size 16384 --window 64 --json
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.hpp"

namespace {

using bench::Clock;

constexpr int kTagData = 1;
constexpr int kTagAck = 2;

[[noreturn]] void die(int rank, const std::string& what) {
  std::fprintf(stderr, "ferry-mpi-pingpong: rank %d: %s\n", rank, what.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

void check_message(int rank, const unsigned char* p, std::size_t n, int sender, bool full) {
  if (!bench::check_ends(p, n, sender, 0) || (full && bench::check_pattern(p, n, sender, 0) >= 0)) {
    die(rank, "message of " + std::to_string(n) + " bytes from rank " + std::to_string(sender) + " has a wrong payload");
  }
}

int expect_count(MPI_Status& st) {
  int got = 0;
  MPI_Get_count(&st, MPI_BYTE, &got);
  return got;
}

nlohmann::json base(const char* name, std::int64_t size, int ranks) {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(version, &len);
  std::string lib(version, static_cast<std::size_t>(len));
  if (const auto nl = lib.find('\n'); nl != std::string::npos) lib.resize(nl);
  // Open MPI counts the terminating NUL in len.
  while (!lib.empty() && lib.back() == '\0') lib.pop_back();
  // "provider" names the MPI library the program was linked with, as the library reports it.
  const char* provider = lib.find("Open MPI") != std::string::npos ? "openmpi"
                         : lib.find("MPICH") != std::string::npos  ? "mpich"
                                                                   : "mpi";
  return nlohmann::json{{"bench", name},         {"size", size},   {"threads", 1},    {"devices", 1},
                        {"provider", provider}, {"ranks", ranks}, {"mpi_library", lib}};
}

int pingpong(const bench::PingpongArgs& a, int rank, int ranks) {
  const auto size = static_cast<std::size_t>(a.size);
  const int n = static_cast<int>(size);
  std::vector<unsigned char> out(std::max<std::size_t>(size, 1));
  std::vector<unsigned char> in(std::max<std::size_t>(size, 1));
  bench::fill_pattern(out.data(), size, rank, 0);
  const std::int64_t total = a.warmup + a.iters;
  const std::int64_t reps = std::min(a.reps, a.iters);
  std::vector<double> chunk_us;
  double sum_s = 0.0;
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    std::int64_t i = 0;
    auto round_trip = [&] {
      MPI_Status st;
      MPI_Send(out.data(), n, MPI_BYTE, 1, kTagData, MPI_COMM_WORLD);
      MPI_Recv(in.data(), n, MPI_BYTE, 1, kTagData, MPI_COMM_WORLD, &st);
      if (expect_count(st) != n) die(rank, "short reply");
      check_message(rank, in.data(), size, 1, i == 0 || i == total - 1);
      ++i;
    };
    while (i < a.warmup) round_trip();
    for (std::int64_t r = 0; r < reps; ++r) {
      const std::int64_t k = a.iters / reps + (r < a.iters % reps ? 1 : 0);
      const auto t0 = Clock::now();
      for (std::int64_t j = 0; j < k; ++j) round_trip();
      const double s = bench::seconds_since(t0);
      sum_s += s;
      chunk_us.push_back(s / static_cast<double>(k) / 2.0 * 1e6);
    }
  } else if (rank == 1) {
    for (std::int64_t i = 0; i < total; ++i) {
      MPI_Status st;
      MPI_Recv(in.data(), n, MPI_BYTE, 0, kTagData, MPI_COMM_WORLD, &st);
      if (expect_count(st) != n) die(rank, "short message");
      check_message(rank, in.data(), size, 0, i == 0 || i == total - 1);
      MPI_Send(out.data(), n, MPI_BYTE, 0, kTagData, MPI_COMM_WORLD);
    }
  }
  if (rank == 0) {
    const double med = bench::median(chunk_us);
    const double avg = sum_s / static_cast<double>(a.iters) / 2.0 * 1e6;
    const double lo = *std::min_element(chunk_us.begin(), chunk_us.end());
    const double hi = *std::max_element(chunk_us.begin(), chunk_us.end());
    if (a.json) {
      auto j = base("mpi_pingpong", a.size, ranks);
      j["iters"] = a.iters;
      j["warmup"] = a.warmup;
      j["reps"] = reps;
      j["half_rtt_us"] = med;
      j["half_rtt_us_mean"] = avg;
      j["half_rtt_us_min"] = lo;
      j["half_rtt_us_max"] = hi;
      bench::print_json(j);
    } else {
      std::printf("mpi_pingpong size %lld B: half round trip %.3f us (median of %lld chunks; mean %.3f, min %.3f, max %.3f)\n",
                  static_cast<long long>(a.size), med, static_cast<long long>(reps), avg, lo, hi);
    }
  }
  return 0;
}

int msgrate(const bench::MsgrateArgs& a, int rank, int ranks) {
  const auto size = static_cast<std::size_t>(a.size);
  const int n = static_cast<int>(size);
  const std::int64_t warmup = a.warmup < 0 ? std::min(a.window, a.count) : a.warmup;
  const auto w = static_cast<std::size_t>(a.window);
  std::vector<unsigned char> out(std::max<std::size_t>(size, 8));
  bench::fill_pattern(out.data(), size, rank, 0);
  // Separate receive buffers: MPI forbids pending receives that overlap.
  std::vector<unsigned char> in(rank == 1 ? std::max<std::size_t>(size, 1) * w : 8);
  std::vector<MPI_Request> reqs(w);
  std::uint64_t ack = 0;
  auto windows = [&](std::int64_t count, auto&& per_window) {
    for (std::int64_t done = 0; done < count;) {
      const std::int64_t k = std::min(a.window, count - done);
      per_window(static_cast<int>(k), done == 0, done + k == count);
      done += k;
    }
  };
  auto send_window = [&](int k, bool, bool) {
    for (int i = 0; i < k; ++i) MPI_Isend(out.data(), n, MPI_BYTE, 1, kTagData, MPI_COMM_WORLD, &reqs[i]);
    MPI_Waitall(k, reqs.data(), MPI_STATUSES_IGNORE);
    MPI_Recv(&ack, 8, MPI_BYTE, 1, kTagAck, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  };
  auto recv_window = [&](int k, bool first, bool last) {
    const std::size_t stride = std::max<std::size_t>(size, 1);
    for (int i = 0; i < k; ++i) {
      MPI_Irecv(in.data() + stride * static_cast<std::size_t>(i), n, MPI_BYTE, 0, kTagData, MPI_COMM_WORLD, &reqs[i]);
    }
    MPI_Waitall(k, reqs.data(), MPI_STATUSES_IGNORE);
    for (int i = 0; i < k; ++i) {
      check_message(rank, in.data() + stride * static_cast<std::size_t>(i), size, 0,
                    (first && i == 0) || (last && i == k - 1));
    }
    ++ack;
    MPI_Send(&ack, 8, MPI_BYTE, 0, kTagAck, MPI_COMM_WORLD);
  };
  MPI_Barrier(MPI_COMM_WORLD);
  double secs = 0.0;
  if (rank == 0) {
    windows(warmup, send_window);
    const auto t0 = Clock::now();
    windows(a.count, send_window);
    secs = bench::seconds_since(t0);
  } else if (rank == 1) {
    windows(warmup, recv_window);
    windows(a.count, recv_window);
  }
  if (rank == 0) {
    const double rate = static_cast<double>(a.count) / secs;
    if (a.json) {
      auto j = base("mpi_msgrate", a.size, ranks);
      j["count"] = a.count;
      j["window"] = a.window;
      j["warmup"] = warmup;
      j["total_messages"] = a.count;
      j["seconds"] = secs;
      j["msgs_per_s"] = rate;
      j["mbytes_per_s"] = rate * static_cast<double>(size) / 1e6;
      bench::print_json(j);
    } else {
      std::printf("mpi_msgrate size %lld B: %.0f msgs/s (%lld messages in windows of %lld, %.3f s)\n",
                  static_cast<long long>(a.size), rate, static_cast<long long>(a.count),
                  static_cast<long long>(a.window), secs);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ferry-mpi-pingpong: MPI ping-pong and message rate, the baseline for ferry-bench"};
  app.name("ferry-mpi-pingpong");
  app.require_subcommand(1);
  bench::PingpongArgs pp;
  bench::add_pingpong_options(app.add_subcommand("pingpong", "MPI_Send/MPI_Recv ping-pong; half round trip time"),
                              pp);
  bench::MsgrateArgs mr;
  bench::add_msgrate_options(app.add_subcommand("msgrate", "windows of MPI_Isend, acknowledged; messages/s"), mr);

  // Parsed before MPI_Init so that a bad command line exits 2 without starting MPI; only the
  // first rank (hydra sets PMI_RANK, Open MPI's mpirun OMPI_COMM_WORLD_RANK) reports it.
  const char* env_rank = std::getenv("PMI_RANK");
  if (env_rank == nullptr) env_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const bool quiet = env_rank != nullptr && std::string(env_rank) != "0";
  if (const int code = bench::parse_or_exit_code(app, argc, argv, quiet); code >= 0) return code;

  MPI_Init(&argc, &argv);
  int rank = 0;
  int ranks = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (ranks < 2) {
    if (rank == 0) std::fprintf(stderr, "ferry-mpi-pingpong: needs at least 2 ranks, got %d (mpiexec.hydra -n 2)\n", ranks);
    MPI_Finalize();
    return bench::exit_usage;
  }
  if ((pp.size > INT32_MAX) || (mr.size > INT32_MAX)) {
    if (rank == 0) std::fprintf(stderr, "ferry-mpi-pingpong: --size above 2^31-1 is not supported\n");
    MPI_Finalize();
    return bench::exit_usage;
  }
  int rc = 0;
  if (app.got_subcommand("pingpong")) rc = pingpong(pp, rank, ranks);
  if (app.got_subcommand("msgrate")) rc = msgrate(mr, rank, ranks);
  MPI_Finalize();
  return rc;
}
