// fabric.hpp — libfabric setup for the ofi backend: provider, domain, endpoints, memory.
//
// A Fabric opens one provider's fabric and domain and records what the provider demands
// (FabricInfo): the memory-registration mode bits (FI_MR_LOCAL, virtual vs offset addressing,
// provider keys, FI_MR_ENDPOINT), the inject size, the largest message and RMA transfer, and
// the remote CQ data size; OfiTransport turns them into the transport's Caps. An Endpoint is
// one device's FI_EP_RDM endpoint with its completion queue and address vector.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ferry::net::ofi {

struct FabricInfo {
  std::string provider;        // e.g. "shm", "tcp;ofi_rxm"
  std::string fabric_name;
  std::string domain_name;
  std::size_t inject_size = 0;
  std::size_t max_msg_size = 0;   // largest single send and single RMA transfer
  std::size_t cq_data_size = 0;   // bytes of remote CQ data
  std::size_t tx_size = 0;        // transmit queue depth
  std::size_t rx_size = 0;
  bool mr_local = false;          // FI_MR_LOCAL: local buffers need descriptors
  bool mr_virt_addr = false;      // FI_MR_VIRT_ADDR: RMA addresses are virtual, else offsets
  bool mr_prov_key = false;       // FI_MR_PROV_KEY: the provider picks keys
  bool mr_endpoint = false;       // FI_MR_ENDPOINT: regions bind to one endpoint
  bool rx_cq_data = false;        // FI_RX_CQ_DATA: remote CQ data consumes a posted receive
  bool source = false;            // FI_SOURCE is on (only when cq_data_size < 8)
};

// fi_strerror with the call's name, e.g. "fi_endpoint: Invalid argument (-22)".
std::string fi_error(const char* call, long rc);

// Providers libfabric offers here for FI_EP_RDM with messages and RMA (for ferry-info).
std::vector<std::string> available_providers();

class Fabric {
 public:
  // provider: a libfabric provider name, or "" for libfabric's first choice that is not
  // shared-memory-only. Throws ferry::Error when nothing fits, naming the provider.
  explicit Fabric(const std::string& provider);
  ~Fabric();
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  const FabricInfo& caps() const noexcept { return caps_; }
  fi_info* info() const noexcept { return info_; }
  fid_domain* domain() const noexcept { return domain_; }
  // A key for the next registration when the provider does not choose keys.
  std::uint64_t next_key() noexcept { return key_counter_.fetch_add(1, std::memory_order_relaxed); }

 private:
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  FabricInfo caps_;
  // Only uniqueness matters, so relaxed.
  std::atomic<std::uint64_t> key_counter_{1};
};

class Endpoint {
 public:
  Endpoint(Fabric& fabric, std::size_t cq_size);
  ~Endpoint() { close(); }
  // Closes the endpoint, its address vector and its completion queue; idempotent.
  void close() noexcept;
  // Leaves the endpoint, its address vector and its completion queue open for the rest of the
  // process, held where a leak checker sees them: after a peer became unreachable, libfabric
  // 1.17's rxm can crash closing its connection (a flushed transfer without a context reaches
  // rxm_handle_comp_error). With manual progress no provider code runs on them again.
  void abandon() noexcept;
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  std::string address() const;
  // Inserts the non-empty addresses[r]; returns each rank's fi_addr_t (FI_ADDR_NOTAVAIL for
  // ranks without an address).
  std::vector<fi_addr_t> insert_addresses(const std::vector<std::string>& addresses);
  // Inserts one address (a peer connected on first use): 0 and its fi_addr_t, or the
  // provider's negative error. Never throws; any thread (the domain is FI_THREAD_SAFE).
  int insert_address(const std::string& address, fi_addr_t& out) noexcept;

  // Registers [buf, buf+len) with `access` (FI_SEND | FI_RECV | FI_READ | FI_REMOTE_READ ...),
  // obeying FI_MR_ENDPOINT and FI_MR_PROV_KEY. Throws ferry::Error on failure.
  fid_mr* register_memory(const void* buf, std::size_t len, std::uint64_t access);

  fid_ep* ep() const noexcept { return ep_; }
  fid_cq* cq() const noexcept { return cq_; }
  Fabric& fabric() const noexcept { return fabric_; }

 private:
  Fabric& fabric_;
  fid_ep* ep_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_av* av_ = nullptr;
};

// Closes a registration; null is fine.
void close_mr(fid_mr* mr) noexcept;

}  // namespace ferry::net::ofi
