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
          // Per process: ofi_rxm (the tcp and verbs providers' FI_EP_RDM) posts this many bounce
          // buffers per endpoint at start, 64 MiB at libfabric's 4096 of 16 KiB; at 1024 an endpoint
          // holds 50 MiB less, rates within their spread (results/ofi-rxm-rx-20261203-0720).
          {{"ofi_rxm_rx", "FERRY_OFI_RXM_RX", T::count, "1024", {}, 0, 1u << 20, nullptr,
            "receive buffers (of FERRY_OFI_RXM_BUFFER bytes) that libfabric's ofi_rxm layer (tcp, verbs) posts "
            "per endpoint, set as FI_OFI_RXM_MSG_RX_SIZE when libfabric starts in the process unless the "
            "environment sets that; 0: libfabric's own default (4096)"},
           false},
          // Per process: ferry never sends ofi_rxm a message larger than a packet, so buffers of a
          // packet and headroom hold all of them: 8 MiB less per endpoint than libfabric's
          // 16 KiB, rates within their spread (results/ofi-rxm-buffer-20261203).
          {{"ofi_rxm_buffer", "FERRY_OFI_RXM_BUFFER", T::size, "0", {}, 0, 1u << 30, nullptr,
            "bytes of each ofi_rxm buffer, set as FI_OFI_RXM_BUFFER_SIZE when libfabric starts in the process "
            "unless the environment sets that; 0: FERRY_PACKET_SIZE + 128 (a packet and rxm's header), or "
            "libfabric's own 16 KiB where that is smaller"},
           false},
      }};
  return table;
}

}  // namespace ferry::net
