// providers.cpp — the libfabric providers and their limits, for tools (ferry-info).
#include <rdma/fabric.h>

#include "ferry/runtime.hpp"
#include "net/ofi/fabric.hpp"

namespace ferry {

std::vector<std::string> available_providers() { return net::ofi::available_providers(); }

ProviderLimits probe_provider(const std::string& provider) {
  net::ofi::Fabric f(provider);
  const net::ofi::FabricInfo& c = f.caps();
  ProviderLimits l;
  l.inject_size = c.inject_size;
  l.max_msg_size = c.max_msg_size;
  l.cq_data_size = c.cq_data_size;
  l.tx_size = c.tx_size;
  l.mr_local = c.mr_local;
  l.mr_virt_addr = c.mr_virt_addr;
  l.mr_prov_key = c.mr_prov_key;
  l.mr_endpoint = c.mr_endpoint;
  l.rx_cq_data = c.rx_cq_data;
  return l;
}

std::string fabric_version() {
  const std::uint32_t v = fi_version();
  return std::to_string(FI_MAJOR(v)) + "." + std::to_string(FI_MINOR(v));
}

}  // namespace ferry
