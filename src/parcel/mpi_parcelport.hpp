// mpi_parcelport.hpp — the MPI baseline transports (kinds mpi, mpi_a, mpix), built with MPICH only.
#pragma once

#include <memory>

#include "ferry/parcel.hpp"

namespace ferry::parcel::detail {

// options.kind selects the variant: "mpi", "mpi_a" (aggregation) or "mpix" (options.devices
// communicators, 0 → 2). Collective over MPI_COMM_WORLD. Throws ferry::Error when MPI cannot give
// MPI_THREAD_MULTIPLE or an option is invalid.
std::unique_ptr<Transport> make_mpi_transport(const TransportOptions& options, Upcalls& upcalls);

}  // namespace ferry::parcel::detail
