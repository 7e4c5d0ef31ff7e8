// mpi_coll.cpp — ferry-mpi-coll (MPICH) and ferry-mpi-coll-openmpi: the MPI baseline of
// ferry-bench coll, OSU-style, with the same operations, sizes and timing (coll_bench.hpp).
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "coll_bench.hpp"

int main(int argc, char** argv) {
  CLI::App app{"ferry-mpi-coll: MPI's collectives, timed as ferry-bench coll times ferry's"};
  app.name("ferry-mpi-coll");
  bench::CollArgs a;
  bench::add_coll_options(&app, a);
  const char* env_rank = std::getenv("PMI_RANK");
  const bool quiet = env_rank != nullptr && std::string(env_rank) != "0";
  if (const int code = bench::parse_or_exit_code(app, argc, argv, quiet); code >= 0) return code;
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const std::size_t count = bench::coll_count(a.size);
  const auto nz = static_cast<std::size_t>(n);
  std::vector<unsigned char> send(std::max<std::size_t>(1, a.size * nz + count * sizeof(double) * nz)),
      recv(std::max<std::size_t>(1, a.size * nz + count * sizeof(double)));
  const int c = static_cast<int>(count), s = static_cast<int>(a.size);
  const auto op = [&] {
    if (a.op == "barrier") {
      MPI_Barrier(MPI_COMM_WORLD);
    } else if (a.op == "bcast") {
      MPI_Bcast(send.data(), s, MPI_BYTE, 0, MPI_COMM_WORLD);
    } else if (a.op == "reduce") {
      MPI_Reduce(send.data(), recv.data(), c, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    } else if (a.op == "allreduce") {
      MPI_Allreduce(send.data(), recv.data(), c, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    } else if (a.op == "reduce_scatter") {
      MPI_Reduce_scatter_block(send.data(), recv.data(), c, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    } else if (a.op == "allgather") {
      MPI_Allgather(send.data(), s, MPI_BYTE, recv.data(), s, MPI_BYTE, MPI_COMM_WORLD);
    } else {
      MPI_Alltoall(send.data(), s, MPI_BYTE, recv.data(), s, MPI_BYTE, MPI_COMM_WORLD);
    }
  };
  nlohmann::json j = bench::time_coll(
      a, n, op, [] { MPI_Barrier(MPI_COMM_WORLD); },
      [](double x) {
        double m = 0;
        MPI_Allreduce(&x, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        return m;
      });
#ifdef OMPI_MAJOR_VERSION
  j["impl"] = "openmpi";
#else
  j["impl"] = "mpich";
#endif
  if (rank == 0) {
    if (a.json) {
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%s %zu B, %d ranks: %.3f us\n", a.op.c_str(), a.size, n, j["latency_us"].get<double>());
    }
  }
  MPI_Finalize();
  return 0;
}
