// ParcelportOptions out of range are refused by every parcelport before its collective set-up
// (no runtime, no MPI_Init): the error names the option and its value. One process, no launcher.
#include <gtest/gtest.h>

#include <climits>
#include <cstdlib>
#include <string>

#include "ferry/error.hpp"
#include "ferry/parcel.hpp"
#include "test_support.hpp"
#ifdef FERRY_HAVE_PARCEL_MPI
#include "ferry/parcel_mpi.hpp"
#endif

using namespace ferry::parcel;

namespace {

using test::error_of;

ParcelportOptions with_kind(const char* kind) {
  ParcelportOptions o;
  o.kind = kind;
  return o;
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST(ParcelportOptions, FerryRefusesAHeaderTooSmallForItsTable) {
  ParcelportOptions o = with_kind("ferry");
  o.max_header = 4;
  EXPECT_HAS(error_of(o), "ParcelportOptions::max_header=4 is too small");
}

TEST(ParcelportOptions, FerryRefusesHeaderReceivesOutOfRange) {
  for (int bad : {-1, 1025}) {
    ParcelportOptions o = with_kind("ferry");
    o.header_recvs = bad;
    EXPECT_HAS(error_of(o), "ParcelportOptions::header_recvs=" + std::to_string(bad) + " is out of range");
  }
}

// Its worker threads share the devices, which the serialized lock model does not allow. (This
// one does start a runtime: the lock model is the core's setting, read there.)
TEST(ParcelportOptions, FerryRefusesTheSerializedLockModel) {
  ::setenv("FERRY_LOCK_MODEL", "serialized", 1);
  const std::string error = error_of(with_kind("ferry"));
  ::unsetenv("FERRY_LOCK_MODEL");
  EXPECT_HAS(error, "FERRY_LOCK_MODEL=serialized: the parcel layer's worker threads share its devices");
}

#ifdef FERRY_HAVE_PARCEL_MPI
TEST(ParcelportOptions, MpiKindsRefuseAMaxHeaderOutsideTheirRange) {
  register_mpi_parcelports();
  for (const char* kind : {"mpi", "mpi_a", "mpix"}) {
    for (std::size_t bad : {std::size_t{4}, static_cast<std::size_t>(INT_MAX) + 1}) {
      ParcelportOptions o = with_kind(kind);
      o.max_header = bad;
      EXPECT_HAS(error_of(o), "MPI parcelport: max_header=" + std::to_string(bad) + " must lie in");
    }
  }
}

TEST(ParcelportOptions, MpixRefusesANegativeDeviceCount) {
  register_mpi_parcelports();
  ParcelportOptions o = with_kind("mpix");
  o.devices = -2;
  EXPECT_HAS(error_of(o), "MPI parcelport: devices=-2 must be >= 0");
}
#endif

}  // namespace
