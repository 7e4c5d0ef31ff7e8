// backend.cpp — the libfabric backend's registration (the module libferry-ofi.so): any rank,
// through one provider's endpoints (ofi_transport.hpp), and its facts for ferry-info.
#include <rdma/fabric.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "net/backend.hpp"
#include "net/ofi/fabric.hpp"
#include "net/ofi/ofi_transport.hpp"
#include "net/ofi/tools.hpp"

namespace ferry::net::ofi {

namespace {

class OfiBackend final : public Backend {
 public:
  explicit OfiBackend(std::unique_ptr<Fabric> fabric) : fabric_(std::move(fabric)) {}
  // The keepalive's endpoint is one more endpoint of the same fabric.
  std::unique_ptr<Transport> make_transport(const TransportParams& p) override { return ofi::make_transport(*fabric_, p.rank); }
  std::string provider() const override { return fabric_->caps().provider; }

 private:
  std::unique_ptr<Fabric> fabric_;
};

std::string version() {
  const std::uint32_t v = fi_version();
  return std::to_string(FI_MAJOR(v)) + "." + std::to_string(FI_MINOR(v));
}

Limits probe(const std::string& provider) {
  Fabric f(provider);
  const FabricInfo& c = f.caps();
  return Limits{c.inject_size, c.max_msg_size, c.cq_data_size, c.tx_size, c.mr_local,
                c.mr_virt_addr, c.mr_prov_key, c.mr_endpoint, c.rx_cq_data};
}

std::vector<Fact> describe(bool with_probe) {
  std::vector<Fact> facts{{"version", "libfabric " + version()}};
  std::string names;
  const std::vector<std::string> providers = available_providers();
  for (const std::string& p : providers) names += (names.empty() ? "" : ", ") + p;
  facts.emplace_back("providers (FI_EP_RDM with messages and RMA)", names.empty() ? "none" : names);
  if (!with_probe) return facts;
  for (const std::string& p : providers) {
    try {
      const Limits c = probe(p);
      facts.emplace_back(p, "inject " + std::to_string(c.inject_size) + " B, max message " + std::to_string(c.max_msg_size) +
                                " B, cq data " + std::to_string(c.cq_data_size) + " B, tx depth " + std::to_string(c.tx_size) +
                                ", mr:" + (c.mr_local ? " local" : "") + (c.mr_virt_addr ? " virt_addr" : " offset") +
                                (c.mr_prov_key ? " prov_key" : "") + (c.mr_endpoint ? " endpoint" : "") +
                                (c.rx_cq_data ? " rx_cq_data" : ""));
    } catch (const std::exception& e) {
      facts.emplace_back(p, std::string("cannot open: ") + e.what());
    }
  }
  return facts;
}

// ofi_rxm's buffer: its own header, then the message (libfabric 1.20's is well below 128 B; a
// frame that does not fit is still delivered, by rxm's segmentation); libfabric's default size.
constexpr std::uint64_t kRxmHeadroom = 128;
constexpr std::uint64_t kRxmDefaultBuffer = 16384;

// The row ofi_provider (options.cpp). "auto": libfabric's own shared memory when this backend
// serves a job of one host alone, else "" (libfabric's best network). The rows ofi_rxm_rx and
// ofi_rxm_buffer go to ofi_rxm through the environment, which it reads when libfabric starts in the process (the
// first fi_getinfo); a value the user sets there stands. setenv here, as the runtime's
// constructor opens its backends: the application's threads must not read the environment then.
std::unique_ptr<Backend> open(const OpenParams& p) {
  const std::string& provider = p.option("ofi_provider").text;
  if (const std::uint64_t rx = p.option("ofi_rxm_rx").number; rx != 0) {
    ::setenv("FI_OFI_RXM_MSG_RX_SIZE", std::to_string(rx).c_str(), 0);
  }
  std::uint64_t buffer = p.option("ofi_rxm_buffer").number;
  if (buffer == 0 && p.packet_size != 0 && p.packet_size + kRxmHeadroom < kRxmDefaultBuffer) {
    buffer = p.packet_size + kRxmHeadroom;
  }
  if (buffer != 0) ::setenv("FI_OFI_RXM_BUFFER_SIZE", std::to_string(buffer).c_str(), 0);
  return std::make_unique<OfiBackend>(open_fabric(provider != "auto" ? provider : p.one_host ? "shm" : ""));
}

const OfiTools kTools{&available_providers, &probe, &version};

const BackendInfo kOfi{
    "ofi",
    "libfabric: any rank, through one provider (FERRY_OFI_PROVIDER: shm, tcp, verbs, cxi, efa, ...)",
    unsigned(Reach::self) | Reach::host | Reach::network,
    &open,
    &describe,
    &kTools,
};

}  // namespace

}  // namespace ferry::net::ofi

FERRY_BACKEND_MODULE(ferry::net::ofi::kOfi)
