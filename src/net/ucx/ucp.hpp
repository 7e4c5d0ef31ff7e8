// ucp.hpp — what the UCX backend's files share: the context and UCX's status codes as errno.
#pragma once

#include <ucp/api/ucp.h>

#include <cerrno>
#include <string>

#include "net/ucx/ucx_context.hpp"

namespace ferry::net::ucx {

class Context {
 public:
  Context();
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ucp_context_h get() const noexcept { return context_; }
  // UCX_TLS as UCX read it ("all" by default).
  const std::string& tls() const noexcept { return tls_; }

 private:
  ucp_context_h context_ = nullptr;
  std::string tls_;
};

// UCX's status as a negative errno value, so the core sees one vocabulary whatever the
// backend: a peer that went away is one of the codes the core counts as "peer gone".
[[gnu::cold]] int to_errno_slow(ucs_status_t s) noexcept;
inline int to_errno(ucs_status_t s) noexcept {
  if (__builtin_expect(s == UCS_OK, 1)) return 0;
  return to_errno_slow(s);
}

// "ucp_init: No such device (-4)"
std::string ucs_error(const char* call, ucs_status_t s);

// The transports UCX picked for an endpoint and what each lane does, from ucp_ep_print_info:
// "sysv/memory (am,am_bw); posix/memory (); cma/memory (rma_bw)".
std::string lanes_of(ucp_ep_h ep);
// Whether UCX does RMA on `ep` itself (an RMA lane: InfiniBand, RoCE) rather than emulating it
// over active messages (its shared-memory transports, tcp; see am_rma.hpp).
bool has_rma_lane(ucp_ep_h ep);

}  // namespace ferry::net::ucx
