// The AMT runtime: worker pool, task queue, action dispatch, replies, and termination.
//
// Termination (finalize) is a double-counting wave protocol run by rank 0: it asks every
// rank for (application parcels sent, received, idle, finalizing); when two consecutive
// waves report everyone idle and finalizing with equal, unchanged totals, nothing can be in
// flight anywhere, and rank 0 tells everyone to stop. Control parcels are not counted.
#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

#include "common/log.hpp"
#include "common/mpmc_ring.hpp"
#include "ferry/amt.hpp"

namespace ferry::amt {

namespace detail {

std::uint64_t hash_name(const std::string& name) noexcept {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h == 0 ? 1 : h;
}

}  // namespace detail

namespace {

enum class Kind : std::uint8_t { call = 1, reply = 2, term_query = 3, term_report = 4, term_stop = 5 };

struct Pending {
  int rank = -1;  // the call went there
  std::shared_ptr<void> keep;
  std::function<void(detail::Reader&)> on_reply;
  std::function<void(std::exception_ptr)> on_error;
};

// Calls waiting for their reply, named on the wire by a token: slot index in the low 32 bits,
// the slot's generation (never 0, so no token is 0: 0 means "no reply") in the high 32. A
// reply's token is looked up here and never turned into a pointer, so a repeated, stale or
// forged one, or one from a rank the call did not go to, finds nothing. One mutex: a call
// that wants a reply is not the small-message path (it allocates its future's state).
class PendingCalls {
 public:
  std::uint64_t add(Pending&& p) {
    std::lock_guard<std::mutex> g(mutex_);
    std::uint32_t i;
    if (!free_.empty()) {
      i = free_.back();
      free_.pop_back();
    } else {
      if (slots_.size() >= 0xFFFFFFFFu) throw Error("amt: more than 2^32 calls wait for their replies");
      i = static_cast<std::uint32_t>(slots_.size());
      slots_.emplace_back();
    }
    Slot& s = slots_[i];
    s.pending = std::move(p);
    s.used = true;
    return (static_cast<std::uint64_t>(s.generation) << 32) | i;
  }
  // The call `token` names if it went to `rank` and still waits; it leaves the table.
  std::optional<Pending> take(std::uint64_t token, int rank) {
    const auto i = static_cast<std::uint32_t>(token);
    std::lock_guard<std::mutex> g(mutex_);
    if (i >= slots_.size()) return std::nullopt;
    Slot& s = slots_[i];
    if (!s.used || s.generation != static_cast<std::uint32_t>(token >> 32) || s.pending.rank != rank) return std::nullopt;
    return release(i);
  }
  // Every call to `rank`; they leave the table.
  std::vector<Pending> take_rank(int rank) {
    std::vector<Pending> out;
    std::lock_guard<std::mutex> g(mutex_);
    for (std::uint32_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].used && slots_[i].pending.rank == rank) out.push_back(release(i));
    return out;
  }

 private:
  struct Slot {
    Pending pending;
    std::uint32_t generation = 1;
    bool used = false;
  };
  Pending release(std::uint32_t i) {
    Slot& s = slots_[i];
    Pending p = std::move(s.pending);
    s.pending = Pending{};
    s.used = false;
    if (++s.generation == 0) s.generation = 1;
    free_.push_back(i);
    return p;
  }
  std::mutex mutex_;
  std::vector<Slot> slots_;
  std::vector<std::uint32_t> free_;
};

struct Report {
  std::uint64_t sent;
  std::uint64_t received;
  std::uint8_t idle;
  std::uint8_t finalizing;
};

}  // namespace

const AmtOptionTable& option_table() {
  using T = OptionType;
  static const AmtOptionTable table(
      "amt", "amt::Options",
      {
          // Text, not a choice: a program may register parcelports of its own, and make_parcelport
          // names the registered ones (and how to register the MPI baselines) for a wrong name.
          option({"parcelport", "FERRY_PARCELPORT", T::text, "ferry", {}, 0, 0, nullptr,
                  "ferry::amt's parcelport: ferry, mpi, mpi_a, mpix (any registered name)"},
                 &Options::parcelport, &Settings::parcelport),
          option({"threads", "FERRY_AMT_THREADS", T::count, "1", {}, 1, 4096, nullptr,
                  "ferry::amt worker threads per rank"},
                 &Options::threads, &Settings::threads),
      });
  return table;
}

