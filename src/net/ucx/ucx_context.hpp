// ucx_context.hpp — the UCX backend (FERRY_TRANSPORT=ucx): one UCP context per process, one
// ucp_worker per ferry device, behind net::Transport.
//
// This header names no UCX type. The backend is the module libferry-ucx.so (backend.cpp), which
// only the registry loads; a build without UCX registers it as absent, with the reason.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "net/transport.hpp"

namespace ferry::net::ucx {

// The process's UCP context (features: tag matching, RMA, active messages).
class Context;
struct ContextDeleter {
  void operator()(Context* c) const noexcept;
};
using ContextPtr = std::unique_ptr<Context, ContextDeleter>;

// Opens UCP (UCX_TLS and the other UCX_* variables apply). Throws ferry::Error when UCX is
// missing or finds no transport.
ContextPtr open_context();

// How the device's lock model calls the transport: `serialized` when it never lets two threads
// into it at once (every model but lockless), so nothing guards the worker; otherwise ferry's
// biased lock does. The worker runs UCS_THREAD_MODE_SERIALIZED either way.
struct TransportParams {
  int rank = 0;
  bool serialized = false;
  std::vector<bool> away;  // by rank: on another host; those endpoints use UCX's peer error mode
  // Bounce buffers for injects UCX cannot complete inline (at most 1024): the device's packet
  // budget (FERRY_PACKETS) bounds them too, so a small pool pushes back here as well.
  std::size_t bounce_slots = 1024;
  // RMA to peers on this host whose endpoint has no RMA lane: by cross-memory attach (one copy,
  // at post time, probed per peer at connect) unless `copy`; else over active messages.
  ShmCopy copy = ShmCopy::automatic;
  // The device's packet payload, the largest message a ferry peer sends it: the size of the
  // slots that hold copies of arrived messages (at least the inject size).
  std::size_t packet_size = 0;
};
std::unique_ptr<Transport> make_transport(Context& context, const TransportParams& params);

// "UCX 1.13.1" and, after a loopback endpoint, the transports UCX picks for it here
// ("tag: posix/memory sysv/memory ...; rma: cma/memory"), for ferry-info; or why not.
std::string describe();

}  // namespace ferry::net::ucx
