// options.cpp — the one option resolver, the core runtime's table, and the resolution of the
// backends' rows (declared in their folders, listed by the registry) beside it.
#include <cstdlib>
#include <limits>
#include <string>

#include "core/config.hpp"
#include "ferry/error.hpp"
#include "ferry/options.hpp"
#include "net/registry.hpp"

namespace ferry {

const char* to_string(OptionType type) noexcept {
  switch (type) {
    case OptionType::choice: return "choice";
    case OptionType::size: return "size";
    case OptionType::count: return "count";
    case OptionType::boolean: return "bool";
    case OptionType::text: return "text";
  }
  return "?";
}

const char* to_string(OptionSource source) noexcept {
  switch (source) {
    case OptionSource::default_value: return "default";
    case OptionSource::environment: return "environment";
    case OptionSource::program: return "program";
  }
  return "?";
}

namespace detail {

std::size_t parse_size(std::string_view what, std::string_view text) {
  auto fail = [&]() -> std::size_t {
    throw Error(std::string(what) + "='" + std::string(text) +
                "' is not a size: expected a whole number of bytes with an optional k, M or G suffix");
  };
  if (text.empty()) return fail();
  std::size_t i = 0;
  unsigned long long value = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    const unsigned digit = static_cast<unsigned>(text[i] - '0');
    if (value > (std::numeric_limits<unsigned long long>::max() - digit) / 10) return fail();
    value = value * 10 + digit;
    ++i;
  }
  if (i == 0) return fail();
  std::string_view suffix = text.substr(i);
  unsigned long long scale = 1;
  if (suffix.empty() || suffix == "B") {
  } else if (suffix == "k" || suffix == "K" || suffix == "KiB" || suffix == "kB") {
    scale = 1ull << 10;
  } else if (suffix == "M" || suffix == "m" || suffix == "MiB" || suffix == "MB") {
    scale = 1ull << 20;
  } else if (suffix == "G" || suffix == "g" || suffix == "GiB" || suffix == "GB") {
    scale = 1ull << 30;
  } else {
    return fail();
  }
  if (value > std::numeric_limits<unsigned long long>::max() / scale) return fail();
  return static_cast<std::size_t>(value * scale);
}

namespace {

// A whole number without sign or suffix, or nothing when `text` is not one (or overflows).
bool parse_count(std::string_view text, std::uint64_t& out) {
  if (text.empty()) return false;
  std::uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    const unsigned digit = static_cast<unsigned>(c - '0');
    if (value > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) return false;
    value = value * 10 + digit;
  }
  out = value;
  return true;
}

std::string valid_names(const OptionInfo& info) {
  std::string list;
  for (const char* n : info.names) list += (list.empty() ? "" : ", ") + std::string(n);
  return list;
}

void require_range(const std::string& what, std::uint64_t value, std::uint64_t lo, std::uint64_t hi,
                   const char* bound_by) {
  if (value >= lo && value <= hi) return;
  // A bound from another option names that option's variable, with its value.
  std::string by;
  if (bound_by != nullptr) {
    by = " (at most ";
    by += bound_by;
    by += '=';
    by += std::to_string(hi);
    by += ')';
  }
  throw Error(what + "=" + std::to_string(value) + " is out of range: valid values are " + std::to_string(lo) + " to " +
              std::to_string(hi) + by);
}

OptionValue parse(const OptionInfo& info, const std::string& what, const std::string& text, std::uint64_t bound,
                  const char* bound_env) {
  OptionValue v;
  v.text = text;
  const std::uint64_t hi = std::min(info.max, bound);
  const char* bound_by = bound < info.max ? (bound_env != nullptr ? bound_env : info.max_option) : nullptr;
  switch (info.type) {
    case OptionType::text: return v;
    case OptionType::size:
      v.number = parse_size(what, text);
      require_range(what, v.number, info.min, hi, bound_by);
      v.text = std::to_string(v.number);
      return v;
    case OptionType::count:
      if (!parse_count(text, v.number)) {
        throw Error(what + "='" + text + "' is not a count: expected a whole number from " + std::to_string(info.min) +
                    " to " + std::to_string(hi));
      }
      require_range(what, v.number, info.min, hi, bound_by);
      v.text = std::to_string(v.number);
      return v;
    case OptionType::boolean:
      for (const char* t : {"1", "on", "yes", "true"}) {
        if (text == t) {
          v.number = 1;
          v.text = "1";
          return v;
        }
      }
      for (const char* f : {"0", "off", "no", "false"}) {
        if (text == f) {
          v.text = "0";
          return v;
        }
      }
      throw Error(what + "='" + text + "' is not valid; valid values: 1, 0, on, off, yes, no, true, false");
    case OptionType::choice:
      for (std::size_t i = 0; i < info.names.size(); ++i) {
        const std::string_view name = info.names[i];
        if (text == name) {
          v.index = i;
          return v;
        }
        // "word:N": the text is "word:" and a count within [min, max].
        if (name.size() > 2 && name.substr(name.size() - 2) == ":N") {
          const std::string_view word = name.substr(0, name.size() - 1);  // "thread:"
          if (text.compare(0, word.size(), word) != 0) continue;
          if (!parse_count(std::string_view(text).substr(word.size()), v.number) || v.number < info.min ||
              v.number > hi) {
            throw Error(what + "='" + text + "' is not valid: " + std::string(name) + " needs N from " +
                        std::to_string(info.min) + " to " + std::to_string(hi));
          }
          v.index = i;
          v.text = std::string(word) + std::to_string(v.number);
          return v;
        }
      }
      throw Error(what + "='" + text + "' is not valid; valid values: " + valid_names(info));
  }
  return v;
}

}  // namespace

