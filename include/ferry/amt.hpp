// ferry/amt.hpp — a small asynchronous many-task runtime on the parcel layer.
//
// Each rank of the job (what HPX calls a locality) runs a pool of worker threads that execute
// tasks and, when idle, call the parcelport's background_work(). Remote work is an action: a
// function registered under a name on every rank (the id is a hash of the name, so the
// order of registration does not matter) and invoked with async():
//
//   ferry::amt::Runtime rt({.threads = 4});
//   auto add = rt.action("add", [](int a, int b) { return a + b; });
//   ferry::amt::Future<int> f = rt.async_future(1, add, 2, 3);
//   int five = f.get();       // a worker helps (runs tasks, progresses) while it waits
//   rt.finalize();            // collective: returns when no task or parcel is left anywhere
//
// Arguments are serialized by value: trivially copyable types as bytes; std::vector<T> of a
// trivially copyable T and std::string by length and contents; Blob (owned bytes) zero-copy.
// Arrays at or above the zero-copy threshold (default 8 KiB) travel as zero-copy chunks;
// a Blob received that way is the parcelport's buffer itself, no copy.
#pragma once

#include <atomic>
#include <exception>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ferry/error.hpp"
#include "ferry/parcel.hpp"

namespace ferry::amt {

// Owned, movable bytes: the zero-copy argument type.
class Blob {
 public:
  Blob() = default;
  explicit Blob(std::size_t size) : data_(size != 0 ? static_cast<std::byte*>(std::malloc(size)) : nullptr), size_(size) {
    if (size != 0 && data_ == nullptr) throw Error("Blob: cannot allocate " + std::to_string(size) + " bytes");
  }
  Blob(std::byte* adopt, std::size_t size) noexcept : data_(adopt), size_(size) {}  // takes a malloc'ed buffer
  Blob(Blob&& o) noexcept : data_(o.data_), size_(o.size_) { o.data_ = nullptr, o.size_ = 0; }
  Blob& operator=(Blob&& o) noexcept {
    if (this != &o) {
      std::free(data_);
      data_ = o.data_, size_ = o.size_;
      o.data_ = nullptr, o.size_ = 0;
    }
    return *this;
  }
  Blob(const Blob& o) : Blob(o.size_) {
    if (size_ != 0) std::memcpy(data_, o.data_, size_);
  }
  Blob& operator=(const Blob& o) { return *this = Blob(o); }
  ~Blob() { std::free(data_); }
  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

struct Options {
  std::string parcelport;            // ferry, mpi, mpi_a, mpix; empty: FERRY_PARCELPORT, else ferry
  int threads = 0;                   // workers; 0: FERRY_AMT_THREADS, else 1
  bool pin = false;                  // pin worker i to core i % cores
  std::size_t zc_threshold = 8192;   // arrays at least this large travel zero-copy
  int devices = 0;                   // ferry parcelport devices / mpix communicators (0: default)
  bool iovec = false;                // ferry parcelport: follow-ups as one iovec message
  // A call arriving while a worker polls runs at once on that worker, inside background_work,
  // instead of going to the shared task queue (where any idle worker would take it). Parcel
  // handling is then tied to the thread that polled the device, as in runtimes that run
  // handlers inline: this is what makes device polling policies matter ([MPI-AMT] §5.2). A
  // call that waits on a future helps from inside that poll (nested). Calls polled by threads
  // that are not workers still go through the queue.
  bool inline_calls = false;
};

// The AMT runtime's options, resolved and typed (option_table(): Options::parcelport and
// Options::threads, else FERRY_PARCELPORT and FERRY_AMT_THREADS, else the defaults).
struct Settings {
  std::string parcelport;  // ferry, mpi, mpi_a, mpix
  int threads = 0;
};

using AmtOptionTable = OptionTable<Options, Settings>;

// The AMT runtime's table, in declaration order.
const AmtOptionTable& option_table();

class Runtime;

namespace detail {

// ---- serialization -----------------------------------------------------------------------
template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};

// Builds a parcel: the nzc bytes, and zero-copy chunks pointing at the caller's arguments
// (which the Writer keeps alive until the parcel is sent).
struct Writer {
  std::vector<std::byte> nzc;
  std::vector<parcel::Chunk> zc;
  std::vector<std::shared_ptr<void>> keep;  // owns what zc points at
  std::size_t zc_threshold = 8192;

