// ferry/options.hpp — typed option tables, one per layer, and their one resolver.
//
// Every setting is one row of its layer's table: name (the field in the layer's options
// struct), environment variable, type, default, valid names or range, help, and where the
// resolved value is stored in the layer's typed settings struct. The resolver takes the
// program's explicit value, else the environment's (an empty variable counts as unset), else
// the default; parses and validates it (a bad value throws ferry::Error naming the option and
// the value and listing what is valid); stores the typed value; and records the source.
// ferry-info prints every layer's table with the values in force.
//
// Layers: the core runtime (RuntimeOptions -> RuntimeSettings, runtime_option_table() here),
// the parcel layer (ferry/parcel.hpp) and the AMT runtime (ferry/amt.hpp). Adding an
// option is one row in its layer's table plus the field it fills and its use. A network
// backend declares its own rows with its registration (backend_option_tables() below); they
// are resolved with the core's and reach the backend by name, never through a typed field.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "ferry/error.hpp"
#include "ferry/log_level.hpp"

namespace ferry {

enum class OptionType : std::uint8_t {
  choice,   // one of OptionInfo::names; a name "word:N" accepts "word:<N>", N in [min, max]
  size,     // bytes: a whole number with an optional k, M or G suffix (KiB, MB... too), in [min, max]
  count,    // a whole number without suffix, in [min, max]
  boolean,  // 1, 0, on, off, yes, no, true, false
  text,     // any text
};

enum class OptionSource : std::uint8_t { default_value, environment, program };

const char* to_string(OptionType type) noexcept;      // "choice", "size", ...
const char* to_string(OptionSource source) noexcept;  // "default", "environment", "program"

// The description of one option: what the resolver checks and ferry-info prints.
struct OptionInfo {
  const char* name;           // the field of the layer's options struct (and its settings struct)
  const char* env;            // FERRY_ + the name in capitals
  OptionType type;
  const char* default_value;  // text, parsed like the environment's
  std::vector<const char*> names{};  // choice: the valid names, in the order of the enum they fill
  std::uint64_t min = 0;             // size, count, and the N of a "word:N" choice
  std::uint64_t max = UINT64_MAX;
  // An earlier option of the same table whose value is a further upper bound (prepost <= packets).
  const char* max_option = nullptr;
  const char* help = "";
  // An older name of `env`, still read: used when `env` is unset; both set and different is
  // an error naming both.
  const char* deprecated_env = nullptr;
};

// A parsed and validated value.
struct OptionValue {
  std::string text;          // canonical text ("thread:2", "8192"): what ferry-info prints
  std::uint64_t number = 0;  // size, count; boolean: 0 or 1; choice: the N of "word:N", else 0
  std::size_t index = 0;     // choice: the position of the name in OptionInfo::names
};

// One option's value in force and where it came from.
struct ResolvedOption {
  const OptionInfo* info;
  std::string value;
  OptionSource source;
};

// A choice that may carry a count ("thread:2"): the named value, and N (0 for plain names).
template <class E>
struct CountedChoice {
  E value{};
  std::uint64_t count = 0;
  friend bool operator==(const CountedChoice& a, const CountedChoice& b) noexcept {
    return a.value == b.value && a.count == b.count;
  }
};

namespace detail {

// The resolver (libferry). `program` is the program's explicit value as text (empty: not set),
// `program_name` how to name it in errors ("RuntimeOptions::devices"); `bound` a further upper
// bound from OptionInfo::max_option, whose variable `bound_env` names it in errors. Throws
// ferry::Error.
std::pair<OptionValue, OptionSource> resolve_option(const OptionInfo& info, const std::string& program,
                                                    const std::string& program_name, std::uint64_t bound,
                                                    const char* bound_env = nullptr);

[[noreturn]] void unknown_option(std::string_view table, std::string_view name);

template <class T>
struct is_counted_choice : std::false_type {};
template <class E>
struct is_counted_choice<CountedChoice<E>> : std::true_type {};

}  // namespace detail

// One row: the description, how to read the program's explicit value, where to store the
// resolved one.
template <class Options, class Settings>
struct Option {
  OptionInfo info;
  std::function<std::string(const Options&)> program;  // the explicit value as text; "" when unset
  std::function<void(Settings&, const OptionValue&)> store;
};

namespace detail {

// Writes a resolved value into the field `stored`: std::string (the text), bool, an integer
// (the number), an enum (the choice's index, so the enum's values follow OptionInfo::names),
// or CountedChoice<enum>.
template <class Settings, class S>
std::function<void(Settings&, const OptionValue&)> store_to(S Settings::*stored) {
  return [stored](Settings& s, const OptionValue& v) {
    S& out = s.*stored;
    if constexpr (std::is_same_v<S, std::string>) {
      out = v.text;
    } else if constexpr (std::is_same_v<S, bool>) {
      out = v.number != 0;
    } else if constexpr (std::is_enum_v<S>) {
      out = static_cast<S>(v.index);
    } else if constexpr (is_counted_choice<S>::value) {
      out.value = static_cast<decltype(out.value)>(v.index);
      out.count = v.number;
    } else {
      static_assert(std::is_integral_v<S>, "a setting is text, bool, an integer, an enum or a CountedChoice");
      out = static_cast<S>(v.number);
    }
  };
}

// Reads the field `program` as text; its zero value (0, false, empty) means "not set".
template <class Options, class P>
std::function<std::string(const Options&)> text_of(P Options::*program) {
  return [program](const Options& o) -> std::string {
    const P& v = o.*program;
    if constexpr (std::is_same_v<P, std::string>) {
      return v;
    } else if constexpr (std::is_same_v<P, bool>) {
      return v ? "1" : "";
    } else {
      static_assert(std::is_integral_v<P>, "an explicit value is text, bool or an integer");
      return v == 0 ? std::string() : std::to_string(v);
    }
  };
}

}  // namespace detail

// A row whose explicit value is the field `program` of Options and whose typed value goes to
// the field `stored` of Settings.
template <class Options, class Settings, class P, class S>
Option<Options, Settings> option(OptionInfo info, P Options::*program, S Settings::*stored) {
  return Option<Options, Settings>{std::move(info), detail::text_of(program), detail::store_to(stored)};
}

// A row the program cannot set (environment, else default): option<Options>(info, &Settings::x).
template <class Options, class Settings, class S>
Option<Options, Settings> option(OptionInfo info, S Settings::*stored) {
  return Option<Options, Settings>{std::move(info), nullptr, detail::store_to(stored)};
}

// Settings resolved from a table, with each option's value and source (in table order).
template <class Settings>
struct Resolved {
  Settings settings{};
  std::vector<ResolvedOption> options;

