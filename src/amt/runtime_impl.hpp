// runtime_impl.hpp — the AMT runtime's private declarations: Runtime::Impl (the worker pool and
// task queue, action dispatch, calls and their replies, termination, windows) and what it keeps
// on the wire and in its tables: a parcel's kind, the calls waiting for replies (PendingCalls),
// a termination report. Every parcel starts with its kind (one byte), then two u64 (a call's
// action id and reply token, a reply's token, a wave's round), then the serialized arguments.
// The member functions live with what they own:
//   runtime.cpp      construction and teardown, Runtime's public members, the option table
//   workers.cpp      the workers, the task queue and its overflow, progress-call counts
//   calls.cpp        incoming parcels, actions, calls and replies, sends, peer failure
//   termination.cpp  finalize's termination waves
//   windows.cpp      windows: expose and get
//   collectives.cpp  collectives on a binomial tree of parcels, and the remote counters
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/mpmc_ring.hpp"
#include "ferry/amt.hpp"
#include "ferry/parcel.hpp"

namespace ferry::amt {

namespace detail {

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

}  // namespace detail

// Runtime::Impl's files name these unqualified.
using detail::Kind;
using detail::Pending;
using detail::PendingCalls;
using detail::Report;

class Runtime::Impl final : public parcel::Upcalls {
 public:
  Impl(Runtime& self, Options options);
  ~Impl() override;

  // ---- upcalls (inside background_work, any worker) -----------------------------------
  std::vector<parcel::Chunk> allocate_zc_chunks(int, const parcel::Chunk&, const std::vector<std::size_t>& sizes) override;
  void handle_parcel(int source, parcel::Parcel&& p) override;

  // ---- tasks ----------------------------------------------------------------------------
  // A termination wave must never see an application parcel received while the work it
  // starts is not yet active: that rank would report idle with the parcel counted, and
  // if its thread is preempted in between for the length of two waves (a millisecond on an
  // oversubscribed machine), both waves balance and rank 0 stops everyone with the task
  // still to run. So a handler makes the work active first (acq_rel on active_), then counts
  // the parcel here with a release increment; a report that reads the count with acquire
  // therefore reads active_ after that increment, and sees the work active or finished.
  void count_received() noexcept { received_.fetch_add(1, std::memory_order_release); }

  void spawn(std::function<void()> f);
  void push_task(std::function<void()> f);
  bool run_one();
  void run_inline(int source, parcel::Parcel& p);
  bool help();

  // Calls of background_work, for the applications' reports. A worker counts in its own
  // cache line with a plain load and store (it is the line's only writer; readers may see a
  // count a call or two old); every other thread shares the last line, with fetch_add.
  struct alignas(64) CallCount {
    std::atomic<std::uint64_t> n{0};
  };
  void count_progress_call() noexcept;
  std::uint64_t progress_calls() const noexcept;

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

  void work(int index);

  // ---- actions ------------------------------------------------------------------------------
  void register_invoker(std::uint64_t id, const std::string& name, detail::Invoker inv);
  void run_call(int source, parcel::Parcel& p);
  void run_reply(int source, parcel::Parcel& p);
  static void free_zc(parcel::Parcel& p, const std::vector<bool>& taken);
  std::uint64_t register_pending(int rank, std::shared_ptr<void> keep, std::function<void(detail::Reader&)> on_reply,
                                 std::function<void(std::exception_ptr)> on_error);
  void send(int dest, Kind kind, std::uint64_t a, std::uint64_t b, detail::Writer&& w, bool count);

  // ---- peer failure (parcel::Upcalls) ----------------------------------------------------------
  void peer_failed(int r) override;
  void send_failed(int destination, int) override;
  void receive_failed(int source, parcel::Parcel&& p, int) override;
  void fail_calls(int r);
  void throw_if_failed(const char* call);

  // ---- termination ----------------------------------------------------------------------------
  void on_control(Kind kind, int source, const parcel::Parcel& p);
  void finalize();
  void run_waves();

  // ---- windows: expose and get ------------------------------------------------------------
  Window expose(void* data, std::size_t bytes);
  void on_window_part(int source, detail::Reader& r);
  Future<void> get(int from, Window win, std::size_t offset, void* dst, std::size_t bytes);
  void on_get_request(int source, detail::Reader& r, std::uint64_t reply_to);
  static std::uint64_t window_part_action() noexcept;
  static std::uint64_t get_action() noexcept;

  // ---- collectives and counters -------------------------------------------------------------
  // One collective, by its number (the k-th called on every rank is one operation): made by
  // this rank's call or by the first parcel for it, whichever comes first; erased once done.
  struct Collective {
    int kind = -1;  // 0 gather, 1 broadcast
    int root = 0;
    bool started = false;  // this rank called it
    bool sent_up = false;  // gather: this rank's subtree's parts went to its parent
    int ups = 0;           // gather: children whose parts came
    std::size_t part_size = 0;
    std::vector<std::vector<std::byte>> parts;  // gather: by rank, as known so far
    std::vector<bool> have;
    bool down_arrived = false;  // the result came down (a broadcast may before this rank's call)
    std::vector<std::vector<std::byte>> result;
    std::function<void(std::vector<std::vector<std::byte>>&&)> done;
    std::function<void(std::exception_ptr)> failed;
  };
  void start_collective(int kind, int root, std::vector<std::byte> mine,
                        std::function<void(std::vector<std::vector<std::byte>>&&)> done,
                        std::function<void(std::exception_ptr)> failed, std::size_t part_size);
  void on_coll_up(int source, detail::Reader& r);
  void on_coll_down(int source, detail::Reader& r);
  // Under coll_mutex_: what a collective's state now allows (parts up, the result down, its
  // end), appended to `then` to run once the mutex is released.
  void advance(std::uint64_t seq, Collective& c, std::vector<std::function<void()>>& then);
  void send_coll(int dest, std::uint64_t action, std::uint64_t seq, int kind, int root,
                 const std::vector<std::vector<std::byte>>& parts, const std::vector<bool>* which);
  void fail_collectives(int r);
  Counter counter(std::int64_t initial);
  Future<std::int64_t> counter_op(int rank, Counter c, std::uint8_t op, std::int64_t a, std::int64_t b);
  void on_counter_request(int source, detail::Reader& r, std::uint64_t reply_to);
  std::int64_t counter_value(Counter c);
  static std::uint64_t coll_up_action() noexcept;
  static std::uint64_t coll_down_action() noexcept;
  static std::uint64_t counter_action() noexcept;

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

  std::mutex coll_mutex_;
  std::unordered_map<std::uint64_t, Collective> colls_;  // under coll_mutex_
  std::uint64_t next_coll_ = 1;                         // under coll_mutex_
  std::mutex counters_mutex_;
  std::deque<std::atomic<std::int64_t>> counters_;  // counter id i + 1; a deque never moves them
};

}  // namespace ferry::amt