  void raw(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    nzc.insert(nzc.end(), b, b + n);
  }
  template <class T>
  void pod(const T& v) {
    raw(&v, sizeof v);
  }
  // Length, then either the bytes inline (0) or the index of a zero-copy chunk (1).
  void bytes(std::shared_ptr<void> owner, const std::byte* p, std::size_t n) {
    pod<std::uint64_t>(n);
    if (n >= zc_threshold) {
      pod<std::uint8_t>(1);
      pod<std::uint32_t>(static_cast<std::uint32_t>(zc.size()));
      zc.push_back({const_cast<std::byte*>(p), n});
      keep.push_back(std::move(owner));
    } else {
      pod<std::uint8_t>(0);
      raw(p, n);
    }
  }
  template <class T>
  void arg(T&& v) {
    using U = std::decay_t<T>;
    if constexpr (std::is_same_v<U, Blob>) {
      auto owned = std::make_shared<Blob>(std::forward<T>(v));
      bytes(owned, owned->data(), owned->size());
    } else if constexpr (std::is_same_v<U, std::string>) {
      auto owned = std::make_shared<std::string>(std::forward<T>(v));
      bytes(owned, reinterpret_cast<const std::byte*>(owned->data()), owned->size());
    } else if constexpr (is_vector<U>::value) {
      static_assert(std::is_trivially_copyable_v<typename U::value_type>, "vector elements must be trivially copyable");
      auto owned = std::make_shared<U>(std::forward<T>(v));
      bytes(owned, reinterpret_cast<const std::byte*>(owned->data()), owned->size() * sizeof(typename U::value_type));
    } else {
      static_assert(std::is_trivially_copyable_v<U>, "action arguments must be trivially copyable, std::vector, "
                                                     "std::string or ferry::amt::Blob");
      pod(v);
    }
  }
};

// Reads a received parcel back into values. Throws ferry::Error on malformed input.
struct Reader {
  const std::byte* at;
  const std::byte* end;
  std::vector<parcel::Chunk>* zc;
  std::vector<bool>* zc_taken;  // a Blob that adopted a chunk owns it now

  void need(std::size_t n) const {
    if (static_cast<std::size_t>(end - at) < n) throw Error("amt: truncated parcel");
  }
  template <class T>
  T pod() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, at, sizeof v);
    at += sizeof v;
    return v;
  }
  // Returns (pointer, size, zc index or -1).
  std::tuple<const std::byte*, std::size_t, long> bytes() {
    const auto n = pod<std::uint64_t>();
    const auto where = pod<std::uint8_t>();
    if (where == 1) {
      const auto i = static_cast<std::size_t>(pod<std::uint32_t>());
      if (zc == nullptr || i >= zc->size() || (*zc)[i].size != n) throw Error("amt: bad zero-copy reference");
      return {(*zc)[i].data, n, static_cast<long>(i)};
    }
    need(n);
    const std::byte* p = at;
    at += n;
    return {p, n, -1};
  }
  template <class U>
  U arg() {
    if constexpr (std::is_same_v<U, Blob>) {
      auto [p, n, i] = bytes();
      if (i >= 0 && !(*zc_taken)[static_cast<std::size_t>(i)]) {
        (*zc_taken)[static_cast<std::size_t>(i)] = true;
        return Blob(const_cast<std::byte*>(p), n);  // adopt the parcelport's buffer: no copy
      }
      Blob b(n);
      if (n != 0) std::memcpy(b.data(), p, n);
      return b;
    } else if constexpr (std::is_same_v<U, std::string>) {
      auto [p, n, i] = bytes();
      (void)i;
      return std::string(reinterpret_cast<const char*>(p), n);
    } else if constexpr (is_vector<U>::value) {
      auto [p, n, i] = bytes();
      (void)i;
      using E = typename U::value_type;
      if (n % sizeof(E) != 0) throw Error("amt: array size is not a multiple of its element size");
      U v(n / sizeof(E));
      if (n != 0) std::memcpy(v.data(), p, n);
      return v;
    } else {
      return pod<U>();
    }
  }
};

std::uint64_t hash_name(const std::string& name) noexcept;

using Invoker = std::function<void(Runtime&, int source, Reader&, std::uint64_t reply_to)>;

}  // namespace detail

// A registered action. Callable with async() / async_future().
template <class R, class... Args>
struct Action {
  std::uint64_t id;
  std::string name;
};

// A 64-bit counter on every rank, made together (Runtime::counter): each rank's is reached by
// Runtime::fetch_add and compare_swap. A handle: copy it freely.
struct Counter {
  std::uint32_t id = 0;  // 0: no counter
};