std::pair<OptionValue, OptionSource> resolve_option(const OptionInfo& info, const std::string& program,
                                                    const std::string& program_name, std::uint64_t bound,
                                                    const char* bound_env) {
  if (!program.empty()) return {parse(info, program_name, program, bound, bound_env), OptionSource::program};
  // The one place ferry reads its own variables.
  const char* e = std::getenv(info.env);
  if (e != nullptr && *e == '\0') e = nullptr;
  if (info.deprecated_env != nullptr) {
    const char* old = std::getenv(info.deprecated_env);
    if (old != nullptr && *old != '\0') {
      if (e == nullptr) return {parse(info, info.deprecated_env, old, bound, bound_env), OptionSource::environment};
      if (std::string_view(e) != old) {
        throw Error(std::string(info.env) + "='" + e + "' and " + info.deprecated_env + "='" + old +
                    "' differ: " + info.deprecated_env + " is the deprecated name of " + info.env +
                    "; set only " + info.env);
      }
    }
  }
  if (e != nullptr) return {parse(info, info.env, e, bound, bound_env), OptionSource::environment};
  return {parse(info, info.env, info.default_value, bound, bound_env), OptionSource::default_value};
}

void unknown_option(std::string_view table, std::string_view name) {
  throw Error(std::string(table) + ": '" + std::string(name) + "' is not an option (see ferry-info)");
}

}  // namespace detail

namespace {

// FERRY_TRANSPORT's and FERRY_NETWORK's choices: the registry's names, also of the backends
// this build lacks (naming one gives the registry's "built without" error, not "not valid").
// Static: OptionInfo keeps pointers to them.
struct BackendNames {
  std::vector<std::string> transport{"auto"};  // auto, then every backend
  std::vector<std::string> network;            // the backends that reach the network
  BackendNames() {
    for (const std::string& n : net::backend_names()) {
      transport.push_back(n);
      if (net::reaches(net::backend_reach(n), net::Reach::network)) network.push_back(n);
    }
    if (network.empty()) network.emplace_back("none");  // a build without one: every name is refused
  }
};

const BackendNames& backend_names() {
  static const BackendNames names;
  return names;
}

std::vector<const char*> pointers(const std::vector<std::string>& names) {
  std::vector<const char*> out;
  for (const std::string& n : names) out.push_back(n.c_str());
  return out;
}

}  // namespace

