// mpi_parcelport.cpp — the MPI baseline parcelports' set-up and teardown: MPI initialized once
// per process with MPI_THREAD_MULTIPLE (and finalized at exit), the options checked, one
// duplicated communicator per device with its header receive posted; pending receives
// cancelled at teardown. Also the MPI helpers the other files share, and the registration of
// "mpi", "mpi_a" and "mpix". (The design, and which file owns which path:
// mpi_parcelport_impl.hpp.)
#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>

#include "ferry/error.hpp"
#include "ferry/parcel.hpp"
#include "ferry/parcel_mpi.hpp"
#include "parcel/mpi_header.hpp"
#include "parcel/mpi_parcelport_impl.hpp"

namespace ferry::parcel::detail {

namespace {

std::string mpi_error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, static_cast<std::size_t>(len));
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown thread level";
  }
}

// MPI can be initialized once per process only, so the parcelport that initialized it cannot
// finalize it when destroyed (a second parcelport in the same process, e.g. the next variant in a
// test, would then be impossible). It finalizes at process exit instead.
void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void ensure_mpi_initialized() {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) throw Error("MPI parcelport: MPI has already been finalized in this process");
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    std::atexit(finalize_at_exit);
  } else {
    check(MPI_Query_thread(&provided), "MPI_Query_thread");
  }
  if (provided != MPI_THREAD_MULTIPLE) {
    throw Error(std::string("MPI parcelport needs MPI_THREAD_MULTIPLE but MPI provides ") +
                thread_level_name(provided) + " (provided=" + std::to_string(provided) + ")");
  }
}

}  // namespace

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw Error(std::string(what) + " failed: " + mpi_error_string(rc));
}

void* checked_malloc(std::size_t size, const char* what) {
  void* p = std::malloc(size != 0 ? size : 1);  // non-null even for an empty nzc
  if (p == nullptr) throw Error(std::string(what) + ": cannot allocate " + std::to_string(size) + " bytes");
  return p;
}

// Made only by make_mpi_parcelport, which the registry calls under "mpi", "mpi_a" and "mpix".
MpiParcelport::MpiParcelport(const ParcelportOptions& options, Upcalls& upcalls)
    : upcalls_(upcalls), kind_(options.kind) {
  max_header_ = options.max_header != 0 ? options.max_header : kDefaultMaxHeader;
  if (max_header_ < sizeof(MpiParcelHeader) || max_header_ > static_cast<std::size_t>(INT_MAX)) {
    throw Error("MPI parcelport: max_header=" + std::to_string(options.max_header) + " must lie in [" +
                std::to_string(sizeof(MpiParcelHeader)) + ", " + std::to_string(INT_MAX) + "] bytes");
  }
  int device_count = 1;
  if (kind_ == "mpix") {
    if (options.devices < 0) {
      throw Error("MPI parcelport: devices=" + std::to_string(options.devices) + " must be >= 0");
    }
    device_count = options.devices != 0 ? options.devices : 2;
  }
  aggregate_ = kind_ == "mpi_a";

  ensure_mpi_initialized();
  check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
  void* attr = nullptr;
  int found = 0;
  check(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &attr, &found), "MPI_Comm_get_attr(MPI_TAG_UB)");
  tag_ub_ = found ? *static_cast<int*>(attr) : 32767;  // 32767: the least the standard allows

  for (int i = 0; i < device_count; ++i) {
    auto dev = std::make_unique<Device>();
    check(MPI_Comm_dup(MPI_COMM_WORLD, &dev->comm), "MPI_Comm_dup");
    // Errors come back as codes so they can become ferry::Error instead of aborting the job.
    check(MPI_Comm_set_errhandler(dev->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    dev->header_buffer.resize(max_header_);
    post_header_receive(*dev);
    devices_.push_back(std::move(dev));
  }
  if (aggregate_) {
    for (int i = 0; i < size_; ++i) destinations_.push_back(std::make_unique<Destination>());
  }
}

MpiParcelport::~MpiParcelport() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // the application finalized MPI first; nothing can be released now
  // Whatever is still pending here was abandoned by the caller (no barrier before teardown);
  // receives are cancelled, sends are left to complete on their own.
  for (auto& dev : devices_) {
    if (dev->header_request != MPI_REQUEST_NULL) {
      MPI_Cancel(&dev->header_request);
      MPI_Wait(&dev->header_request, MPI_STATUS_IGNORE);
    }
    for (auto& c : dev->receivers) {
      if (c->request != MPI_REQUEST_NULL) {
        MPI_Cancel(&c->request);
        MPI_Wait(&c->request, MPI_STATUS_IGNORE);
      }
    }
    for (auto& c : dev->senders) {
      if (c->request != MPI_REQUEST_NULL) MPI_Request_free(&c->request);
    }
    MPI_Comm_free(&dev->comm);
  }
}

namespace {

// options.kind selects the variant: "mpi", "mpi_a" (aggregation) or "mpix" (options.devices
// communicators, 0 → 2). Collective over MPI_COMM_WORLD. Throws ferry::Error when MPI cannot give
// MPI_THREAD_MULTIPLE or an option is invalid.
std::unique_ptr<Parcelport> make_mpi_parcelport(const ParcelportOptions& options, Upcalls& upcalls) {
  return std::make_unique<MpiParcelport>(options, upcalls);
}

}  // namespace
}  // namespace ferry::parcel::detail

namespace ferry::parcel {

void register_mpi_parcelports() {
  for (const char* kind : {"mpi", "mpi_a", "mpix"}) register_parcelport(kind, &detail::make_mpi_parcelport);
}

}  // namespace ferry::parcel
