// ofi_transport.hpp — the libfabric backend: one device's endpoint behind net::Transport.
//
// One Fabric (provider, fabric, domain) serves every device of a process; each device gets an
// OfiTransport with its own endpoint, completion queue and address vector. Posts map one to
// one onto fi_inject, fi_send, fi_recv, fi_write(data), fi_inject_write and fi_read, with the
// OpContext's backend bytes as libfabric's fi_context2. The provider serialises concurrent
// posts (FI_THREAD_SAFE); the transport itself keeps no mutable state on the post path.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "net/ofi/fabric.hpp"
#include "net/transport.hpp"

namespace ferry::net::ofi {

// Opens the provider (`provider`: a libfabric name, or "" for libfabric's first choice that
// is not shared-memory-only). Throws ferry::Error naming the provider when nothing fits.
std::unique_ptr<Fabric> open_fabric(const std::string& provider);

// `rank`: this process's (a connect on first use counts its peers, not itself).
std::unique_ptr<Transport> make_transport(Fabric& fabric, int rank);

}  // namespace ferry::net::ofi