const RuntimeOptionTable& runtime_option_table() {
  using O = RuntimeOptions;
  using S = RuntimeSettings;
  using T = OptionType;
  static const RuntimeOptionTable table(
      "core", "RuntimeOptions",
      {
          option({"bootstrap", "FERRY_BOOTSTRAP", T::choice, "auto", {"auto", "single", "pmi1", "pmix"}, 0, 0, nullptr,
                  "how ranks find each other: auto, single, pmi1 (ferryrun, mpiexec, srun --mpi=pmi2), "
                  "pmix (mpirun, srun --mpi=pmix)"},
                 &O::bootstrap, &S::bootstrap),
          option({"transport", "FERRY_TRANSPORT", T::choice, "auto", pointers(backend_names().transport), 0, 0, nullptr,
                  "backend per peer: auto (to this rank alone and within a host, the first built-in backend "
                  "that reaches the peer; across hosts FERRY_NETWORK), or the name of one backend for every "
                  "peer (ferry-info lists them, each with what it reaches)"},
                 &O::transport, &S::transport),
          option({"host", "FERRY_HOST", T::text, "", {}, 0, 0, nullptr,
                  "this rank's host identity for FERRY_TRANSPORT=auto (empty: the hostname); ranks with "
                  "different values talk through the network backend"},
                 &O::host, &S::host),
          // The default: the first registered backend that reaches the network.
          option({"network", "FERRY_NETWORK", T::choice, backend_names().network.front().c_str(),
                  pointers(backend_names().network), 0, 0, nullptr,
                  "the network backend FERRY_TRANSPORT=auto uses between hosts, one that reaches the network: "
                  "ofi (libfabric: Slingshot cxi, EFA, tcp...) or ucx (UCX: InfiniBand and RoCE)"},
                 &O::network, &S::network),
          option({"devices", "FERRY_DEVICES", T::count, "1", {}, 1, 64, nullptr,
                  "devices (endpoint + CQ + buffers) per process"},
                 &O::devices, &S::devices),
          option({"packet_size", "FERRY_PACKET_SIZE", T::size, "8192", {}, 64, 1u << 30, nullptr,
                  "bytes per packet; messages up to this size minus a 16-byte header go eagerly"},
                 &O::packet_size, &S::packet_size),
          option({"packets", "FERRY_PACKETS", T::size, "4096", {}, 2, 1u << 24, nullptr,
                  "packets per device, at most (send and receive buffers, made 64 at a time as the device needs them: "
                  "memory follows the most it held at once; over UCX also its bounce buffers, at most 1024)"},
                 &O::packets, &S::packets),
          option({"prepost", "FERRY_PREPOST", T::size, "256", {}, 1, UINT64_MAX, "packets",
                  "receives each device keeps posted on each transport that takes posted receives (refilled on idle polls, at once below half); a lending transport (ferry's shm) holds at most 16 spare packets instead"},
                 &O::prepost, &S::prepost),
          option({"recv_descriptors", "FERRY_RECV_DESCRIPTORS", T::size, "16384", {}, 1, 1u << 24, nullptr,
                  "post_recv calls per device that may wait for their message at once"},
                 &O::recv_descriptors, &S::recv_descriptors),
          option({"send_credits", "FERRY_SEND_CREDITS", T::size, "0", {}, 0, UINT64_MAX, nullptr,
                  "outstanding sends per device; 0: the provider's transmit queue size"},
                 &O::send_credits, &S::send_credits),
          option({"cq_capacity", "FERRY_CQ_CAPACITY", T::size, "65536", {}, 2, 1u << 28, nullptr,
                  "default completion queue capacity"},
                 &O::cq_capacity, &S::cq_capacity),
          option({"max_targets", "FERRY_MAX_TARGETS", T::size, "4096", {}, 1, 65535, nullptr,
                  "remote target ids per runtime (0..N-1; id 65535 is the collectives')"},
                 &O::max_targets, &S::max_targets),
          option({"rdv_threshold", "FERRY_RDV_THRESHOLD", T::size, "0", {}, 0, UINT64_MAX, nullptr,
                  "messages above this many bytes use rendezvous; 0: as large as a packet allows"},
                 &O::rdv_threshold, &S::rdv_threshold),
          option({"fragment", "FERRY_FRAGMENT", T::choice, "on", {"auto", "off", "on"}, 0, 0, nullptr,
                  "eager messages above the transport's inject size go as inject-size fragments: on (when "
                  "it injects >= 1 KiB: libfabric's shm, ferry's shm), auto (the same, but only without a "
                  "one-copy get: ferry's shm with cross-memory attach uses a rendezvous instead), off (one "
                  "transport send, or a rendezvous)"},
                 &O::fragment, &S::fragment),
          option({"fragment_max", "FERRY_FRAGMENT_MAX", T::size, "16384", {}, 0, 1u << 30, nullptr,
                  "when fragmenting, messages up to this many bytes go as fragments, even past a packet "
                  "(reassembled on the heap); larger ones use rendezvous"},
                 &O::fragment_max, &S::fragment_max),
          option({"recv_cache", "FERRY_RECV_CACHE", T::size, "268435456", {}, 0, std::size_t{1} << 40, nullptr,
                  "bytes of large receive buffers (rendezvous and reassembled payloads) a process keeps for "
                  "reuse once the application drops them, freed once unused for FERRY_TRIM_IDLE_MS; 0: each is freed"},
                 &O::recv_cache, &S::recv_cache),
          option({"recv_huge", "FERRY_RECV_HUGE", T::size, "1048576", {}, 0, std::size_t{1} << 40, nullptr,
                  "large receive buffers of at least this many bytes are mappings of their own on 2 MiB pages "
                  "(advised; each holds at least 2 MiB), so a peer's single-copy write into them pins few "
                  "pages; 0: none"},
                 &O::recv_huge, &S::recv_huge),
          option({"trim_idle_ms", "FERRY_TRIM_IDLE_MS", T::count, "10000", {}, 0, 86400000, nullptr,
                  "a device whose shared list of free packets nobody took from or returned to for this many "
                  "milliseconds gives the pages inside their payloads back to the system (Device::trim_memory; "
                  "not where a transport pins registered memory: verbs-style providers, UCX), and the process's "
                  "cache of large receive buffers (FERRY_RECV_CACHE) unused as long is freed; once per rest, as "
                  "progress sees it every 1024 calls; the memory is made again when next needed; 0: never"},
                 &O::trim_idle_ms, &S::trim_idle_ms),
          option({"rdv_read", "FERRY_RDV_READ", T::choice, "auto", {"auto", "read", "push"}, 0, 0, nullptr,
                  "how a rendezvous into a receive buffer of ferry's moves its data where the transport "
                  "offers both (ferry's shm with cross-memory attach): read (the receiver reads the sender's "
                  "memory), push (the receiver asks, the sender's progress writes), auto (push into "
                  "buffers on 2 MiB pages, see FERRY_RECV_HUGE; read otherwise)"},
                 &O::rdv_read, &S::rdv_read),
          option({"peer_check_ms", "FERRY_PEER_CHECK_MS", T::count, "200", {}, 1, 60000, nullptr,
                  "how often, in milliseconds, progress checks that the processes of peers on this host are "
                  "alive (a peer whose process ended without finalizing is reported within two such intervals), "
                  "and the keepalive checks the peers on other hosts (FERRY_PEER_TIMEOUT_MS)"},
                 &O::peer_check_ms, &S::peer_check_ms),
          option({"peer_timeout_ms", "FERRY_PEER_TIMEOUT_MS", T::count, "4000", {}, 0, 86400000, nullptr,
                  "a peer on another host from which no heartbeat came for this many milliseconds is failed "
                  "by the rank that watches it on the keepalive's ring (its host or process down, the link cut), "
                  "and every other rank is told; each process sends its two guardians on the ring a heartbeat "
                  "every quarter of it, on an endpoint of its own, from a thread of its own; 0: off (such a peer then fails only "
                  "by its transport's errors); at least 4 x FERRY_PEER_CHECK_MS; the same on every rank"},
                 &O::peer_timeout_ms, &S::peer_timeout_ms),
          option({"launcher_watch", "FERRY_LAUNCHER_WATCH", T::boolean, "1", {}, 0, 0, nullptr,
                  "under a launcher (PMI-1, PMIx), end this rank when its parent process (the launcher or its "
                  "daemon) ends, as progress sees it every FERRY_PEER_CHECK_MS: no rank outlives a killed mpirun"},
                 &O::launcher_watch, &S::launcher_watch),
          option({"connect", "FERRY_CONNECT", T::choice, "lazy", {"lazy", "eager"}, 0, 0, nullptr,
                  "when a device connects a peer it reaches over a network backend: lazy (its address is read "
                  "from the bootstrap and its endpoint made by the first operation to it, so a rank that talks "
                  "to k peers makes k endpoints), eager (every peer at start-up); ferry's shm and UCX "
                  "connect the peers of this host at start-up either way, and a libfabric provider that names "
                  "senders by their addresses (FI_SOURCE) every peer"},
                 &O::connect, &S::connect),
          option({"lock_model", "FERRY_LOCK_MODEL", T::choice, "lockless",
                  {"lockless", "trylock", "block", "lockq", "csync", "offload", "serialized"}, 0, 0, nullptr,
                  "lock model (how threads share a device): lockless, trylock, block, lockq, csync, offload, "
                  "serialized (no lock: the application lets one thread at a time into a device, e.g. a device per "
                  "thread, and none into any while one calls barrier or finalize; not with FERRY_PROGRESS=thread:N, "
                  "nor under the parcel layer, whose workers share devices)"},
                 &O::lock_model, &S::lock_model),
          // One variable for the whole stack: the core reads it for its queues' algorithm (at
          // every CompletionQueue creation too) and the ferry parcelport for `sync`, which the
          // core's queues run as `cq`. The core owns the row because the parcel layer sits on
          // the core and reads the typed value from Runtime::options(); the reverse cannot be.
          option({"completion", "FERRY_COMPLETION", T::choice, "cq", {"cq", "cq_ms", "cq_lock", "sync"}, 0, 0, nullptr,
                  "completion mechanism: cq (array queue), cq_ms (Michael-Scott), cq_lock, sync (the ferry "
                  "parcelport's synchronizer pool; the core's queues use cq)"},
                 &O::completion, &S::completion),
          // Owned by the core, which runs thread:N; the ferry parcelport carries out the others.
          option({"progress", "FERRY_PROGRESS", T::choice, "explicit", {"explicit", "implicit", "thread:N", "steal"}, 1,
                  999, nullptr,
                  "who progresses: explicit, implicit, thread:N (N progress threads), steal"},
                 &O::progress, &S::progress),
          option({"log", "FERRY_LOG", T::choice, "warn", {"off", "error", "warn", "info", "debug"}, 0, 0, nullptr,
                  "diagnostics on stderr: off, or this level and the more severe ones: error, warn, info, debug"},
                 &O::log, &S::log),
          // The collectives' (src/coll/, docs/collectives.md): read at each post, the same on every rank.
          option({"coll_allreduce", "FERRY_COLL_ALLREDUCE", T::choice, "auto", {"auto", "recursive_doubling", "ring"}, 0,
                  0, nullptr,
                  "allreduce's algorithm: recursive_doubling (log2 n rounds of the whole vector), ring (a "
                  "reduce-scatter and an allgather around the ring, 2(n-1) rounds of 1/n of it each), auto (ring "
                  "from FERRY_COLL_LARGE bytes on teams of 3 or more, recursive doubling below); the same on every rank"},
                 &O::coll_allreduce, &S::coll_allreduce),
          option({"coll_bcast", "FERRY_COLL_BCAST", T::choice, "auto", {"auto", "binomial", "scatter_allgather"}, 0, 0,
                  nullptr,
                  "broadcast's algorithm: binomial (a tree of whole messages), scatter_allgather (the root's "
                  "blocks scattered down a binomial tree, then a ring allgather), auto (scatter_allgather from "
                  "FERRY_COLL_LARGE bytes on teams of 3 or more); the same on every rank"},
                 &O::coll_bcast, &S::coll_bcast),
          option({"coll_allgather", "FERRY_COLL_ALLGATHER", T::choice, "auto", {"auto", "recursive_doubling", "ring"}, 0,
                  0, nullptr,
                  "allgather's algorithm: recursive_doubling (teams whose size is a power of two; others use the "
                  "ring), ring, auto (recursive doubling on a power of two below FERRY_COLL_LARGE bytes per member, "
                  "the ring otherwise); the same on every rank"},
                 &O::coll_allgather, &S::coll_allgather),
          option({"coll_large", "FERRY_COLL_LARGE", T::size, "65536", {}, 0, std::size_t{1} << 40, nullptr,
                  "bytes (a broadcast's or reduction's message, an allgather's per member) from which the auto "
                  "algorithms are the bandwidth ones"},
                 &O::coll_large, &S::coll_large),
      });
  return table;
}

