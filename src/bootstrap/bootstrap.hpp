// bootstrap.hpp — how the ranks of a job find each other.
//
// A Bootstrap gives a process its rank and the job size, a key-value store for exchanging
// endpoint addresses, and a barrier. It is used only at setup and teardown, never on a
// communication path, so implementations may block and allocate freely.
//
// Contract:
//  - put(key, value) publishes `value` under (this rank, key). Values are arbitrary bytes.
//  - fence() is collective: after it returns on every rank, every put made before the fence
//    on any rank is visible to get() on every rank.
//  - get(rank, key) returns what `rank` put under `key`; it throws ferry::Error if absent.
//  - barrier() is collective and orders nothing but time.
//  - Calls are made by one thread at a time (the runtime serialises them).
//  - Every failure (server gone, malformed reply, unknown key) throws ferry::Error naming
//    the bootstrap kind and what went wrong; nothing here aborts or hangs silently on a
//    closed connection.
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace ferry::bootstrap {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  [[nodiscard]] virtual int rank() const = 0;
  [[nodiscard]] virtual int size() const = 0;
  // "single", "pmi1" or "pmix".
  [[nodiscard]] virtual std::string_view kind() const = 0;
  virtual void put(std::string_view key, std::string_view value) = 0;
  virtual void fence() = 0;
  [[nodiscard]] virtual std::string get(int rank, std::string_view key) = 0;
  virtual void barrier() = 0;
  // Best effort: tell the launcher the job failed. Never throws.
  virtual void abort(int code, std::string_view message) noexcept = 0;
};

// kind: "auto", "single", "pmi1" or "pmix". "auto" picks pmix when PMIX_RANK is set, pmi1 when
// PMI_FD is set, and single otherwise. An unknown kind, or a kind this build lacks (pmix
// without libpmix), throws ferry::Error listing the valid kinds.
std::unique_ptr<Bootstrap> make_bootstrap(std::string_view kind);

// The kind "auto" resolves to in the current environment.
std::string_view detect_bootstrap_kind();

}  // namespace ferry::bootstrap
