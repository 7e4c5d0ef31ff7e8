// The parcelport registry, and the calling thread's device index.
#include <algorithm>
#include <atomic>
#include <iterator>
#include <mutex>
#include <string>
#include <vector>

#include "common/log.hpp"
#include "ferry/error.hpp"
#include "ferry/options.hpp"
#include "ferry/parcel.hpp"
#include "parcel/ferry_parcelport.hpp"

namespace ferry::parcel {

std::unique_ptr<ExposedMemory> Parcelport::expose_memory(void*, std::size_t) {
  throw Error("expose_memory: the " + name() + " parcelport has no one-sided get (Parcelport::has_get)");
}

void Parcelport::get(int, const std::vector<std::byte>&, std::size_t, void*, std::size_t, GetCallback) {
  throw Error("get: the " + name() + " parcelport has no one-sided get (Parcelport::has_get)");
}

namespace {
thread_local int tls_index = -1;
// Round-robin for threads that never set their index; relaxed: only uniqueness matters.
std::atomic<int> next_index{0};

// The kinds of ferry::parcel_mpi, known here by name only: asking for one that was not
// registered gets an error that says how to register it.
constexpr const char* kMpiKinds[] = {"mpi", "mpi_a", "mpix"};

struct Entry {
  std::string name;
  ParcelportFactory factory;
};

// Read and written only when parcelports are made or registered, never on the message path;
// a plain mutex is enough. A function-local static, so registering from any point of a
// program (even another static initialiser) finds it constructed.
struct Registry {
  std::mutex mutex;
  std::vector<Entry> entries{{"ferry", &detail::make_ferry_parcelport}};
};

Registry& registry() {
  static Registry r;
  return r;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}
}  // namespace

void set_thread_index(int index) noexcept { tls_index = index; }

int thread_index() noexcept {
  if (tls_index < 0) tls_index = next_index.fetch_add(1, std::memory_order_relaxed);
  return tls_index;
}

void register_parcelport(const std::string& name, ParcelportFactory factory) {
  if (name.empty()) throw Error("register_parcelport: name is empty");
  if (factory == nullptr) throw Error("register_parcelport: name='" + name + "': factory is null");
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mutex);
  for (const Entry& e : r.entries) {
    if (e.name != name) continue;
    if (e.factory == factory) return;
    throw Error("register_parcelport: name='" + name + "' is already registered with another factory");
  }
  r.entries.push_back({name, factory});
}

std::vector<std::string> parcelport_kinds() {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mutex);
  std::vector<std::string> names;
  for (const Entry& e : r.entries) names.push_back(e.name);
  return names;
}

std::unique_ptr<Parcelport> make_parcelport(const ParcelportOptions& options, Upcalls& upcalls) {
  ParcelportFactory factory = nullptr;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> g(r.mutex);
    for (const Entry& e : r.entries) {
      if (e.name == options.kind) factory = e.factory;
    }
  }
  // Outside the lock: a factory is collective and may take long.
  if (factory != nullptr) {
    // FERRY_LOG holds in programs whose parcelport makes no core Runtime (the MPI baselines).
    RuntimeSettings core;
    runtime_option_table().resolve_one("log", core);
    ::ferry::detail::set_log_level(core.log);
    return factory(options, upcalls);
  }

  const std::string what = "FERRY_PARCELPORT=" + options.kind;
  const std::vector<std::string> kinds = parcelport_kinds();
  const std::string valid = "registered here: " + join(kinds);
  if (std::find(std::begin(kMpiKinds), std::end(kMpiKinds), options.kind) != std::end(kMpiKinds)) {
#ifdef FERRY_PARCEL_MPI_BUILT
    throw Error(what + ": the MPI baseline parcelports are not registered in this program; link ferry::parcel_mpi "
                "(pkg-config ferry-parcel-mpi) and call ferry::parcel::register_mpi_parcelports() "
                "(ferry/parcel_mpi.hpp) before creating the parcelport; " + valid);
#else
    throw Error(what + ": this ferry was built without the MPI baseline parcelports (FERRY_WITH_MPI=OFF, or "
                "MPICH not found: install libmpich-dev and configure with FERRY_WITH_MPI=ON); " + valid);
#endif
  }
  const bool mpi_registered = std::find(kinds.begin(), kinds.end(), kMpiKinds[0]) != kinds.end();
  throw Error(what + " is not a parcelport; " + valid +
              (mpi_registered ? "" : " (and the MPI baselines mpi, mpi_a, mpix after ferry::parcel::register_mpi_parcelports())"));
}

}  // namespace ferry::parcel