namespace {

// The program's explicit value of a backend's row: RuntimeOptions::backend_options by row
// name or variable, else the deprecated field the row replaced. `what` names it for errors.
std::string program_value(const RuntimeOptions& o, const OptionInfo& info, std::string& what) {
  for (const auto& [name, value] : o.backend_options) {
    if (name == info.name || name == info.env) {
      what = "RuntimeOptions::backend_options[" + name + "]";
      return value;
    }
  }
  // The fields of ferry 0.1, honoured for one release; they name their rows, which the
  // backends declare, because the fields themselves are the core's public struct.
  std::string text;
  if (std::string_view(info.name) == "ofi_provider") {
    text = o.provider, what = "RuntimeOptions::provider";
  } else if (std::string_view(info.name) == "shm_copy") {
    text = o.shm_copy, what = "RuntimeOptions::shm_copy";
  } else if (std::string_view(info.name) == "shm_cells" && o.shm_cells != 0) {
    text = std::to_string(o.shm_cells), what = "RuntimeOptions::shm_cells";
  }
  return text;
}

// Fills RuntimeSettings' deprecated fields from the rows that replaced them.
void fill_deprecated(RuntimeSettings& s, const OptionInfo& info, const OptionValue& v) {
  const std::string_view name = info.name;
  if (name == "ofi_provider") s.provider = v.text;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  if (name == "shm_copy") s.shm_copy = static_cast<ShmCopyMode>(v.index);
#pragma GCC diagnostic pop
  if (name == "shm_cells") s.shm_cells = static_cast<std::size_t>(v.number);
}

}  // namespace