// Memory that every rank exposes together (Runtime::expose) and the others read with
// Runtime::get. A handle: copy it freely; the parts stay exposed until the runtime ends.
struct Window {
  std::uint32_t id = 0;  // 0: no window
};

// The value of a remote call, later. get() helps the runtime while it waits, so calling it on
// a worker thread never deadlocks the pool.
template <class R>
class Future {
 public:
  struct State {
    std::atomic<bool> ready{false};
    std::conditional_t<std::is_void_v<R>, char, R> value{};
    std::exception_ptr error;  // set before ready: the call's rank failed (ferry::PeerFailed)
    // then(): the continuation, written before `stage` becomes 1. `stage` is exchanged by both
    // sides (acq_rel), so exactly one of them sees the other's mark and runs the continuation:
    // 0 nothing yet, 1 a continuation waits, 2 ready.
    std::function<void()> continuation;
    std::atomic<std::uint8_t> stage{0};
    // then() was called. Relaxed: it only refuses a second then(); `stage` orders the rest.
    std::atomic<bool> has_continuation{false};
    // The producer's last step, after value or error is set.
    void set_ready() {
      ready.store(true, std::memory_order_release);
      if (stage.exchange(2, std::memory_order_acq_rel) == 1) run_continuation();
    }
    // Moved out first: the continuation holds this state, and a stored one would keep it alive.
    void run_continuation() {
      std::function<void()> c = std::move(continuation);
      continuation = nullptr;
      c();
    }
  };
  Future() = default;
  Future(Runtime* rt, std::shared_ptr<State> s) : rt_(rt), state_(std::move(s)) {}
  bool ready() const noexcept { return state_ && state_->ready.load(std::memory_order_acquire); }
  R get();
  // Runs f(future) as a task of the runtime once this future is ready (spawned at once when it
  // is ready already), so a task can wait for data without blocking a worker. At most one
  // continuation per future; the future passed to f is this one (call get() on it).
  template <class F>
  void then(F&& f);

 private:
  Runtime* rt_ = nullptr;
  std::shared_ptr<State> state_;
};

class Runtime {
 public:
  explicit Runtime(Options options = {});
  // Finalizes if the application did not.
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int rank() const noexcept;
  int size() const noexcept;
  int threads() const noexcept;
  std::string parcelport() const;
  // What the parcelport runs on (Parcelport::transport()).
  std::string transport() const;

  // Registers fn under `name` on this rank. Every rank must register every action it
  // may receive; an unknown action is reported as an error naming its id and sender.
  template <class F>
  auto action(const std::string& name, F fn) {
    return make_action(name, std::function(fn));
  }

  // Fire and forget: runs action(args...) on `rank`.
  template <class R, class... Args, class... Given>
  void async(int rank, const Action<R, Args...>& a, Given&&... args) {
    send_call(rank, a.id, 0, serialize<Args...>(std::forward<Given>(args)...));
  }

  // Runs action(args...) on `rank` and brings its result back. When `rank` fails before its
  // reply arrives (or has failed already), the future holds ferry::PeerFailed naming it, which
  // get() throws.
  template <class R, class... Args, class... Given>
  Future<R> async_future(int rank, const Action<R, Args...>& a, Given&&... args) {
    auto state = std::make_shared<typename Future<R>::State>();
    const std::uint64_t token = register_pending(
        rank, state,
        [state](detail::Reader& r) {
          if constexpr (!std::is_void_v<R>) state->value = r.arg<R>();
          state->set_ready();
        },
        [state](std::exception_ptr e) {
          state->error = std::move(e);
          state->set_ready();
        });
    send_call(rank, a.id, token, serialize<Args...>(std::forward<Given>(args)...));
    return Future<R>(this, std::move(state));
  }

  // Runs f on some worker of this rank.
  void spawn(std::function<void()> f);

  // Collective: every rank calls it, in the same order, with its own part [data, data + size)
  // (parts may differ in size; an empty one is allowed). Returns once every rank's part is
  // known here, helping meanwhile: tasks run inside it, and another rank may have returned
  // from it (and sent work that uses the window) while this one waits, so work that gets from
  // a window must not start before every rank has returned (say so with a message). The parts
  // stay exposed until the runtime is destroyed, so they must outlive it. Throws ferry::Error
  // for a null data with a size.
  Window expose(void* data, std::size_t size);
  // Reads `size` bytes at `offset` of `rank`'s part of `w` into `dst`, which must stay valid
  // until the future is ready. Over the ferry parcelport this is the core's one-sided get (the
  // owner's CPU takes no part); over the MPI parcelports, which have none, a request that the
  // owner's runtime answers with the bytes, as an AMT runtime over two-sided MPI does. The
  // future holds ferry::PeerFailed when `rank` fails first. Throws ferry::Error for a window
  // this runtime did not expose, a rank out of range, or a range outside that rank's part.
  Future<void> get(int rank, Window w, std::size_t offset, void* dst, std::size_t size);
  // True when get() is one-sided (Parcelport::has_get).
  bool has_one_sided_get() const noexcept;

