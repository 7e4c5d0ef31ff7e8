// op_context.hpp — what a transport is handed with each operation and hands back with its
// event.
//
// Every operation the core gives a transport passes a pointer to an OpContext: 64 bytes that
// belong to the backend from the post until the operation's event (libfabric keeps its
// fi_context2 there, satisfying FI_CONTEXT and FI_CONTEXT2; the shared-memory and self
// backends link their completions through it). The core's own records of an operation derive
// from it and keep what kind of operation it is in `owner`; a backend never touches it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace ferry::net {

struct OpContext {
  static constexpr std::size_t kBackendBytes = 64;
  alignas(8) unsigned char backend[kBackendBytes];
  std::atomic<std::uint8_t> owner{0};  // the core's: what kind of operation this is
};

}  // namespace ferry::net
