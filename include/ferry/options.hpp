// ferry/options.hpp — every runtime setting, declared once.
//
// Each option has a name, an environment variable, a default and a help text; ferry-info
// prints the table with the values in force. A field left unset in RuntimeOptions takes the
// environment variable's value, else the default. A malformed value throws ferry::Error naming
// the variable and the value.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ferry {

// The one option table: X(field, ENV, default, help)
#define FERRY_OPTIONS(X)                                                                   \
  X(bootstrap, "FERRY_BOOTSTRAP", "auto",                                                  \
    "how ranks find each other: auto, single, pmi1 (ferryrun, mpiexec, srun --mpi=pmi2), " \
    "pmix (mpirun, srun --mpi=pmix)")                                                      \
  X(provider, "FERRY_PROVIDER", "auto",                                                    \
    "libfabric provider (shm, tcp, verbs, cxi, efa, sockets...); auto: shm when all ranks "  \
    "share a host, else libfabric's best")                                                 \
  X(devices, "FERRY_DEVICES", "1", "devices (endpoint + CQ + buffers) per process")       \
  X(packet_size, "FERRY_PACKET_SIZE", "8192",                                              \
    "bytes per packet; messages up to this size minus a 16-byte header go eagerly")        \
  X(packets, "FERRY_PACKETS", "4096", "packets per device (send and receive buffers)")    \
  X(prepost, "FERRY_PREPOST", "256",                                                      \
    "receives each device keeps posted (refilled on idle polls, at once below half)")     \
  X(recv_descriptors, "FERRY_RECV_DESCRIPTORS", "16384",                                   \
    "post_recv calls per device that may wait for their message at once")                  \
  X(send_credits, "FERRY_SEND_CREDITS", "0",                                               \
    "outstanding sends per device; 0: the provider's transmit queue size")                 \
  X(cq_capacity, "FERRY_CQ_CAPACITY", "65536", "default completion queue capacity")       \
  X(max_targets, "FERRY_MAX_TARGETS", "4096", "remote target ids per runtime (0..N-1)")   \
  X(rdv_threshold, "FERRY_RDV_THRESHOLD", "0",                                             \
    "messages above this many bytes use rendezvous; 0: as large as a packet allows")     \
  X(fragment, "FERRY_FRAGMENT", "auto",                                                    \
    "eager messages above the provider's inject size go as inject-size fragments: auto "  \
    "(when the provider injects >= 1 KiB, as shm does), off (one provider send)")          \
  X(fragment_max, "FERRY_FRAGMENT_MAX", "16384",                                           \
    "when fragmenting, messages up to this many bytes go as fragments, even past a packet " \
    "(reassembled on the heap); larger ones use rendezvous")                               \
  X(lock_model, "FERRY_LOCK_MODEL", "lockless",                                            \
    "device thread safety: lockless, trylock, block, lockq, csync, offload")               \
  X(completion, "FERRY_COMPLETION", "cq",                                                  \
    "completion mechanism: cq (array queue), cq_ms (Michael-Scott), cq_lock, sync")        \
  X(header, "FERRY_HEADER", "am", "parcel header primitive: am, sendrecv")                \
  X(progress, "FERRY_PROGRESS", "explicit",                                                \
    "who progresses: explicit, implicit, thread:N (N progress threads), steal")            \
  X(device_polling, "FERRY_DEVICE_POLLING", "local",                                       \
    "which devices an idle thread polls: local, random, global")                           \
  X(parcel_queues, "FERRY_PARCEL_QUEUES", "shared",                                        \
    "the ferry parcelport's completion queues: shared (one for every device), device (one " \
    "per device, drained only by the threads that poll it)")                               \
  X(parcelport, "FERRY_PARCELPORT", "ferry",                                               \
    "ferry::amt's parcelport: ferry, mpi, mpi_a, mpix")                                    \
  X(amt_threads, "FERRY_AMT_THREADS", "1", "ferry::amt worker threads per rank")

struct OptionInfo {
  const char* name;
  const char* env;
  const char* default_value;
  const char* help;
};

// The option table, in declaration order.
const std::vector<OptionInfo>& option_table();

// Explicit settings; an empty string or 0 means "not set here".
struct RuntimeOptions {
  std::string bootstrap{};
  std::string provider{};
  int devices = 0;
  std::size_t packet_size = 0;
  std::size_t packets = 0;
  std::size_t prepost = 0;
  std::size_t recv_descriptors = 0;
  std::size_t send_credits = 0;
  std::size_t cq_capacity = 0;
  std::size_t max_targets = 0;
  std::size_t rdv_threshold = 0;
  std::string fragment{};  // auto, off
  std::size_t fragment_max = 0;
  // The design space (validated by resolve_config; each lists its valid values on error).
  std::string lock_model{};
  std::string completion{};
  std::string header{};
  std::string progress{};
  std::string device_polling{};
  std::string parcel_queues{};
  // Read by ferry::amt (amt::Options), listed here so the one table shows every setting.
  std::string parcelport{};
  int amt_threads = 0;
};

// The value in force for each option: explicit setting, else environment, else default,
// formatted as text (what ferry-info prints).
std::vector<std::pair<OptionInfo, std::string>> resolved_options(const RuntimeOptions& explicit_options = {});

}  // namespace ferry
