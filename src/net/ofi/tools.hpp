// tools.hpp — the ofi module's calls behind ferry's deprecated provider functions
// (ferry/tools.hpp: available_providers, probe_provider, fabric_version), reached through
// BackendInfo::tools. No libfabric type: libferry includes it without libfabric's headers.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ferry::net::ofi {

// What libfabric reports of one provider (FabricInfo's limits).
struct Limits {
  std::size_t inject_size = 0;
  std::size_t max_msg_size = 0;
  std::size_t cq_data_size = 0;
  std::size_t tx_size = 0;
  bool mr_local = false;
  bool mr_virt_addr = false;
  bool mr_prov_key = false;
  bool mr_endpoint = false;
  bool rx_cq_data = false;
};

struct OfiTools {
  std::vector<std::string> (*providers)();
  Limits (*probe)(const std::string& provider);  // throws ferry::Error naming the provider
  std::string (*version)();                      // "1.17"
};

}  // namespace ferry::net::ofi
