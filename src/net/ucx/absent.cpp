// absent.cpp — the UCX backend in a build without UCX: asking for it is an error that says
// how to get it.
#include "ferry/error.hpp"
#include "ferry/runtime.hpp"
#include "net/ucx/ucx_context.hpp"

namespace ferry::net::ucx {

class Context {};

bool built() noexcept { return false; }

void ContextDeleter::operator()(Context* c) const noexcept { delete c; }

ContextPtr open_context() {
  throw Error("FERRY_TRANSPORT=ucx (or FERRY_NETWORK=ucx): this ferry was built without UCX; install libucx-dev "
              "(scripts/deps.sh does) and rebuild");
}

std::unique_ptr<Transport> make_transport(Context&, const TransportParams&) { return nullptr; }

std::string describe() { return "not built (UCX was not found at configure time: install libucx-dev)"; }

}  // namespace ferry::net::ucx

namespace ferry {
std::string ucx_description() { return net::ucx::describe(); }
}  // namespace ferry