class Runtime::Impl final : public parcel::Upcalls {
 public:
  Impl(Runtime& self, Options options) : self_(self), options_(std::move(options)), tasks_(1u << 16) {
    const Settings resolved = option_table().resolve(options_).settings;
    options_.parcelport = resolved.parcelport;
    options_.threads = resolved.threads;
    parcel::ParcelportOptions t;
    t.kind = options_.parcelport;
    t.devices = options_.devices;
    t.iovec = options_.iovec;
    parcelport_ = parcel::make_parcelport(t, *this);
    failed_ = std::make_unique<std::atomic<bool>[]>(static_cast<std::size_t>(parcelport_->size()));
    for (int r = 0; r < parcelport_->size(); ++r) failed_[static_cast<std::size_t>(r)].store(false, std::memory_order_relaxed);
    workers_count_ = static_cast<std::size_t>(options_.threads);
    progress_calls_ = std::make_unique<CallCount[]>(workers_count_ + 1);
    for (int i = 0; i < options_.threads; ++i) workers_.emplace_back([this, i] { work(i); });
  }

  ~Impl() override {
    stop_.store(true, std::memory_order_release);
    for (auto& w : workers_) w.join();
    std::function<void()>* t = nullptr;
    while (tasks_.try_pop(t)) delete t;
  }

  // ---- upcalls (inside background_work, any worker) -----------------------------------
  std::vector<parcel::Chunk> allocate_zc_chunks(int, const parcel::Chunk&, const std::vector<std::size_t>& sizes) override {
    std::vector<parcel::Chunk> out;
    out.reserve(sizes.size());
    for (std::size_t s : sizes) {
      auto* p = static_cast<std::byte*>(std::malloc(s != 0 ? s : 1));
      if (p == nullptr) throw Error("amt: cannot allocate a " + std::to_string(s) + "-byte argument");
      out.push_back({p, s});
    }
    return out;
  }

  void handle_parcel(int source, parcel::Parcel&& p) override {
    if (p.nzc.size < 1) {
      FERRY_LOG_AT(warn, rank(), -1, "amt: empty parcel from rank %d", source);
      return;
    }
    const auto kind = static_cast<Kind>(static_cast<std::uint8_t>(p.nzc.data[0]));
    switch (kind) {
      case Kind::call: {
        // The call is active before it counts as received (see count_received).
        active_.fetch_add(1, std::memory_order_acq_rel);
        count_received();
        // One inline call per background_work: a parcelport hands over up to a batch of parcels
        // per call, and running them all here would queue the later ones behind the first
        // task while other workers idle. The rest go to the task queue.
        if (options_.inline_calls && tls_worker_of == this && !tls_inline_ran) {
          tls_inline_ran = true;
          run_inline(source, p);
          return;
        }
        auto shared = std::make_shared<parcel::Parcel>(std::move(p));
        push_task([this, source, shared] { run_call(source, *shared); });
        return;
      }
      case Kind::reply: {
        // A reply's continuation may send: it is active while it runs, like a task.
        active_.fetch_add(1, std::memory_order_acq_rel);
        const struct Done {
          std::atomic<std::int64_t>& active;
          ~Done() { active.fetch_sub(1, std::memory_order_acq_rel); }
        } done{active_};
        count_received();
        run_reply(source, p);
        return;
      }
      case Kind::term_query:
      case Kind::term_report:
      case Kind::term_stop:
        on_control(kind, source, p);
        free_zc(p, {});
        return;
    }
    FERRY_LOG_AT(warn, rank(), -1, "amt: parcel of unknown kind %u from rank %d", static_cast<unsigned>(kind),
                 source);
  }

  // ---- tasks ----------------------------------------------------------------------------
  // A termination wave must never see an application parcel received while the work it
  // starts is not yet active: that rank would report idle with the parcel counted, and
  // if its thread is preempted in between for the length of two waves (a millisecond on an
  // oversubscribed machine), both waves balance and rank 0 stops everyone with the task
  // still to run. So a handler makes the work active first (acq_rel on active_), then counts
  // the parcel here with a release increment; a report that reads the count with acquire
  // therefore reads active_ after that increment, and sees the work active or finished.
  void count_received() noexcept { received_.fetch_add(1, std::memory_order_release); }

  void spawn(std::function<void()> f) {
    active_.fetch_add(1, std::memory_order_acq_rel);
    push_task(std::move(f));
  }

  // Queues a task already counted in active_.
  void push_task(std::function<void()> f) {
    auto* t = new std::function<void()>(std::move(f));
    if (tasks_.try_push(t)) return;
    std::lock_guard<std::mutex> g(overflow_mutex_);
    overflow_.push_back(t);
    overflow_size_.store(overflow_.size(), std::memory_order_relaxed);
  }

