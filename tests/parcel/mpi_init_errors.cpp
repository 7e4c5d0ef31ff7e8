// The MPI parcelports and the state of MPI in the process: one initialised without
// MPI_THREAD_MULTIPLE, and one already finalized, are each refused with an error that says so.
// One rank under mpiexec.hydra; exit 0 when both errors came as expected.
#include <mpi.h>

#include <cstdio>
#include <string>

#include "ferry/parcel.hpp"
#include "ferry/parcel_mpi.hpp"
#include "test_support.hpp"

using namespace ferry::parcel;

int main() {
  register_mpi_parcelports();
  ParcelportOptions o;
  o.kind = "mpi";
  int failures = 0;
  const auto expect = [&](const char* when, const std::string& needle) {
    const std::string what = test::error_of(o);
    const bool ok = what.find(needle) != std::string::npos;
    std::printf("%s: %s: %s\n", when, ok ? "ok" : "FAILED", what.c_str());
    failures += ok ? 0 : 1;
  };
  int provided = MPI_THREAD_MULTIPLE;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SINGLE, &provided);
  if (provided == MPI_THREAD_MULTIPLE) {
    std::printf("FAILED: MPI gave MPI_THREAD_MULTIPLE when asked for MPI_THREAD_SINGLE, so the case cannot be made\n");
    ++failures;
  } else {
    expect("initialised without MPI_THREAD_MULTIPLE", "MPI parcelport needs MPI_THREAD_MULTIPLE but MPI provides");
  }
  MPI_Finalize();
  expect("after MPI_Finalize", "MPI parcelport: MPI has already been finalized in this process");
  return failures == 0 ? 0 : 1;
}
