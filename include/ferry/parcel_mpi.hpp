// ferry/parcel_mpi.hpp — the MPI baseline parcelports, in their own library (ferry::parcel_mpi,
// pkg-config ferry-parcel-mpi), installed only when ferry was built with MPICH.
//
// HPX's MPI parcelport, modelled for comparison with the ferry parcelport (parcel.hpp lists the
// kinds). The product libraries, ferry::parcel and ferry::amt, do not depend on MPI; a program
// that wants the baselines calls register_mpi_parcelports() once, before it creates a
// parcelport or an amt::Runtime, and may then select them by FERRY_PARCELPORT or
// ParcelportOptions::kind / amt::Options::parcelport. Their processes must be launched by
// MPICH's launcher (mpiexec.hydra), which the parcelports initialise MPI under.
#pragma once

namespace ferry::parcel {

// Registers "mpi", "mpi_a" and "mpix" with register_parcelport. Any thread; calling it again
// does nothing.
void register_mpi_parcelports();

}  // namespace ferry::parcel
