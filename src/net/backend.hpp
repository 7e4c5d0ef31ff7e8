// backend.hpp — what a network backend registers with ferry, and how the core finds it.
//
// A backend is a folder under src/net/ with one CMake call, ferry_backend(), and one
// registration line, add_subdirectory(<name>) in src/net/CMakeLists.txt. A backend built into
// libferry (shm, self) defines ferry_backend_<name>(); a module (ofi, ucx: libferry-<name>.so,
// the only objects that link libfabric or UCX) defines ferry_backend_v1() with
// FERRY_BACKEND_MODULE, and the registry (registry.hpp) loads it with dlopen the first time a
// job or a tool asks for it, so a process that never asks maps neither library.
//
// The core plans transports from a backend's reach (which peers its transports can talk to)
// and never names a backend: FERRY_TRANSPORT and FERRY_NETWORK name them. A backend's own
// settings are option rows it declares beside its registration (ferry_backend(... OPTIONS),
// ferry/options.hpp's BackendOptionTable); their values reach open() by name (OpenParams).
//
// Concurrency: a BackendInfo is immutable static data. open() and describe() are called by
// one thread at a time (runtime construction, tools); a Backend's make_transport() likewise;
// the transports it makes follow transport.hpp's contract.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/error.hpp"
#include "ferry/options.hpp"
#include "net/transport.hpp"

namespace ferry::net {

// Which peers a backend's transports reach: the rank itself, ranks of its host, any rank.
enum class Reach : std::uint8_t { self = 1, host = 2, network = 4 };
constexpr unsigned operator|(Reach a, Reach b) noexcept { return unsigned(a) | unsigned(b); }
constexpr unsigned operator|(unsigned a, Reach b) noexcept { return a | unsigned(b); }
constexpr bool reaches(unsigned set, Reach r) noexcept { return (set & unsigned(r)) != 0; }

// What opening a backend for a job needs.
struct OpenParams {
  // The job's values of every backend's option rows (ferry/options.hpp's BackendOptionTable),
  // by row name: a backend reads its own, and another's only where that row says it serves it
  // too (self's queue from shm_cells, ucx's RMA within a host from shm_copy). Kept neutral so
  // the core passes them on without knowing any.
  std::vector<std::pair<std::string, OptionValue>> options;
  // FERRY_TRANSPORT named this backend for every peer, and every rank shares this host.
  bool one_host = false;
  // The devices' packet (FERRY_PACKET_SIZE): the largest frame ferry sends as one message.
  std::size_t packet_size = 0;

  // The value of the row `name`. Throws ferry::Error when no backend declares it.
  const OptionValue& option(std::string_view name) const {
    for (const auto& [n, v] : options) {
      if (n == name) return v;
    }
    throw Error("backend option '" + std::string(name) + "' was not resolved (no backend declares it)");
  }
};

// What the core asks of one transport.
struct TransportParams {
  int rank = 0;                 // this process's rank in [0, size)
  int size = 1;                 // the job size
  int device = 0;               // the ferry device the transport serves
  std::size_t packet_size = 0;  // the device's packet payload: the largest eager message it sends
  std::size_t packets = 0;      // the device's packet budget (FERRY_PACKETS)
  // The lock model never lets two threads into the device at once (every model but lockless).
  bool serialized = false;
  // The keepalive's own endpoint: small messages only, no RMA, never serialized.
  bool heartbeat = false;
  std::vector<bool> away;  // by rank: on another host
};

// One backend opened in this process: a libfabric fabric and domain, a UCP context, or
// nothing for backends that need no process-wide state. Outlives every transport it made.
class Backend {
 public:
  virtual ~Backend() = default;
  // Throws ferry::Error naming the parameter or the resource that failed.
  virtual std::unique_ptr<Transport> make_transport(const TransportParams& params) = 0;
  // What Runtime::provider() reports when this backend reaches the network ("tcp;ofi_rxm").
  virtual std::string provider() const = 0;
};

// One fact for ferry-info: a label and its value ("version", "libfabric 1.17").
using Fact = std::pair<std::string, std::string>;

// The registration: static data and functions, one per backend.
struct BackendInfo {
  const char* name;     // "shm", "self", "ofi", "ucx": what FERRY_TRANSPORT and FERRY_NETWORK say
  const char* summary;  // one line for ferry-info
  unsigned reach;       // Reach bits
  // Throws ferry::Error when the backend cannot serve here (no provider, no transport).
  std::unique_ptr<Backend> (*open)(const OpenParams& params);
  // Facts for ferry-info; `probe`: also open what can be opened and report its limits.
  // Never throws: what cannot be found out is itself a fact.
  std::vector<Fact> (*describe)(bool probe);
  // A backend's own table of calls for the deprecated tool functions of ferry/tools.hpp
  // (ofi: ofi/tools.hpp's OfiTools), or null.
  const void* tools = nullptr;
};

}  // namespace ferry::net

// A module's one exported symbol. The registry checks the name it returns.
#define FERRY_BACKEND_MODULE(info)                                                      \
  extern "C" __attribute__((visibility("default"))) const ::ferry::net::BackendInfo* \
  ferry_backend_v1() {                                                                  \
    return &(info);                                                                     \
  }
