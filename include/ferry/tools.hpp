// tools.hpp — what ferry-info and other tools ask of an installation: its backends, how each
// comes (built in, a module, or not built and why) and what each reports of this machine.
//
// describe_backends() loads every module it describes: a tool's call, never a job's (a job
// loads only the backends it uses). Any thread; not on any message path.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace ferry {

// One backend of this build.
struct BackendReport {
  std::string name;     // what FERRY_TRANSPORT and FERRY_NETWORK say: "shm", "self", "ofi", "ucx"
  std::string summary;  // one line
  std::string origin;   // "built in", "module <path>", or "not built: <why>"
  bool usable = false;  // built, and its module (if one) loaded
  std::string error;    // why it is not usable ("" when it is)
  // What it reports of this machine, in order: ("version", "libfabric 1.17"), ...
  std::vector<std::pair<std::string, std::string>> facts;
};

// Every backend of this build, in registration order. `probe`: also open what can be opened
// (each libfabric provider, say) and report its limits. Never throws for a backend: what fails
// is its report's error.
std::vector<BackendReport> describe_backends(bool probe = false);

// ---- Deprecated: the provider calls of ferry 0.1, kept for one release --------------------

// What one libfabric provider offers when opened here.
struct ProviderLimits {
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

// The libfabric providers ferry can use here (FI_EP_RDM with messages and RMA).
[[deprecated("use describe_backends(): the ofi backend's facts")]] std::vector<std::string> available_providers();
// Opens `provider` and reports its limits. Throws ferry::Error when it cannot be opened.
[[deprecated("use describe_backends(true): the ofi backend's facts")]] ProviderLimits probe_provider(
    const std::string& provider);
// libfabric's version, e.g. "1.17".
[[deprecated("use describe_backends(): the ofi backend's facts")]] std::string fabric_version();
// How ferry's shared memory moves large data here: "cma" or "copy (<reason>)", then the
// kernel's transparent huge page mode.
[[deprecated("use describe_backends(): the shm backend's fact \"large data\"")]] std::string shm_large_data_path();
// UCX's version and the transports it picks between two ranks of this host, or why not.
[[deprecated("use describe_backends(): the ucx backend's facts")]] std::string ucx_description();

}  // namespace ferry