  bool run_one() {
    std::function<void()>* t = nullptr;
    if (!tasks_.try_pop(t)) {
      // Relaxed: a stale zero delays a spilled task to a later call, never loses it.
      if (overflow_size_.load(std::memory_order_relaxed) == 0) return false;
      std::lock_guard<std::mutex> g(overflow_mutex_);
      if (overflow_.empty()) return false;
      t = overflow_.front();
      overflow_.pop_front();
      overflow_size_.store(overflow_.size(), std::memory_order_relaxed);
    }
    try {
      const BusyMark busy(*this);
      (*t)();
    } catch (const std::exception& e) {
      FERRY_LOG_AT(error, rank(), -1, "amt: a task failed: %s", e.what());
      errors_.fetch_add(1, std::memory_order_relaxed);
    }
    delete t;
    // acq_rel: a termination wave that reads zero sees everything this task did (its sends).
    active_.fetch_sub(1, std::memory_order_acq_rel);
    return true;
  }

  // Options::inline_calls: the task runs here, on the worker that polled its parcel. The
  // caller counted it in active_ like a spawned task, so a termination wave never sees it half
  // done.
  void run_inline(int source, parcel::Parcel& p) {
    try {
      const BusyMark busy(*this);
      run_call(source, p);
    } catch (const std::exception& e) {
      FERRY_LOG_AT(error, rank(), -1, "amt: a task failed: %s", e.what());
      errors_.fetch_add(1, std::memory_order_relaxed);
    }
    active_.fetch_sub(1, std::memory_order_acq_rel);
  }

  bool help() {
    if (run_one()) return true;
    tls_inline_ran = false;
    count_progress_call();
    return parcelport_->background_work();
  }

  // Calls of background_work, for the applications' reports. A worker counts in its own
  // cache line with a plain load and store (it is the line's only writer; readers may see a
  // count a call or two old); every other thread shares the last line, with fetch_add.
  struct alignas(64) CallCount {
    std::atomic<std::uint64_t> n{0};
  };
  void count_progress_call() noexcept {
    if (tls_worker_of == this) {
      std::atomic<std::uint64_t>& n = progress_calls_[static_cast<std::size_t>(tls_worker_index)].n;
      n.store(n.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    } else {
      progress_calls_[workers_count_].n.fetch_add(1, std::memory_order_relaxed);
    }
  }
  std::uint64_t progress_calls() const noexcept {
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i <= workers_count_; ++i) sum += progress_calls_[i].n.load(std::memory_order_relaxed);
    return sum;
  }

  // Marks this worker busy for the parcelport while it runs its outermost task (a task that
  // helps inside Future::get runs nested tasks: those do not count again). Only the runtime's
  // own workers report: a thread of the application is not a device's owner.
  static thread_local const Impl* tls_worker_of;
  static thread_local int tls_worker_index;  // this worker's number, when tls_worker_of is set
  static thread_local int tls_task_depth;
  static thread_local bool tls_inline_ran;  // this background_work already ran a call inline
  struct BusyMark {
    const Impl& rt;
    const bool mine;
    explicit BusyMark(const Impl& r) noexcept : rt(r), mine(tls_worker_of == &r) {
      if (mine && tls_task_depth++ == 0) rt.parcelport_->worker_busy(true);
    }
    ~BusyMark() {
      if (mine && --tls_task_depth == 0) rt.parcelport_->worker_busy(false);
    }
    BusyMark(const BusyMark&) = delete;
    BusyMark& operator=(const BusyMark&) = delete;
  };

