// ferry_parcelport_progress.cpp — background_work and what it runs: the progress modes
// (FERRY_PROGRESS), the devices a thread polls (FERRY_DEVICE_POLLING, parcel_queues=device),
// progress stealing and its owners, the drain of completion queues and synchronizers, and the
// deferred list of posts that met back-pressure.
#include <atomic>
#include <functional>
#include <mutex>

#include "parcel/ferry_parcelport_impl.hpp"

namespace ferry::parcel::detail {

bool FerryParcelport::background_work() {
  // One relaxed-cost load per call: the core's failure count (see report_failures).
  if (__builtin_expect(rt_.failure_count() != failures_reported_.load(std::memory_order_relaxed), 0)) report_failures();
  bool any = false;
  switch (progress_) {
    case Progress::explicit_calls:
      any = poll_devices();
      any |= run_deferred();
      any |= drain_completions();
      break;
    case Progress::implicit:
      // MPI's way: the progress engine runs only when testing found nothing to do.
      any = run_deferred();
      any |= drain_completions();
      if (!any) {
        any = poll_devices();
        any |= drain_completions();
      }
      break;
    case Progress::thread:  // the core's progress threads progress; the workers only consume
      any = run_deferred();
      any |= drain_completions();
      break;
    case Progress::steal:
      any = steal();
      any |= run_deferred();
      any |= drain_completions();
      break;
  }
  return any;
}

void FerryParcelport::worker_busy(bool busy) noexcept {
  if (progress_ != Progress::steal) return;
  PerThread& t = per_thread();
  const int d = thread_index() % rt_.device_count();
  if (t.owner_of != generation_) {  // first report from this thread: it owns its device
    t.owner_of = generation_;
    policy_->add_owner(d, t.numa_node());
  }
  policy_->owner_busy(d, busy);
}

FerryParcelport::PerThread& FerryParcelport::per_thread() {
  thread_local PerThread t;
  return t;
}

// parcel_queues=device: what "polling device d" means: progress it (unless progress threads
// do that) and handle what its own queue holds. Nobody else takes d's completions, so a
// parcel on a busy worker's device waits for a poller, as [MPI-AMT] §5.2 describes.
bool FerryParcelport::service(int d, bool progress) {
  bool any = progress && progress_device(d);
  any |= drain_queue(cq_of(d));
  return any;
}

// explicit / implicit: progress the devices FERRY_DEVICE_POLLING picks.
bool FerryParcelport::poll_devices() {
  return for_polled_devices([this](int d) { return per_device_ ? service(d, true) : progress_device(d); });
}

// Applies visit to the devices FERRY_DEVICE_POLLING picks for this call; true if any visit was.
template <class Visit>
bool FerryParcelport::for_polled_devices(Visit&& visit) {
  const int n = static_cast<int>(devs_.size());
  if (n == 1) return visit(0);
  const int own = thread_index() % n;
  PerThread& t = per_thread();
  switch (polling_) {
    case Polling::local: {
      bool any = visit(own);
      // Starvation guard: a device no thread maps to (fewer pollers than devices, or a
      // poller that left) would never progress. One idle call in 4096 also polls another
      // device, which keeps "local" live (a worker's idle loop makes that call within about
      // a millisecond) without making it "global": a parcel on a busy worker's device still
      // waits for that worker's task to end, as [MPI-AMT] §5.2 describes, unless the task
      // is long. (One in 256 answered within tens of microseconds and hid that cost.)
      if (!any && (++t.misses & 4095u) == 0) any = visit((own + 1 + t.rng.below(n - 1)) % n);
      return any;
    }
    case Polling::random:
      return visit(t.rng.below(n));
    case Polling::global: {
      bool any = false;
      for (int k = 0; k < n; ++k) any |= visit((own + k) % n);  // own first
      return any;
    }
  }
  return false;
}

bool FerryParcelport::steal() {
  PerThread& t = per_thread();
  // With queues per device, the queues of the devices progressed here are drained after the
  // policy dropped its in_progress flag: a parcel handled here may run its task inline, and
  // a device must not look taken (unstealable) for the length of a task. StealPolicy::poll
  // progresses at most two devices per call (its own, then one victim), hence two slots.
  int visited[2];
  int nvisited = 0;
  bool any = policy_->poll(thread_index() % static_cast<int>(devs_.size()), t.numa_node(), t.rng, [&](int d) {
    if (nvisited < 2) visited[nvisited++] = d;
    return progress_device(d);
  });
  if (per_device_) {
    for (int i = 0; i < nvisited; ++i) any |= drain_queue(cq_of(visited[i]));
  }
  return any;
}

// Everything that finished: the completion queue, and with completion=sync the header
// slots and one window of the synchronizer pool.
bool FerryParcelport::drain_completions() {
  bool any = false;
  // Relaxed: a stale zero leaves a finished get to the next call.
  if (__builtin_expect(gets_in_flight_.load(std::memory_order_relaxed) != 0, 0)) any = drain_gets();
  // Relaxed: a stale false only leaves an overflowed completion to the next call.
  if (use_cq() || cq_overflow_.load(std::memory_order_relaxed)) {
    // parcel_queues=device: the queues of the devices the polling policy picks. explicit and
    // steal drained them as they progressed; implicit tests them before it progresses;
    // progress threads leave the workers only the queues.
    if (!per_device_) {
      any |= drain_queue(*cqs_[0]);
    } else if (progress_ == Progress::thread || progress_ == Progress::implicit) {
      any |= for_polled_devices([this](int d) { return service(d, false); });
    }
  }
  if (sync_) {
    for (auto& hs : header_slots_) {
      Completion c;
      if (!hs->slot.claim(c)) continue;
      any = true;
      on_header_recv(hs.get(), std::move(c));
    }
    any |= pool_->poll([this](Completion&& c) { handle(std::move(c)); });
  }
  return any;
}

bool FerryParcelport::drain_queue(CompletionQueue& q) {
  bool any = false;
  for (int i = 0; i < 8; ++i) {
    auto c = q.pop();
    if (!c) break;
    any = true;
    handle(std::move(*c));
  }
  return any;
}

void FerryParcelport::defer(std::function<bool()> step) {
  std::lock_guard<std::mutex> g(deferred_mutex_);
  deferred_.push_back(std::move(step));
  deferred_count_.store(deferred_.size(), std::memory_order_relaxed);
}

// Runs the deferred steps in order, stopping at the first that still cannot go (follow-ups
// of one parcel stay in order). One runner at a time (deferred_running_, a try-flag: acquire
// on taking it, release on dropping it, so the next runner sees the list as this one left
// it). The runner takes one step at a time off the front and runs it without the mutex: a
// step may defer() again (a header re-post, an upcall that sends), which appends at the back.
// A step that cannot go returns to the front, so a call costs the steps it runs, not the
// length of the list (thousands of parcels may wait behind a full queue).
bool FerryParcelport::run_deferred() {
  // Relaxed: a stale zero only postpones the work to a later call.
  if (deferred_count_.load(std::memory_order_relaxed) == 0) return false;
  if (deferred_running_.exchange(true, std::memory_order_acquire)) return false;
  struct Release {
    std::atomic<bool>& running;
    ~Release() { running.store(false, std::memory_order_release); }
  } release{deferred_running_};
  bool any = false;
  for (;;) {
    std::function<bool()> step;
    {
      std::lock_guard<std::mutex> g(deferred_mutex_);
      if (deferred_.empty()) break;
      step = std::move(deferred_.front());
      deferred_.pop_front();
      deferred_count_.store(deferred_.size(), std::memory_order_relaxed);
    }
    bool went = false;
    try {
      went = step();
    } catch (...) {
      put_back(std::move(step));
      throw;
    }
    if (!went) {
      put_back(std::move(step));
      break;
    }
    any = true;
  }
  return any;
}

void FerryParcelport::put_back(std::function<bool()> step) {
  std::lock_guard<std::mutex> g(deferred_mutex_);
  deferred_.push_front(std::move(step));
  deferred_count_.store(deferred_.size(), std::memory_order_relaxed);
}

}  // namespace ferry::parcel::detail