  // ---- collectives (over any parcelport) --------------------------------------------------
  // Every rank calls each collective, in the same order (the k-th collective called on every
  // rank is one operation), from any thread; each returns at once with a future that becomes
  // ready when this rank's part is done, helped along by the runtime's progress (get() helps
  // while it waits; then() runs a task after). Many may be in flight. T is trivially
  // copyable. They travel as parcels on a binomial tree rooted at rank 0 (broadcast: at its
  // root): about 2 log2(n) parcels on the longest path. A rank's failure, before or during
  // one, makes every unfinished collective's future hold ferry::PeerFailed naming it.
  //
  // Every rank's value, by rank.
  template <class T>
  Future<std::vector<T>> all_gather(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>, "all_gather: T must be trivially copyable");
    auto state = std::make_shared<typename Future<std::vector<T>>::State>();
    start_collective(
        0, 0, bytes_of(value),
        [state](std::vector<std::vector<std::byte>>&& parts) {
          state->value.resize(parts.size());
          for (std::size_t i = 0; i < parts.size(); ++i) std::memcpy(&state->value[i], parts[i].data(), sizeof(T));
          state->set_ready();
        },
        fail_into(state), sizeof(T));
    return Future<std::vector<T>>(this, std::move(state));
  }
  // op(op(...op(v0, v1)..., v_{n-1}): every rank's value combined in rank order (so the
  // result is the same on every rank, floating point included). `op` must be a callable
  // T(T, T) that every rank passes alike (std::plus<>{}, a lambda).
  template <class T, class Op>
  Future<T> all_reduce(const T& value, Op op) {
    static_assert(std::is_trivially_copyable_v<T>, "all_reduce: T must be trivially copyable");
    auto state = std::make_shared<typename Future<T>::State>();
    start_collective(
        0, 0, bytes_of(value),
        [state, op](std::vector<std::vector<std::byte>>&& parts) mutable {
          T acc;
          std::memcpy(&acc, parts[0].data(), sizeof(T));
          for (std::size_t i = 1; i < parts.size(); ++i) {
            T v;
            std::memcpy(&v, parts[i].data(), sizeof(T));
            acc = op(acc, v);
          }
          state->value = acc;
          state->set_ready();
        },
        fail_into(state), sizeof(T));
    return Future<T>(this, std::move(state));
  }
  // `root`'s value on every rank (the others' `value` is not read).
  template <class T>
  Future<T> broadcast(int root, const T& value) {
    static_assert(std::is_trivially_copyable_v<T>, "broadcast: T must be trivially copyable");
    auto state = std::make_shared<typename Future<T>::State>();
    start_collective(
        1, root, bytes_of(value),
        [state](std::vector<std::vector<std::byte>>&& parts) {
          std::memcpy(&state->value, parts[0].data(), sizeof(T));
          state->set_ready();
        },
        fail_into(state), sizeof(T));
    return Future<T>(this, std::move(state));
  }
  // Ready once every rank has called it.
  Future<void> barrier();

  // ---- remote atomic counters -----------------------------------------------------------
  // Collective: a counter on every rank, starting at `initial`; returns once every rank has
  // made it (so any rank may use it at once).
  Counter counter(std::int64_t initial = 0);
  // Adds `value` to `rank`'s counter `c`; the future holds the value before. Atomic with every
  // other fetch_add and compare_swap on that counter, from any rank: the owner performs it
  // with one CPU atomic (at once for this rank's own). ferry::PeerFailed when `rank` fails
  // first; ferry::Error for a counter this runtime did not make or a rank out of range.
  Future<std::int64_t> fetch_add(int rank, Counter c, std::int64_t value);
  // Sets `rank`'s counter to `desired` if it holds `expected`; the future holds the value found.
  Future<std::int64_t> compare_swap(int rank, Counter c, std::int64_t expected, std::int64_t desired);
  // This rank's counter `c` now.
  std::int64_t value(Counter c) const;

  // Runs one task or one round of background work from the calling thread; true if it did
  // something. What Future::get and finalize use to help while they wait.
  bool help();

  // Collective: returns on every rank once no task and no parcel is left anywhere. Throws
  // ferry::PeerFailed when a rank has failed (termination cannot be agreed without it).
  void finalize();

  // Parcels this rank's application sent / received (control traffic excluded).
  std::uint64_t parcels_sent() const noexcept;
  std::uint64_t parcels_received() const noexcept;
  // Calls this rank's threads made to the parcelport's background_work (help(), idle workers,
  // waits): the progress calls an application's report counts.
  std::uint64_t progress_calls() const noexcept;
  // Failed tasks, malformed replies, and (after finalize) calls to actions never registered.
  std::uint64_t errors() const noexcept;

  class Impl;

 private:
  template <class... Args, class... Given>
  detail::Writer serialize(Given&&... given) {
    static_assert(sizeof...(Args) == sizeof...(Given), "wrong number of arguments for this action");
    detail::Writer w;
    w.zc_threshold = zc_threshold();
    (w.arg(static_cast<Args>(std::forward<Given>(given))), ...);
    return w;
  }

  template <class R, class... Args>
  Action<R, std::decay_t<Args>...> make_action(const std::string& name, std::function<R(Args...)> fn) {
    const std::uint64_t id = detail::hash_name(name);
    register_invoker(id, name, [fn = std::move(fn)](Runtime& rt, int source, detail::Reader& r, std::uint64_t reply_to) {
      // Arguments are read in order (braced init guarantees left-to-right evaluation).
      std::tuple<std::decay_t<Args>...> args{r.arg<std::decay_t<Args>>()...};
      if constexpr (std::is_void_v<R>) {
        std::apply(fn, std::move(args));
        if (reply_to != 0) rt.send_reply(source, reply_to, detail::Writer{});
      } else {
        R result = std::apply(fn, std::move(args));
        if (reply_to != 0) {
          detail::Writer w;
          w.zc_threshold = rt.zc_threshold();
          w.arg(std::move(result));
          rt.send_reply(source, reply_to, std::move(w));
        }
      }
    });
    return {id, name};
  }

  template <class T>
  static std::vector<std::byte> bytes_of(const T& v) {
    std::vector<std::byte> b(sizeof(T));
    std::memcpy(b.data(), &v, sizeof(T));
    return b;
  }
  template <class S>
  static std::function<void(std::exception_ptr)> fail_into(const std::shared_ptr<S>& state) {
    return [state](std::exception_ptr e) {
      state->error = std::move(e);
      state->set_ready();
    };
  }
  // kind 0: gather every rank's bytes (to rank 0, then back down); 1: broadcast root's.
  // `done` gets the parts by rank (broadcast: root's alone), each `part_size` bytes.
  void start_collective(int kind, int root, std::vector<std::byte> mine,
                        std::function<void(std::vector<std::vector<std::byte>>&&)> done,
                        std::function<void(std::exception_ptr)> failed, std::size_t part_size);

  void register_invoker(std::uint64_t id, const std::string& name, detail::Invoker invoker);
  std::uint64_t register_pending(int rank, std::shared_ptr<void> keep, std::function<void(detail::Reader&)> on_reply,
                                 std::function<void(std::exception_ptr)> on_error);
  void send_call(int rank, std::uint64_t action, std::uint64_t reply_to, detail::Writer&& w);
  void send_reply(int rank, std::uint64_t token, detail::Writer&& w);
  std::size_t zc_threshold() const noexcept;

  std::unique_ptr<Impl> impl_;
};

template <class R>
R Future<R>::get() {
  if (!state_) throw Error("Future::get: the future is empty");
  while (!state_->ready.load(std::memory_order_acquire)) rt_->help();
  if (state_->error) std::rethrow_exception(state_->error);
  if constexpr (!std::is_void_v<R>) return std::move(state_->value);
}

template <class R>
template <class F>
void Future<R>::then(F&& f) {
  if (!state_) throw Error("Future::then: the future is empty");
  if (state_->has_continuation.exchange(true, std::memory_order_relaxed)) {
    throw Error("Future::then: the future has a continuation already");
  }
  Runtime* rt = rt_;
  std::shared_ptr<State> s = state_;
  state_->continuation = [rt, s, f = std::forward<F>(f)]() mutable {
    rt->spawn([rt, s, f = std::move(f)]() mutable { f(Future<R>(rt, s)); });
  };
  if (state_->stage.exchange(1, std::memory_order_acq_rel) == 2) state_->run_continuation();
}

}  // namespace ferry::amt