  // The value in force of the option `name`, as text. Throws ferry::Error for an unknown name.
  const std::string& value(std::string_view name) const {
    for (const ResolvedOption& o : options) {
      if (name == o.info->name) return o.value;
    }
    detail::unknown_option("resolved options", name);
  }
};

// One layer's table.
template <class Options, class Settings>
class OptionTable {
 public:
  using Row = Option<Options, Settings>;

  // `options_name` names the layer's options struct in errors about explicit values.
  OptionTable(const char* layer, const char* options_name, std::vector<Row> rows)
      : layer_(layer), options_name_(options_name), rows_(std::move(rows)) {}

  const char* layer() const noexcept { return layer_; }
  const std::vector<Row>& rows() const noexcept { return rows_; }

  // Every option: explicit value in `program`, else environment, else default.
  Resolved<Settings> resolve(const Options& program = Options{}) const {
    Resolved<Settings> out;
    std::vector<std::uint64_t> numbers;
    numbers.reserve(rows_.size());
    for (const Row& row : rows_) {
      const std::uint64_t bound = bound_of(row, numbers);
      auto [v, source] = detail::resolve_option(row.info, row.program ? row.program(program) : std::string(),
                                                std::string(options_name_) + "::" + row.info.name, bound,
                                                bound_env(row));
      row.store(out.settings, v);
      numbers.push_back(v.number);
      out.options.push_back(ResolvedOption{&row.info, std::move(v.text), source});
    }
    return out;
  }

  // Every option's value in force from the environment or its default, for listing
  // (ferry-info): an invalid value goes to `errors` (its ResolvedOption reads "(invalid)")
  // instead of being thrown.
  std::vector<ResolvedOption> inspect(std::vector<std::string>& errors) const {
    std::vector<ResolvedOption> out;
    std::vector<std::uint64_t> numbers;
    for (const Row& row : rows_) {
      const std::uint64_t bound = bound_of(row, numbers);
      try {
        auto [v, source] = detail::resolve_option(row.info, {}, {}, bound, bound_env(row));
        numbers.push_back(v.number);
        out.push_back(ResolvedOption{&row.info, std::move(v.text), source});
      } catch (const Error& e) {
        errors.emplace_back(e.what());
        numbers.push_back(UINT64_MAX);
        out.push_back(ResolvedOption{&row.info, "(invalid)", OptionSource::environment});
      }
    }
    return out;
  }

