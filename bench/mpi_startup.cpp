// ferry-mpi-startup: ferry-startup's job in MPI, built against MPICH (and, as
// ferry-mpi-startup-openmpi, against Open MPI): MPI_Init, one MPI_Barrier, MPI_Finalize, and
// one JSON line per rank with the same keys (init_s, barrier_s, finalize_s, maxrss_kib, and
// the resident set by kind after the barrier: rss_anon_kib, rss_file_kib, rss_shmem_kib, and
// pss_kib).
//   mpiexec.hydra -n 16 build/bin/ferry-mpi-startup
#include <mpi.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "rss_parts.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace

int main(int argc, char** argv) {
  const auto t0 = Clock::now();
  MPI_Init(&argc, &argv);
  const auto t1 = Clock::now();
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t2 = Clock::now();
  const bench::RssParts parts = bench::rss_parts();
  int rank = 0;
  int ranks = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(version, &len);
  std::string lib(version, static_cast<std::size_t>(len));
  const char* provider = lib.find("Open MPI") != std::string::npos ? "openmpi"
                         : lib.find("MPICH") != std::string::npos  ? "mpich"
                                                                   : "mpi";
  MPI_Finalize();
  const auto t3 = Clock::now();
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf(
      "{\"bench\":\"startup\",\"rank\":%d,\"ranks\":%d,\"provider\":\"%s\",\"init_s\":%.6f,\"barrier_s\":%.6f,"
      "\"finalize_s\":%.6f,\"maxrss_kib\":%ld,\"rss_anon_kib\":%ld,\"rss_file_kib\":%ld,\"rss_shmem_kib\":%ld,\"pss_kib\":%ld}\n",
      rank, ranks, provider, seconds(t0, t1), seconds(t1, t2), seconds(t2, t3), ru.ru_maxrss, parts.anon_kib,
      parts.file_kib, parts.shmem_kib, parts.pss_kib);
  std::fflush(stdout);
  return 0;
}
