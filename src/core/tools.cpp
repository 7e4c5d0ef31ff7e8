// tools.cpp — ferry/tools.hpp: the backends described for tools, and the deprecated provider
// calls, answered through the registry (the ofi module's own table, net/ofi/tools.hpp).
#include "ferry/tools.hpp"

#include <exception>

#include "ferry/error.hpp"
#include "net/ofi/tools.hpp"
#include "net/registry.hpp"

namespace ferry {

std::vector<BackendReport> describe_backends(bool probe) {
  std::vector<BackendReport> out;
  for (const std::string& name : net::backend_names()) {
    BackendReport r;
    r.name = name;
    r.origin = net::backend_origin(name);
    try {
      const net::BackendInfo& b = net::backend(name, "describe_backends");
      r.summary = b.summary;
      r.facts = b.describe(probe);
      r.usable = true;
    } catch (const std::exception& e) {
      r.error = e.what();
    }
    out.push_back(std::move(r));
  }
  return out;
}

namespace {

const net::ofi::OfiTools& ofi_tools(const char* call) {
  const auto* t = static_cast<const net::ofi::OfiTools*>(net::backend("ofi", call).tools);
  if (t == nullptr) throw Error(std::string(call) + ": the ofi backend module has no tool table");
  return *t;
}

std::string facts_of(const char* name) {
  for (const BackendReport& r : describe_backends(false)) {
    if (r.name != name) continue;
    if (!r.usable) return r.error;
    std::string out;
    for (const auto& f : r.facts) out += (out.empty() ? "" : "; ") + f.second;
    return out;
  }
  return "";
}

}  // namespace

std::vector<std::string> available_providers() { return ofi_tools("available_providers").providers(); }

ProviderLimits probe_provider(const std::string& provider) {
  return ofi_tools("probe_provider").probe(provider);
}

std::string fabric_version() { return ofi_tools("fabric_version").version(); }

std::string shm_large_data_path() { return facts_of("shm"); }

std::string ucx_description() { return facts_of("ucx"); }

}  // namespace ferry