  // One option alone, from the environment or its default (and the option bounding it), into
  // `settings`: for values read again at each object's creation.
  void resolve_one(std::string_view name, Settings& settings) const {
    const Row& row = rows_[index_of(name)];
    std::uint64_t bound = UINT64_MAX;
    if (row.info.max_option != nullptr) {
      bound = detail::resolve_option(rows_[index_of(row.info.max_option)].info, {}, {}, UINT64_MAX).first.number;
    }
    row.store(settings, detail::resolve_option(row.info, {}, {}, bound, bound_env(row)).first);
  }

 private:
  // The value of the row's max_option, which must come earlier in the table (`numbers` holds
  // the earlier rows' values).
  std::uint64_t bound_of(const Row& row, const std::vector<std::uint64_t>& numbers) const {
    if (row.info.max_option == nullptr) return UINT64_MAX;
    const std::size_t i = index_of(row.info.max_option);
    if (i >= numbers.size()) detail::unknown_option(layer_, std::string(row.info.name) + ".max_option (a later row)");
    return numbers[i];
  }

  // The variable of the row's max_option, or null.
  const char* bound_env(const Row& row) const {
    return row.info.max_option != nullptr ? rows_[index_of(row.info.max_option)].info.env : nullptr;
  }

  std::size_t index_of(std::string_view name) const {
    for (std::size_t i = 0; i < rows_.size(); ++i) {
      if (name == rows_[i].info.name) return i;
    }
    detail::unknown_option(layer_, name);
  }

