// tools.hpp — the ofi module's calls behind ferry's deprecated provider functions
// (ferry/tools.hpp: available_providers, probe_provider, fabric_version), reached through
// BackendInfo::tools. No libfabric type: libferry includes it without libfabric's headers.
#pragma once

#include <string>
#include <vector>

#include "ferry/tools.hpp"

namespace ferry::net::ofi {

// What libfabric reports of one provider (FabricInfo's limits), as ferry/tools.hpp spells it.
using Limits = ProviderLimits;

struct OfiTools {
  std::vector<std::string> (*providers)();
  Limits (*probe)(const std::string& provider);  // throws ferry::Error naming the provider
  std::string (*version)();                      // "1.17"
};

}  // namespace ferry::net::ofi
