// ucx_context.cpp — the process's UCP context, status mapping, and the description ferry-info prints.
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "ferry/error.hpp"
#include "net/ucx/ucp.hpp"

namespace ferry::net::ucx {

int to_errno_slow(ucs_status_t s) noexcept {
  switch (s) {
    case UCS_OK: return 0;
    case UCS_INPROGRESS: return -EINPROGRESS;
    case UCS_ERR_NO_RESOURCE: return -EAGAIN;
    case UCS_ERR_NO_MEMORY: return -ENOMEM;
    case UCS_ERR_INVALID_PARAM: return -EINVAL;
    case UCS_ERR_MESSAGE_TRUNCATED: return -EMSGSIZE;
    case UCS_ERR_CANCELED: return -ECANCELED;
    case UCS_ERR_UNSUPPORTED: return -ENOTSUP;
    case UCS_ERR_UNREACHABLE: return -EHOSTUNREACH;
    case UCS_ERR_CONNECTION_RESET: return -ECONNRESET;
    case UCS_ERR_NOT_CONNECTED: return -ENOTCONN;
    case UCS_ERR_REJECTED: return -ECONNREFUSED;
    case UCS_ERR_ENDPOINT_TIMEOUT: return -EHOSTDOWN;
    case UCS_ERR_TIMED_OUT: return -ETIMEDOUT;
    case UCS_ERR_EXCEEDS_LIMIT: return -E2BIG;
    case UCS_ERR_BUSY: return -EBUSY;
    default: return -EIO;
  }
}

std::string ucs_error(const char* call, ucs_status_t s) {
  return std::string(call) + ": " + ucs_status_string(s) + " (" + std::to_string(static_cast<int>(s)) + ")";
}

namespace {

// The UCX_TLS in force, as UCX read it (its configuration printed, the line found), so the
// library itself reads no environment variable.
std::string ucx_tls(const ucp_config_t* config) {
  char* text = nullptr;
  std::size_t size = 0;
  FILE* f = open_memstream(&text, &size);
  if (f == nullptr) return "";
  ucp_config_print(config, f, nullptr, UCS_CONFIG_PRINT_CONFIG);
  std::fclose(f);
  std::istringstream in(std::string(text, size));
  std::free(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("UCX_TLS=", 0) == 0) return line.substr(8);
  }
  return "";
}

}  // namespace

Context::Context() {
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) throw Error("FERRY_TRANSPORT=ucx: " + ucs_error("ucp_config_read", s) + " (check the UCX_* variables)");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM;  // messages are active messages
  // Registrations (ucp_mem_map, ucp_rkey_pack) come from application threads while the
  // devices' workers progress on others, and several devices share this context: UCX then
  // guards the context's own state (registration paths only, not the message path).
  params.mt_workers_shared = 1;
  tls_ = ucx_tls(config);
  s = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (s != UCS_OK) throw Error("FERRY_TRANSPORT=ucx: " + ucs_error("ucp_init", s) + " with UCX_TLS=" + tls_);
}

Context::~Context() {
  if (context_ != nullptr) ucp_cleanup(context_);
}

void ContextDeleter::operator()(Context* c) const noexcept { delete c; }

ContextPtr open_context() { return ContextPtr(new Context()); }

std::string lanes_of(ucp_ep_h ep) {
  char* text = nullptr;
  std::size_t size = 0;
  FILE* f = open_memstream(&text, &size);
  if (f == nullptr) return "";
  ucp_ep_print_info(ep, f);
  std::fclose(f);
  std::istringstream in(std::string(text, size));
  std::free(text);
  std::string line, out;
  while (std::getline(in, line)) {
    const auto lane = line.find("lane[");
    if (lane == std::string::npos) continue;
    std::istringstream words(line.substr(line.find(':', lane) + 1));
    std::string tl, word, uses;
    words >> tl;  // "3:sysv/memory.0": resource number, transport/device, interface number
    tl = tl.substr(tl.find(':') + 1);
    if (const auto dot = tl.rfind('.'); dot != std::string::npos) tl.erase(dot);
    while (words >> word) {
      if (word == "->" ) {
        words >> word;  // the remote md
        continue;
      }
      if (word.rfind("md[", 0) == 0) continue;
      uses += (uses.empty() ? "" : ",") + word;
    }
    out += (out.empty() ? "" : "; ") + tl + " (" + uses + ")";
  }
  return out;
}

bool has_rma_lane(ucp_ep_h ep) {
  // lanes_of: "tcp/lo (rma_bw#0,am,am_bw#0); ..."; an RMA lane is "rma" or "rma#N" (not rma_bw).
  const std::string lanes = lanes_of(ep);
  std::size_t at = 0;
  while ((at = lanes.find("rma", at)) != std::string::npos) {
    const bool starts = at > 0 && (lanes[at - 1] == '(' || lanes[at - 1] == ',');
    const char after = at + 3 < lanes.size() ? lanes[at + 3] : ')';
    if (starts && (after == '#' || after == ',' || after == ')')) return true;
    at += 3;
  }
  return false;
}

std::string describe() {
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  std::string out = "UCX " + std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
  try {
    Context context;
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    ucp_worker_h a = nullptr, b = nullptr;
    if (ucp_worker_create(context.get(), &wp, &a) != UCS_OK) return out + "; no worker";
    if (ucp_worker_create(context.get(), &wp, &b) != UCS_OK) {
      ucp_worker_destroy(a);
      return out + "; no worker";
    }
    ucp_address_t* address = nullptr;
    std::size_t length = 0;
    std::string lanes;
    if (ucp_worker_get_address(b, &address, &length) == UCS_OK) {
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
      ep.address = address;
      ucp_ep_h e = nullptr;
      if (ucp_ep_create(a, &ep, &e) == UCS_OK) {
        lanes = lanes_of(e);
        ucp_request_param_t p{};
        p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = UCP_EP_CLOSE_FLAG_FORCE;
        void* r = ucp_ep_close_nbx(e, &p);
        while (UCS_PTR_IS_PTR(r) && ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(a);
        if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
      }
      ucp_worker_release_address(b, address);
    }
    ucp_worker_destroy(b);
    ucp_worker_destroy(a);
    out += "; between two ranks of this host with UCX_TLS=" + context.tls();
    out += ": " + (lanes.empty() ? std::string("(no lanes reported)") : lanes);
  } catch (const std::exception& e) {
    out += std::string("; unusable here: ") + e.what();
  }
  return out;
}

}  // namespace ferry::net::ucx
