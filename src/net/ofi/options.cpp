// options.cpp — the ofi backend's option rows, compiled into libferry with the registry rather
// than into libferry-ofi.so: they are listed and checked without loading libfabric, and also
// in a build without it. The module reads the values in open() (backend.cpp).
#include "ferry/options.hpp"

namespace ferry::net {

const BackendOptionTable& backend_options_ofi() {
  using T = OptionType;
  static const BackendOptionTable table{
      "ofi",
      {
          // Job-wide: ranks on different providers cannot reach each other's endpoints.
          {{"ofi_provider", "FERRY_OFI_PROVIDER", T::text, "auto", {}, 0, 0, nullptr,
            "libfabric provider (shm, tcp, verbs, cxi, efa, sockets...); auto: libfabric's shm when "
            "FERRY_TRANSPORT=ofi and every rank shares a host, else libfabric's best network; "
            "FERRY_PROVIDER is its deprecated name",
            "FERRY_PROVIDER"},
           true},
      }};
  return table;
}

}  // namespace ferry::net