const std::vector<BackendOptionTable>& backend_option_tables() { return net::backend_options(); }

std::vector<ResolvedOption> BackendOptionTable::inspect(std::vector<std::string>& errors) const {
  std::vector<ResolvedOption> out;
  for (const BackendOption& row : rows) {
    try {
      auto [v, source] = detail::resolve_option(row.info, {}, {}, UINT64_MAX);
      out.push_back(ResolvedOption{&row.info, std::move(v.text), source});
    } catch (const Error& e) {
      errors.emplace_back(e.what());
      out.push_back(ResolvedOption{&row.info, "(invalid)", OptionSource::environment});
    }
  }
  return out;
}

Resolved<RuntimeSettings> resolve_options(const RuntimeOptions& explicit_options) {
  Resolved<RuntimeSettings> out = runtime_option_table().resolve(explicit_options);
  for (const auto& [name, value] : explicit_options.backend_options) {
    bool known = false;
    for (const BackendOptionTable& t : backend_option_tables()) {
      for (const BackendOption& row : t.rows) known = known || name == row.info.name || name == row.info.env;
    }
    if (!known) detail::unknown_option("RuntimeOptions::backend_options", name);
  }
  for (const BackendOptionTable& t : backend_option_tables()) {
    for (const BackendOption& row : t.rows) {
      std::string what;
      const std::string program = program_value(explicit_options, row.info, what);
      auto [v, source] = detail::resolve_option(row.info, program, what, UINT64_MAX);
      fill_deprecated(out.settings, row.info, v);
      out.options.push_back(ResolvedOption{&row.info, v.text, source});
      out.settings.backends.emplace_back(row.info.name, std::move(v));
    }
  }
  return out;
}

}  // namespace ferry
