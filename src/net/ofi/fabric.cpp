#include "net/ofi/fabric.hpp"

#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>

#include <cstring>
#include <set>

#include "ferry/error.hpp"

namespace ferry::net::ofi {

namespace {

constexpr std::uint32_t kFiVersion = FI_VERSION(1, 11);

// What ferry needs: messages and RMA both ways. A notifying put names its writer in 8 bytes of
// remote CQ data; a provider with less must supply the source address (FI_SOURCE) instead,
// which costs an address lookup per completion, so ferry asks for it only then.
constexpr std::uint64_t kCaps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE |
                                FI_SEND | FI_RECV;

fi_info* make_hints(const std::string& provider, std::uint64_t extra_caps = 0) {
  fi_info* hints = fi_allocinfo();
  if (hints == nullptr) throw Error("fi_allocinfo: out of memory");
  hints->caps = kCaps | extra_caps;
  hints->ep_attr->type = FI_EP_RDM;
  // Modes ferry honours: OpContext starts with fi_context2; FI_RX_CQ_DATA is handled in
  // progress by reposting the consumed receive.
  hints->mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->domain_attr->av_type = FI_AV_TABLE;
  hints->domain_attr->control_progress = FI_PROGRESS_UNSPEC;
  hints->domain_attr->data_progress = FI_PROGRESS_UNSPEC;
  hints->tx_attr->msg_order = 0;
  if (!provider.empty()) hints->fabric_attr->prov_name = strdup(provider.c_str());
  return hints;
}

// Providers that serve only one host: "auto" across hosts must not pick them.
bool host_local(const char* prov) {
  return std::strcmp(prov, "shm") == 0 || std::strncmp(prov, "shm;", 4) == 0;
}

}  // namespace

std::string fi_error(const char* call, long rc) {
  return std::string(call) + ": " + fi_strerror(static_cast<int>(rc < 0 ? -rc : rc)) + " (" +
         std::to_string(rc) + ")";
}

std::vector<std::string> available_providers() {
  fi_info* hints = make_hints("");
  fi_info* list = nullptr;
  std::vector<std::string> out;
  if (fi_getinfo(kFiVersion, nullptr, nullptr, 0, hints, &list) == 0) {
    std::set<std::string> seen;
    for (fi_info* i = list; i != nullptr; i = i->next) {
      if (seen.insert(i->fabric_attr->prov_name).second) out.emplace_back(i->fabric_attr->prov_name);
    }
    fi_freeinfo(list);
  }
  fi_freeinfo(hints);
  return out;
}

Fabric::Fabric(const std::string& provider) {
  fi_info* hints = make_hints(provider);
  fi_info* list = nullptr;
  int rc = fi_getinfo(kFiVersion, nullptr, nullptr, 0, hints, &list);
  fi_freeinfo(hints);
  if (rc != 0 || list == nullptr) {
    std::string have;
    for (const auto& p : available_providers()) have += (have.empty() ? "" : ", ") + p;
    throw Error("FERRY_PROVIDER='" + (provider.empty() ? std::string("auto") : provider) +
                "': no libfabric provider offers FI_EP_RDM with messages and RMA (" +
                fi_error("fi_getinfo", rc) + "); usable providers here: " + (have.empty() ? "none" : have));
  }
  auto pick = [&provider](fi_info* l) {
    fi_info* c = l;
    if (provider.empty()) {
      while (c != nullptr && host_local(c->fabric_attr->prov_name)) c = c->next;
      if (c == nullptr) c = l;
    }
    return c;
  };
  fi_info* chosen = pick(list);
  if (chosen->domain_attr->cq_data_size < 8) {
    // Too little CQ data to carry a rank: ask this provider again, with FI_SOURCE.
    fi_info* hints2 = make_hints(chosen->fabric_attr->prov_name, FI_SOURCE);
    fi_info* list2 = nullptr;
    rc = fi_getinfo(kFiVersion, nullptr, nullptr, 0, hints2, &list2);
    fi_freeinfo(hints2);
    if (rc != 0 || list2 == nullptr) {
      fi_freeinfo(list);
      throw Error("provider " + std::string(chosen->fabric_attr->prov_name) +
                  " has less than 8 bytes of remote CQ data and no FI_SOURCE: ferry cannot name a put's writer");
    }
    fi_freeinfo(list);
    list = list2;
    chosen = list2;
    caps_.source = true;
  }
  info_ = fi_dupinfo(chosen);
  fi_freeinfo(list);

  caps_.provider = info_->fabric_attr->prov_name;
  caps_.fabric_name = info_->fabric_attr->name ? info_->fabric_attr->name : "";
  caps_.domain_name = info_->domain_attr->name ? info_->domain_attr->name : "";
  caps_.inject_size = info_->tx_attr->inject_size;
  caps_.max_msg_size = info_->ep_attr->max_msg_size;
  caps_.cq_data_size = info_->domain_attr->cq_data_size;
  caps_.tx_size = info_->tx_attr->size;
  caps_.rx_size = info_->rx_attr->size;
  const std::uint64_t mr = static_cast<std::uint64_t>(info_->domain_attr->mr_mode);
  caps_.mr_local = (mr & FI_MR_LOCAL) != 0;
  caps_.mr_virt_addr = (mr & FI_MR_VIRT_ADDR) != 0;
  caps_.mr_prov_key = (mr & FI_MR_PROV_KEY) != 0;
  caps_.mr_endpoint = (mr & FI_MR_ENDPOINT) != 0;
  caps_.rx_cq_data = (info_->mode & FI_RX_CQ_DATA) != 0;
  if (caps_.max_msg_size == 0) caps_.max_msg_size = 1ull << 30;

  rc = fi_fabric(info_->fabric_attr, &fabric_, nullptr);
  if (rc != 0) {
    fi_freeinfo(info_);
    throw Error(fi_error("fi_fabric", rc) + " for provider " + caps_.provider);
  }
  rc = fi_domain(fabric_, info_, &domain_, nullptr);
  if (rc != 0) {
    fi_close(&fabric_->fid);
    fi_freeinfo(info_);
    throw Error(fi_error("fi_domain", rc) + " for provider " + caps_.provider);
  }
}

Fabric::~Fabric() {
  if (domain_ != nullptr) fi_close(&domain_->fid);
  if (fabric_ != nullptr) fi_close(&fabric_->fid);
  if (info_ != nullptr) fi_freeinfo(info_);
}

Endpoint::Endpoint(Fabric& fabric, std::size_t cq_size) : fabric_(fabric) {
  auto fail = [this](const char* call, int rc) {
    this->~Endpoint();
    throw Error(fi_error(call, rc) + " (provider " + fabric_.caps().provider + ")");
  };
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.size = cq_size;
  cq_attr.wait_obj = FI_WAIT_NONE;
  int rc = fi_cq_open(fabric.domain(), &cq_attr, &cq_, nullptr);
  if (rc != 0) fail("fi_cq_open", rc);
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  rc = fi_av_open(fabric.domain(), &av_attr, &av_, nullptr);
  if (rc != 0) fail("fi_av_open", rc);
  // shm names an endpoint's segment after the process id. A segment left by a killed process
  // whose id has since been reused (pid_max is often 32768) looks owned by a live process:
  // shm then removes it and fails with FI_EBUSY, so the second attempt gets a fresh segment.
  for (int attempt = 0;; ++attempt) {
    rc = fi_endpoint(fabric.domain(), fabric.info(), &ep_, nullptr);
    if (rc != 0) fail("fi_endpoint", rc);
    rc = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV);
    if (rc != 0) fail("fi_ep_bind(cq)", rc);
    rc = fi_ep_bind(ep_, &av_->fid, 0);
    if (rc != 0) fail("fi_ep_bind(av)", rc);
    rc = fi_enable(ep_);
    if (rc == 0) return;
    if (rc != -FI_EBUSY || attempt == 1) fail("fi_enable", rc);
    fi_close(&ep_->fid);
    ep_ = nullptr;
  }
}

