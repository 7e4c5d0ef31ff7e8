// backend.cpp — the UCX backend's registration (the module libferry-ucx.so): any rank,
// through one UCP context per process and one worker per device (ucx_context.hpp).
#include "net/backend.hpp"
#include "net/ucx/ucx_context.hpp"

namespace ferry::net::ucx {

namespace {

class UcxBackend final : public Backend {
 public:
  // RMA to peers of this host without a UCX RMA lane moves as the shm backend's row shm_copy
  // says (its names follow ShmCopy's values): one setting for large data within a host.
  explicit UcxBackend(const OpenParams& p)
      : context_(open_context()), copy_(static_cast<ShmCopy>(p.option("shm_copy").index)) {}
  std::unique_ptr<Transport> make_transport(const net::TransportParams& p) override {
    // The keepalive's endpoint: its own thread calls it (not serialized), heartbeats only.
    if (p.heartbeat) return ucx::make_transport(*context_, ucx::TransportParams{p.rank, false, p.away, 1024, ShmCopy::copy, 0});
    return ucx::make_transport(*context_, ucx::TransportParams{p.rank, p.serialized, p.away, p.packets, copy_, p.packet_size});
  }
  std::string provider() const override { return "ucx"; }

 private:
  ContextPtr context_;
  ShmCopy copy_;
};

const BackendInfo kUcx{
    "ucx",
    "UCX (UCP active messages and RMA): any rank, over the transports UCX picks (UCX_TLS)",
    unsigned(Reach::self) | Reach::host | Reach::network,
    [](const OpenParams& p) -> std::unique_ptr<Backend> { return std::make_unique<UcxBackend>(p); },
    [](bool) { return std::vector<Fact>{{"version and lanes", describe()}}; },
};

}  // namespace

}  // namespace ferry::net::ucx

FERRY_BACKEND_MODULE(ferry::net::ucx::kUcx)
