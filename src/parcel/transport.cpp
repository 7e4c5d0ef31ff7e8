#include <atomic>

#include "ferry/error.hpp"
#include "ferry/parcel.hpp"
#include "parcel/ferry_parcelport.hpp"
#ifdef FERRY_HAVE_MPI
#include "parcel/mpi_parcelport.hpp"
#endif

namespace ferry::parcel {

namespace {
thread_local int tls_index = -1;
// Round-robin for threads that never set their index; relaxed: only uniqueness matters.
std::atomic<int> next_index{0};
}  // namespace

void set_thread_index(int index) noexcept { tls_index = index; }

int thread_index() noexcept {
  if (tls_index < 0) tls_index = next_index.fetch_add(1, std::memory_order_relaxed);
  return tls_index;
}

std::vector<std::string> transport_kinds() {
#ifdef FERRY_HAVE_MPI
  return {"ferry", "mpi", "mpi_a", "mpix"};
#else
  return {"ferry"};
#endif
}

std::unique_ptr<Transport> make_transport(const TransportOptions& options, Upcalls& upcalls) {
  if (options.kind == "ferry") return detail::make_ferry_transport(options, upcalls);
#ifdef FERRY_HAVE_MPI
  if (options.kind == "mpi" || options.kind == "mpi_a" || options.kind == "mpix") {
    return detail::make_mpi_transport(options, upcalls);
  }
#endif
  std::string valid;
  for (const auto& k : transport_kinds()) valid += (valid.empty() ? "" : ", ") + k;
  throw Error("parcelport '" + options.kind + "' is unknown or not built here; valid: " + valid);
}

}  // namespace ferry::parcel
