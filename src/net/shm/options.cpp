// options.cpp — the shm backend's option rows (compiled into libferry with the registry, so
// ferry-info lists them and the resolver checks them beside the core's). The backend reads
// the values in open() (backend.cpp); the self and ucx backends read them too, as their rows
// say: one setting for every queue of cells in memory, one for large data within a host.
#include "ferry/options.hpp"

namespace ferry::net {

const BackendOptionTable& backend_options_shm() {
  using T = OptionType;
  static const BackendOptionTable table{
      "shm",
      {
          // The names follow net::ShmCopy's order, which open() casts the index to.
          {{"shm_copy", "FERRY_SHM_COPY", T::choice, "auto", {"auto", "cma", "copy"}, 0, 0, nullptr,
            "large data between processes of one host (ferry's shm; with FERRY_TRANSPORT=ucx, RMA to peers "
            "UCX has no RMA lane to): auto (cross-memory attach where the kernel allows it, else copy), cma "
            "(process_vm_readv/writev, single copy), copy (through shared memory; over UCX, active messages)"}},
          {{"shm_cells", "FERRY_SHM_CELLS", T::size, "256", {}, 2, 1u << 20, nullptr,
            "cells in each shared-memory receive queue (one packet each; rounded up to a power of two; also "
            "the self backend's queue)"}},
      }};
  return table;
}

}  // namespace ferry::net