  const char* layer_;
  const char* options_name_;
  std::vector<Row> rows_;
};

// ---- the core runtime's options -------------------------------------------------------------

// Explicit settings; an empty string or 0 means "not set here". Choices are spelled as in
// the environment ("csync", "thread:2").
struct RuntimeOptions {
  std::string bootstrap{};
  std::string transport{};  // auto or a backend's name (self, shm, ofi, ucx)
  std::string host{};
  // Deprecated, honoured for one release: set backend_options {"ofi_provider", ...} instead.
  // (Plain fields, not [[deprecated]]: designated initializers and the implicit members would
  // warn in every program that includes this header.)
  std::string provider{};
  std::string network{};  // a backend that reaches the network (ofi, ucx): the one of transport=auto
  // Deprecated, honoured for one release: backend_options {"shm_copy", ...}, {"shm_cells", ...}.
  std::string shm_copy{};  // auto, cma, copy
  std::size_t shm_cells = 0;
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
  std::size_t recv_cache = 0;
  std::size_t recv_huge = 0;
  std::string rdv_read{};  // auto, read, push
  int peer_check_ms = 0;
  std::string peer_timeout_ms{};  // milliseconds as text; "0": off
  std::string launcher_watch{};  // on, off
  std::string connect{};  // lazy, eager
  std::string lock_model{};
  std::string completion{};
  std::string progress{};
  std::string log{};  // off, error, warn, info, debug
  int trim_idle_ms = 0;
  // The collectives' algorithms (ferry/coll.hpp): auto, or one by name.
  std::string coll_allreduce{};  // auto, recursive_doubling, ring
  std::string coll_bcast{};      // auto, binomial, scatter_allgather
  std::string coll_allgather{};  // auto, recursive_doubling, ring
  std::size_t coll_large = 0;    // bytes from which auto picks the bandwidth algorithms
  // Backends' options, as (row name or variable, value) pairs spelled as in the environment:
  // {{"shm_copy", "copy"}, {"FERRY_OFI_PROVIDER", "tcp"}}. Beats the environment and the
  // deprecated fields above; a name no backend declares is an error.
  std::vector<std::pair<std::string, std::string>> backend_options{};
};

// How ranks find each other; `automatic` reads the launcher's variables (PMIX_RANK, PMI_FD).
enum class BootstrapKind : std::uint8_t { automatic, single, pmi1, pmix };
// `serialized`: no lock at all, by the application's promise that one thread at a time calls into
// a device (a single-threaded program, or a device per thread).
enum class LockModel : std::uint8_t { lockless, trylock, block, lockq, csync, offload, serialized };
enum class FragmentMode : std::uint8_t { automatic, off, on };
// Deprecated: FERRY_TRANSPORT's and FERRY_NETWORK's choices are the registry's backend names,
// which RuntimeSettings::transport and ::network hold as text.
enum class [[deprecated("RuntimeSettings::transport is the backend's name")]] TransportKind : std::uint8_t {
  automatic, shm, ofi, ucx
};
enum class [[deprecated("RuntimeSettings::network is the backend's name")]] NetworkKind : std::uint8_t { ofi, ucx };
// Deprecated: how the shared-memory backend moves large data, now the shm backend's own row
// (FERRY_SHM_COPY) in its own type; RuntimeSettings::shm_copy still reports it for one release.
enum class [[deprecated("the shm backend's row shm_copy: options().value(\"shm_copy\")")]] ShmCopyMode
    : std::uint8_t { automatic, cma, copy };
// How a rendezvous into one of ferry's receive buffers moves its data where the transport can
// do either: the receiver reads, or the sender writes on request (`automatic`: writes into
// buffers on 2 MiB pages).
enum class RdvRead : std::uint8_t { automatic, read, push };
// When a device's network transport connects a peer: on the first operation to it, or every
// peer at start-up.
enum class ConnectMode : std::uint8_t { lazy, eager };
// sync is the ferry parcelport's mechanism; the core's queues use the array ring for it.
enum class CompletionMechanism : std::uint8_t { cq, cq_ms, cq_lock, sync };
// thread:N is carried out by the core (N progress threads), the others by the layer above.
enum class ProgressMode : std::uint8_t { explicit_calls, implicit, thread, steal };

// The collectives' algorithms; `automatic` picks by size (FERRY_COLL_LARGE) and team shape.
enum class AllreduceAlgorithm : std::uint8_t { automatic, recursive_doubling, ring };
enum class BcastAlgorithm : std::uint8_t { automatic, binomial, scatter_allgather };
enum class AllgatherAlgorithm : std::uint8_t { automatic, recursive_doubling, ring };

// The core's options, resolved and typed.
struct RuntimeSettings {
  BootstrapKind bootstrap = BootstrapKind::automatic;
  std::string transport;  // "auto" or a backend's name
  std::string host;
  std::string network;  // a backend's name
  // Deprecated, filled for one release from the backends' rows ofi_provider, shm_copy and
  // shm_cells (read them with Resolved::value("shm_copy") instead).
  std::string provider;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  ShmCopyMode shm_copy = ShmCopyMode::automatic;
#pragma GCC diagnostic pop
  std::size_t shm_cells = 0;
  // Every backend's rows, by row name ("shm_copy"), in backend_option_tables() order: what the
  // runtime hands each backend it opens (which reads its own by name).
  std::vector<std::pair<std::string, OptionValue>> backends;
  int devices = 0;
  std::size_t packet_size = 0;
  std::size_t packets = 0;
  std::size_t prepost = 0;
  std::size_t recv_descriptors = 0;
  std::size_t send_credits = 0;
  std::size_t cq_capacity = 0;
  std::size_t max_targets = 0;
  std::size_t rdv_threshold = 0;
  FragmentMode fragment = FragmentMode::on;
  std::size_t fragment_max = 0;
  std::size_t recv_cache = 0;
  std::size_t recv_huge = 0;
  RdvRead rdv_read = RdvRead::automatic;
  int peer_check_ms = 0;
  int peer_timeout_ms = 0;  // 0: no keepalive
  bool launcher_watch = true;
  ConnectMode connect = ConnectMode::lazy;
  LockModel lock_model = LockModel::lockless;
  CompletionMechanism completion = CompletionMechanism::cq;
  CountedChoice<ProgressMode> progress{};  // count: N of thread:N, else 0
  LogLevel log = LogLevel::warn;
  // A device's free packets give their pages back after this long at rest (0: never).
  int trim_idle_ms = 0;
  AllreduceAlgorithm coll_allreduce = AllreduceAlgorithm::automatic;
  BcastAlgorithm coll_bcast = BcastAlgorithm::automatic;
  AllgatherAlgorithm coll_allgather = AllgatherAlgorithm::automatic;
  std::size_t coll_large = 0;
};

using RuntimeOptionTable = OptionTable<RuntimeOptions, RuntimeSettings>;

// The core's table, in declaration order.
const RuntimeOptionTable& runtime_option_table();

// The core's settings in force: explicit setting, else environment, else default; then every
// backend's rows (backend_option_tables()), whose values follow the core's in `options`.
Resolved<RuntimeSettings> resolve_options(const RuntimeOptions& explicit_options = {});

// ---- the backends' options ------------------------------------------------------------------

// One row of a backend's table. Its name is the backend's name, '_', the setting ("shm_copy"),
// so the rows of all backends share one namespace with the core's.
struct BackendOption {
  OptionInfo info;
  // Every rank of a job must use the same value (checked at start-up, like FERRY_TRANSPORT).
  bool job_wide = false;
};

// One backend's rows, declared with its registration and compiled into libferry, so they are
// known (listed, validated) without loading the backend's module, and also in a build that
// lacks the backend.
struct BackendOptionTable {
  const char* backend;  // "shm", "ofi", ...
  std::vector<BackendOption> rows;

  // As OptionTable::inspect: each row's value in force, invalid values into `errors`.
  std::vector<ResolvedOption> inspect(std::vector<std::string>& errors) const;
};

// Every backend's table that has rows, in registration order.
const std::vector<BackendOptionTable>& backend_option_tables();

}  // namespace ferry