  void work(int index) {
    parcel::set_thread_index(index);
    tls_worker_of = this;
    tls_worker_index = index;
    if (options_.pin) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(static_cast<unsigned>(index) % std::thread::hardware_concurrency(), &set);
      pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    }
    int idle = 0;
    while (!stop_.load(std::memory_order_acquire)) {
      if (help()) {
        idle = 0;
      } else if (++idle >= 64) {
        // More threads than cores is common here: let the others run.
        std::this_thread::yield();
        idle = 0;
      }
    }
  }

  // ---- actions ------------------------------------------------------------------------------
  void register_invoker(std::uint64_t id, const std::string& name, detail::Invoker inv) {
    std::vector<std::pair<int, std::shared_ptr<parcel::Parcel>>> parked;
    {
      std::unique_lock<std::shared_mutex> g(actions_mutex_);
      auto [it, fresh] = actions_.emplace(id, std::make_pair(name, std::move(inv)));
      if (!fresh && it->second.first != name) {
        throw Error("action '" + name + "' has the same id as action '" + it->second.first + "'; rename one");
      }
      if (!fresh) throw Error("action '" + name + "' is already registered");
      for (auto i = parked_.begin(); i != parked_.end();) {
        if (i->first == id) {
          parked.emplace_back(i->second);
          i = parked_.erase(i);
        } else {
          ++i;
        }
      }
    }
    for (auto& [source, shared] : parked) {
      spawn([this, source = source, shared = shared] { run_call(source, *shared); });
    }
  }

  void run_call(int source, parcel::Parcel& p) {
    detail::Reader r{p.nzc.data + 1, p.nzc.data + p.nzc.size, &p.zc, nullptr};
    std::vector<bool> taken(p.zc.size(), false);
    r.zc_taken = &taken;
    const auto id = r.pod<std::uint64_t>();
    const auto reply_to = r.pod<std::uint64_t>();
    const detail::Invoker* inv = nullptr;
    {
      std::shared_lock<std::shared_mutex> g(actions_mutex_);
      auto it = actions_.find(id);
      if (it != actions_.end()) inv = &it->second.second;
    }
    if (inv == nullptr) {
      // Not registered (yet): keep it; register_invoker runs it, finalize reports it.
      std::unique_lock<std::shared_mutex> g(actions_mutex_);
      auto it = actions_.find(id);
      if (it == actions_.end()) {
        parked_.emplace(id, std::make_pair(source, std::make_shared<parcel::Parcel>(std::move(p))));
        return;
      }
      inv = &it->second.second;
    }
    try {
      (*inv)(self_, source, r, reply_to);
    } catch (...) {
      free_zc(p, taken);
      throw;
    }
    free_zc(p, taken);
  }

  void run_reply(int source, parcel::Parcel& p) {
    detail::Reader r{p.nzc.data + 1, p.nzc.data + p.nzc.size, &p.zc, nullptr};
    std::vector<bool> taken(p.zc.size(), false);
    r.zc_taken = &taken;
    const auto token = r.pod<std::uint64_t>();
    (void)r.pod<std::uint64_t>();
    std::optional<Pending> pending = pending_.take(token, source);
    if (!pending) {
      FERRY_LOG_AT(warn, rank(), -1, "amt: dropped a reply from rank %d that names no call waiting for it (token %llx)",
                   source, static_cast<unsigned long long>(token));
      errors_.fetch_add(1, std::memory_order_relaxed);
      free_zc(p, taken);
      return;
    }
    try {
      pending->on_reply(r);
    } catch (const std::exception& e) {
      FERRY_LOG_AT(error, rank(), -1, "amt: a reply from rank %d is malformed: %s", source, e.what());
      errors_.fetch_add(1, std::memory_order_relaxed);
    }
    free_zc(p, taken);
  }

  static void free_zc(parcel::Parcel& p, const std::vector<bool>& taken) {
    if (!p.zc_storage.empty()) return;  // the parcelport owns them
    for (std::size_t i = 0; i < p.zc.size(); ++i) {
      if (i >= taken.size() || !taken[i]) std::free(p.zc[i].data);
    }
    p.zc.clear();
  }

  std::uint64_t register_pending(int rank, std::shared_ptr<void> keep, std::function<void(detail::Reader&)> on_reply,
                                 std::function<void(std::exception_ptr)> on_error) {
    const std::uint64_t token = pending_.add(Pending{rank, std::move(keep), std::move(on_reply), std::move(on_error)});
    // A call to a rank already known failed fails at once (the parcel would go nowhere).
    if (rank >= 0 && rank < size() && failed_[static_cast<std::size_t>(rank)].load(std::memory_order_acquire)) fail_calls(rank);
    return token;
  }

  // ---- peer failure (parcel::Upcalls) ----------------------------------------------------------
  void peer_failed(int r) override {
    if (r < 0 || r >= size()) return;
    int none = -1;
    first_failed_.compare_exchange_strong(none, r, std::memory_order_acq_rel);
    // Release: a caller that sees the flag (acquire, register_pending) and fails its own call
    // needs nothing else from here; the pending table's mutex orders the two sweeps.
    failed_[static_cast<std::size_t>(r)].store(true, std::memory_order_release);
    fail_calls(r);
  }
  void send_failed(int destination, int) override {
    errors_.fetch_add(1, std::memory_order_relaxed);
    peer_failed(destination);
  }
  void receive_failed(int source, parcel::Parcel&& p, int) override {
    errors_.fetch_add(1, std::memory_order_relaxed);
    free_zc(p, {});
    (void)source;
  }
  // Every call waiting for a reply from `r` gets ferry::PeerFailed.
  void fail_calls(int r) {
    for (Pending& p : pending_.take_rank(r)) {
      if (p.on_error) p.on_error(std::make_exception_ptr(PeerFailed(r, "amt: rank " + std::to_string(r) + " failed before it replied")));
    }
  }
  // Throws PeerFailed if a rank failed; first, for 1.5 s, keeps helping, so that parcels from
  // the failed rank still being received complete (a transport gives up a dead peer's
  // operations after 1 s) and their memory goes back through receive_failed before teardown.
  void throw_if_failed(const char* call) {
    const int r = first_failed_.load(std::memory_order_acquire);
    if (r < 0) return;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
    while (std::chrono::steady_clock::now() < until) {
      if (!help()) std::this_thread::yield();
    }
    throw PeerFailed(r, std::string("amt: ") + call + ": rank " + std::to_string(r) + " failed");
  }

  void send(int dest, Kind kind, std::uint64_t a, std::uint64_t b, detail::Writer&& w, bool count) {
    if (dest < 0 || dest >= size()) {
      throw Error("async: rank=" + std::to_string(dest) + " is out of range; the job has " + std::to_string(size()) +
                  " ranks (0.." + std::to_string(size() - 1) + ")");
    }
    // Prefix: kind, a, b — in front of the serialized arguments.
    auto msg = std::make_shared<detail::Writer>(std::move(w));
    std::vector<std::byte> head(1 + 16);
    head[0] = static_cast<std::byte>(kind);
    std::memcpy(head.data() + 1, &a, 8);
    std::memcpy(head.data() + 9, &b, 8);
    msg->nzc.insert(msg->nzc.begin(), head.begin(), head.end());
    parcel::Parcel p;
    p.nzc = {msg->nzc.data(), msg->nzc.size()};
    p.zc = msg->zc;
    if (count) sent_.fetch_add(1, std::memory_order_relaxed);
    parcelport_->send(dest, std::move(p), [msg] {});  // msg keeps every chunk alive until sent
  }

  // ---- termination ----------------------------------------------------------------------------
  void on_control(Kind kind, int source, const parcel::Parcel& p) {
    std::uint64_t round = 0;
    std::memcpy(&round, p.nzc.data + 1, 8);
    if (kind == Kind::term_query) {
      // Acquire on received_ pairs with count_received: see there.
      Report rep{sent_.load(std::memory_order_relaxed), received_.load(std::memory_order_acquire),
                 static_cast<std::uint8_t>(active_.load(std::memory_order_acquire) == 0),
                 static_cast<std::uint8_t>(finalizing_.load(std::memory_order_acquire))};
      detail::Writer w;
      w.pod(rep);
      send(source, Kind::term_report, round, 0, std::move(w), false);
    } else if (kind == Kind::term_report) {
      Report rep;
      if (p.nzc.size < 17 + sizeof rep) return;
      std::memcpy(&rep, p.nzc.data + 17, sizeof rep);
      std::lock_guard<std::mutex> g(term_mutex_);
      if (round != round_) return;
      ++reports_;
      wave_sent_ += rep.sent;
      wave_received_ += rep.received;
      wave_quiet_ = wave_quiet_ && rep.idle && rep.finalizing;
    } else {
      stop_received_.store(true, std::memory_order_release);
    }
  }

  void finalize() {
    if (finalized_) return;
    finalized_ = true;
    finalizing_.store(true, std::memory_order_release);
    if (rank() == 0) run_waves();
    while (!stop_received_.load(std::memory_order_acquire)) {
      if (!help()) std::this_thread::yield();
      throw_if_failed("finalize");
    }
    parcelport_->barrier();
    std::lock_guard<std::shared_mutex> g(actions_mutex_);
    for (const auto& [id, parked] : parked_) {
      FERRY_LOG_AT(warn, rank(), -1, "amt: a call from rank %d named action id %llu, which was never registered here",
                   parked.first, static_cast<unsigned long long>(id));
      unknown_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  void run_waves() {
    std::uint64_t last_sent = ~0ull, last_received = ~0ull;
    bool last_quiet = false;
    for (;;) {
      {
        std::lock_guard<std::mutex> g(term_mutex_);
        ++round_;
        reports_ = 0;
        wave_sent_ = wave_received_ = 0;
        wave_quiet_ = true;
      }
      const std::uint64_t round = round_;
      for (int l = 0; l < size(); ++l) send(l, Kind::term_query, round, 0, detail::Writer{}, false);
      for (;;) {
        {
          std::lock_guard<std::mutex> g(term_mutex_);
          if (reports_ == size()) break;
        }
        if (!help()) std::this_thread::yield();
        throw_if_failed("finalize");
      }
      std::lock_guard<std::mutex> g(term_mutex_);
      const bool quiet = wave_quiet_ && wave_sent_ == wave_received_;
      if (quiet && last_quiet && wave_sent_ == last_sent && wave_received_ == last_received) break;
      last_quiet = quiet;
      last_sent = wave_sent_;
      last_received = wave_received_;
    }
    for (int l = 0; l < size(); ++l) send(l, Kind::term_stop, 0, 0, detail::Writer{}, false);
  }

  // ---- windows: expose and get ------------------------------------------------------------
  // A window's id is its creation number; expose is collective and in the same order on every
  // rank, and returns only with every rank's part, so a part that arrives early names at most
  // the next window this rank will create (next_window_): a larger id is not from a peer.
  Window expose(void* data, std::size_t bytes) {
    if (data == nullptr && bytes != 0) {
      throw Error("expose: data is null with size=" + std::to_string(bytes));
    }
    std::unique_ptr<parcel::ExposedMemory> exposed;
    std::vector<std::byte> key;
    if (parcelport_->has_get() && bytes != 0) {
      exposed = parcelport_->expose_memory(data, bytes);
      key = exposed->key();
    }
    std::uint32_t id = 0;
    {
      std::lock_guard<std::mutex> g(windows_mutex_);
      id = next_window_++;
      WindowState& w = windows_[id];
      if (w.parts.empty()) w.parts.resize(static_cast<std::size_t>(size()));
      w.data = static_cast<std::byte*>(data);
      w.exposed_here = true;
      w.exposed = std::move(exposed);
      w.parts[static_cast<std::size_t>(rank())] = WindowPart{bytes, key, true};
      ++w.known;
    }
    for (int r = 0; r < size(); ++r) {
      if (r == rank()) continue;
      detail::Writer m;
      m.pod(id);
      m.pod(static_cast<std::uint64_t>(bytes));
      m.arg(key);
      send(r, Kind::call, window_part_action(), 0, std::move(m), true);
    }
    for (;;) {
      {
        std::lock_guard<std::mutex> g(windows_mutex_);
        if (windows_[id].known == size()) break;
      }
      if (!help()) std::this_thread::yield();
      throw_if_failed("expose");
    }
    return Window{id};
  }

  void on_window_part(int source, detail::Reader& r) {
    const auto id = r.pod<std::uint32_t>();
    const auto bytes = r.pod<std::uint64_t>();
    auto key = r.arg<std::vector<std::byte>>();
    std::lock_guard<std::mutex> g(windows_mutex_);
    if (id == 0 || id > next_window_ || source < 0 || source >= size() || source == rank()) {
      FERRY_LOG_AT(warn, rank(), -1, "amt: dropped a window part from rank %d for window %u (this rank has created %u)",
                   source, id, next_window_ - 1);
      errors_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    WindowState& w = windows_[id];
    if (w.parts.empty()) w.parts.resize(static_cast<std::size_t>(size()));
    WindowPart& part = w.parts[static_cast<std::size_t>(source)];
    if (part.known) {
      FERRY_LOG_AT(warn, rank(), -1, "amt: dropped a second part of window %u from rank %d", id, source);
      errors_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    part = WindowPart{bytes, std::move(key), true};
    ++w.known;
  }

  Future<void> get(int from, Window win, std::size_t offset, void* dst, std::size_t bytes) {
    if (from < 0 || from >= size()) {
      throw Error("get: rank=" + std::to_string(from) + " is out of range; the job has " + std::to_string(size()) + " ranks");
    }
    if (dst == nullptr && bytes != 0) throw Error("get: dst is null with size=" + std::to_string(bytes));
    std::vector<std::byte> key;
    std::byte* local = nullptr;
    {
      std::lock_guard<std::mutex> g(windows_mutex_);
      auto it = windows_.find(win.id);
      if (it == windows_.end() || !it->second.exposed_here) {
        throw Error("get: window " + std::to_string(win.id) + " is not one this runtime exposed");
      }
      if (it->second.known != size()) {
        throw Error("get: window " + std::to_string(win.id) + " is still being exposed (call get after expose returns)");
      }
      const WindowPart& part = it->second.parts[static_cast<std::size_t>(from)];
      if (offset > part.size || bytes > part.size - offset) {
        throw Error("get: offset=" + std::to_string(offset) + " + size=" + std::to_string(bytes) + " is outside rank " +
                    std::to_string(from) + "'s part of window " + std::to_string(win.id) + " (" + std::to_string(part.size) +
                    " bytes)");
      }
      if (from == rank()) local = it->second.data;
      else if (parcelport_->has_get()) key = part.key;
    }
    auto state = std::make_shared<Future<void>::State>();
    Future<void> f(&self_, state);
    if (bytes == 0 || from == rank()) {
      if (bytes != 0) std::memcpy(dst, local + offset, bytes);
      state->set_ready();
      return f;
    }
    if (parcelport_->has_get()) {
      parcelport_->get(from, key, offset, dst, bytes, [state, from](int error) {
        if (error != 0) {
          state->error = error == peer_failed_error
                             ? std::make_exception_ptr(PeerFailed(from, "amt: get: rank " + std::to_string(from) + " failed"))
                             : std::make_exception_ptr(Error("amt: get from rank " + std::to_string(from) + " failed (error " +
                                                             std::to_string(error) + ")"));
        }
        state->set_ready();
      });
      return f;
    }
    // Two-sided: the owner answers with the bytes (on_get_request).
    const std::uint64_t token = register_pending(
        from, state,
        [state, dst, bytes, from](detail::Reader& r) {
          try {
            if (r.pod<std::uint8_t>() == 0) throw Error("rank " + std::to_string(from) + " refused: " + r.arg<std::string>());
            Blob b = r.arg<Blob>();
            if (b.size() != bytes) {
              throw Error("rank " + std::to_string(from) + " sent " + std::to_string(b.size()) + " bytes for a get of " +
                          std::to_string(bytes));
            }
            std::memcpy(dst, b.data(), bytes);
          } catch (const std::exception& e) {
            state->error = std::make_exception_ptr(Error(std::string("amt: get: ") + e.what()));
          }
          state->set_ready();
        },
        [state](std::exception_ptr e) {
          state->error = std::move(e);
          state->set_ready();
        });
    detail::Writer m;
    m.pod(win.id);
    m.pod(static_cast<std::uint64_t>(offset));
    m.pod(static_cast<std::uint64_t>(bytes));
    send(from, Kind::call, get_action(), token, std::move(m), true);
    return f;
  }

  // The owner's side of a two-sided get. The request's numbers are checked against this
  // rank's part before any byte is read.
  void on_get_request(int source, detail::Reader& r, std::uint64_t reply_to) {
    const auto id = r.pod<std::uint32_t>();
    const auto offset = r.pod<std::uint64_t>();
    const auto bytes = r.pod<std::uint64_t>();
    const std::byte* from = nullptr;
    std::string refused;
    {
      std::lock_guard<std::mutex> g(windows_mutex_);
      auto it = windows_.find(id);
      if (it == windows_.end() || !it->second.exposed_here) {
        refused = "window " + std::to_string(id) + " is not exposed here";
      } else {
        const std::uint64_t have = it->second.parts[static_cast<std::size_t>(rank())].size;
        if (offset > have || bytes > have - offset) {
          refused = "offset " + std::to_string(offset) + " + size " + std::to_string(bytes) + " is outside this part (" +
                    std::to_string(have) + " bytes)";
        } else {
          from = it->second.data + offset;
        }
      }
    }
    if (reply_to == 0) return;
    detail::Writer w;
    w.zc_threshold = options_.zc_threshold;
    if (from == nullptr) {
      FERRY_LOG_AT(warn, rank(), -1, "amt: refused a get from rank %d: %s", source, refused.c_str());
      w.pod<std::uint8_t>(0);
      w.arg(refused);
    } else {
      Blob b(bytes);
      if (bytes != 0) std::memcpy(b.data(), from, bytes);
      w.pod<std::uint8_t>(1);
      w.arg(std::move(b));
    }
    self_.send_reply(source, reply_to, std::move(w));
  }

  static std::uint64_t window_part_action() noexcept {
    static const std::uint64_t id = detail::hash_name("ferry.amt.window_part");
    return id;
  }
  static std::uint64_t get_action() noexcept {
    static const std::uint64_t id = detail::hash_name("ferry.amt.get");
    return id;
  }

  int rank() const noexcept { return parcelport_->rank(); }
  int size() const noexcept { return parcelport_->size(); }

  Runtime& self_;
  Options options_;
  std::unique_ptr<parcel::Parcelport> parcelport_;
  std::vector<std::thread> workers_;
  std::size_t workers_count_ = 0;
  std::unique_ptr<CallCount[]> progress_calls_;  // by worker, then one for every other thread
  std::atomic<bool> stop_{false};

  ferry::detail::MpmcRing<std::function<void()>*> tasks_;
  std::mutex overflow_mutex_;
  std::deque<std::function<void()>*> overflow_;
  std::atomic<std::size_t> overflow_size_{0};
  std::atomic<std::int64_t> active_{0};  // tasks spawned and not finished

  std::shared_mutex actions_mutex_;
  std::unordered_map<std::uint64_t, std::pair<std::string, detail::Invoker>> actions_;
  std::unordered_multimap<std::uint64_t, std::pair<int, std::shared_ptr<parcel::Parcel>>> parked_;

  // Application parcels, read by the termination waves, which compare two waves. sent_ is
  // relaxed; received_ orders with active_ (count_received).
  std::atomic<std::uint64_t> sent_{0}, received_{0};
  std::atomic<std::uint64_t> errors_{0}, unknown_{0};
  PendingCalls pending_;
  std::unique_ptr<std::atomic<bool>[]> failed_;  // by rank
  std::atomic<int> first_failed_{-1};

  std::mutex term_mutex_;
  std::uint64_t round_ = 0;
  int reports_ = 0;
  std::uint64_t wave_sent_ = 0, wave_received_ = 0;
  bool wave_quiet_ = true;
  std::atomic<bool> finalizing_{false}, stop_received_{false};
  bool finalized_ = false;

  // Windows by id. Declared after parcelport_, so destroyed before it: the exposed memory is
  // deregistered while the parcelport still exists.
  struct WindowPart {
    std::uint64_t size = 0;
    std::vector<std::byte> key;  // for the parcelport's get (empty without one-sided get)
    bool known = false;
  };
  struct WindowState {
    std::byte* data = nullptr;  // this rank's part
    bool exposed_here = false;
    std::unique_ptr<parcel::ExposedMemory> exposed;
    std::vector<WindowPart> parts;  // by rank
    int known = 0;
  };
  std::mutex windows_mutex_;
  std::unordered_map<std::uint32_t, WindowState> windows_;
  std::uint32_t next_window_ = 1;
};

thread_local const Runtime::Impl* Runtime::Impl::tls_worker_of = nullptr;
thread_local int Runtime::Impl::tls_worker_index = 0;
thread_local int Runtime::Impl::tls_task_depth = 0;
thread_local bool Runtime::Impl::tls_inline_ran = false;

Runtime::Runtime(Options options) : impl_(std::make_unique<Impl>(*this, std::move(options))) {
  // The runtime's own actions (windows); calls that arrived earlier were held until now.
  register_invoker(Impl::window_part_action(), "ferry.amt.window_part",
                   [](Runtime& rt, int source, detail::Reader& r, std::uint64_t) { rt.impl_->on_window_part(source, r); });
  register_invoker(Impl::get_action(), "ferry.amt.get", [](Runtime& rt, int source, detail::Reader& r, std::uint64_t reply_to) {
    rt.impl_->on_get_request(source, r, reply_to);
  });
}
Window Runtime::expose(void* data, std::size_t size) { return impl_->expose(data, size); }
Future<void> Runtime::get(int rank, Window w, std::size_t offset, void* dst, std::size_t size) {
  return impl_->get(rank, w, offset, dst, size);
}
bool Runtime::has_one_sided_get() const noexcept { return impl_->parcelport_->has_get(); }
Runtime::~Runtime() {
  try {
    impl_->finalize();
  } catch (const std::exception& e) {
    FERRY_LOG(error, "amt: finalize: %s", e.what());
  }
}
int Runtime::rank() const noexcept { return impl_->rank(); }
int Runtime::size() const noexcept { return impl_->size(); }
int Runtime::threads() const noexcept { return static_cast<int>(impl_->workers_.size()); }
std::string Runtime::parcelport() const { return impl_->parcelport_->name(); }
std::string Runtime::transport() const { return impl_->parcelport_->transport(); }
void Runtime::spawn(std::function<void()> f) { impl_->spawn(std::move(f)); }
bool Runtime::help() { return impl_->help(); }
void Runtime::finalize() { impl_->finalize(); }
std::uint64_t Runtime::parcels_sent() const noexcept { return impl_->sent_.load(std::memory_order_relaxed); }
std::uint64_t Runtime::parcels_received() const noexcept { return impl_->received_.load(std::memory_order_relaxed); }
std::uint64_t Runtime::progress_calls() const noexcept { return impl_->progress_calls(); }
void Runtime::register_invoker(std::uint64_t id, const std::string& name, detail::Invoker invoker) {
  impl_->register_invoker(id, name, std::move(invoker));
}
std::uint64_t Runtime::register_pending(int rank, std::shared_ptr<void> keep, std::function<void(detail::Reader&)> on_reply,
                                        std::function<void(std::exception_ptr)> on_error) {
  return impl_->register_pending(rank, std::move(keep), std::move(on_reply), std::move(on_error));
}
void Runtime::send_call(int rank, std::uint64_t action, std::uint64_t reply_to, detail::Writer&& w) {
  impl_->send(rank, Kind::call, action, reply_to, std::move(w), true);
}
void Runtime::send_reply(int rank, std::uint64_t token, detail::Writer&& w) {
  impl_->send(rank, Kind::reply, token, 0, std::move(w), true);
}
std::size_t Runtime::zc_threshold() const noexcept { return impl_->options_.zc_threshold; }
std::uint64_t Runtime::errors() const noexcept {
  return impl_->errors_.load(std::memory_order_relaxed) + impl_->unknown_.load(std::memory_order_relaxed);
}

}  // namespace ferry::amt