void Endpoint::abandon() noexcept {
  // Reachable from a static for the process's lifetime, never freed: the provider may hold
  // pointers into these objects until exit.
  static auto* kept = new std::vector<fid*>();
  try {
    for (fid* f : {ep_ != nullptr ? &ep_->fid : nullptr, av_ != nullptr ? &av_->fid : nullptr,
                   cq_ != nullptr ? &cq_->fid : nullptr})
      if (f != nullptr) kept->push_back(f);
  } catch (...) {
  }
  ep_ = nullptr;
  av_ = nullptr;
  cq_ = nullptr;
}

void Endpoint::close() noexcept {
  if (ep_ != nullptr) fi_close(&ep_->fid);
  if (av_ != nullptr) fi_close(&av_->fid);
  if (cq_ != nullptr) fi_close(&cq_->fid);
  ep_ = nullptr;
  av_ = nullptr;
  cq_ = nullptr;
}

std::string Endpoint::address() const {
  std::string buf(256, '\0');
  size_t len = buf.size();
  int rc = fi_getname(&ep_->fid, buf.data(), &len);
  if (rc == -FI_ETOOSMALL) {
    buf.resize(len);
    rc = fi_getname(&ep_->fid, buf.data(), &len);
  }
  if (rc != 0) throw Error(fi_error("fi_getname", rc));
  buf.resize(len);
  return buf;
}

std::vector<fi_addr_t> Endpoint::insert_addresses(const std::vector<std::string>& addresses) {
  std::vector<fi_addr_t> out(addresses.size(), FI_ADDR_NOTAVAIL);
  for (std::size_t r = 0; r < addresses.size(); ++r) {
    if (addresses[r].empty()) continue;
    int n = fi_av_insert(av_, addresses[r].data(), 1, &out[r], 0, nullptr);
    if (n != 1) throw Error(fi_error("fi_av_insert", n) + " for rank " + std::to_string(r));
  }
  return out;
}

int Endpoint::insert_address(const std::string& address, fi_addr_t& out) noexcept {
  out = FI_ADDR_NOTAVAIL;
  const int n = fi_av_insert(av_, address.data(), 1, &out, 0, nullptr);
  if (n == 1) return 0;
  return n < 0 ? n : -FI_EINVAL;
}

fid_mr* Endpoint::register_memory(const void* buf, std::size_t len, std::uint64_t access) {
  const FabricInfo& caps = fabric_.caps();
  fid_mr* mr = nullptr;
  const std::uint64_t key = caps.mr_prov_key ? 0 : fabric_.next_key();
  int rc = fi_mr_reg(fabric_.domain(), buf, len, access, 0, key, 0, &mr, nullptr);
  if (rc != 0) {
    throw Error(fi_error("fi_mr_reg", rc) + " registering " + std::to_string(len) + " bytes at " +
                std::to_string(reinterpret_cast<std::uintptr_t>(buf)));
  }
  if (caps.mr_endpoint) {
    rc = fi_mr_bind(mr, &ep_->fid, 0);
    if (rc == 0) rc = fi_mr_enable(mr);
    if (rc != 0) {
      fi_close(&mr->fid);
      throw Error(fi_error("fi_mr_bind/fi_mr_enable", rc));
    }
  }
  return mr;
}

void close_mr(fid_mr* mr) noexcept {
  if (mr != nullptr) fi_close(&mr->fid);
}

}  // namespace ferry::net::ofi
