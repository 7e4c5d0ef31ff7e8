// workers.cpp — the AMT runtime's workers and tasks: each worker's loop (pinning, idling), the
// task queue with its mutex-guarded overflow, a task run (or a call run inline on the worker
// that polled it) with the worker marked busy for the parcelport, and the count of
// background_work calls.
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "amt/runtime_impl.hpp"
#include "common/log.hpp"

namespace ferry::amt {

void Runtime::Impl::spawn(std::function<void()> f) {
  active_.fetch_add(1, std::memory_order_acq_rel);
  push_task(std::move(f));
}

// Queues a task already counted in active_.
void Runtime::Impl::push_task(std::function<void()> f) {
  auto* t = new std::function<void()>(std::move(f));
  if (tasks_.try_push(t)) return;
  std::lock_guard<std::mutex> g(overflow_mutex_);
  overflow_.push_back(t);
  overflow_size_.store(overflow_.size(), std::memory_order_relaxed);
}

bool Runtime::Impl::run_one() {
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
void Runtime::Impl::run_inline(int source, parcel::Parcel& p) {
  try {
    const BusyMark busy(*this);
    run_call(source, p);
  } catch (const std::exception& e) {
    FERRY_LOG_AT(error, rank(), -1, "amt: a task failed: %s", e.what());
    errors_.fetch_add(1, std::memory_order_relaxed);
  }
  active_.fetch_sub(1, std::memory_order_acq_rel);
}

bool Runtime::Impl::help() {
  if (run_one()) return true;
  tls_inline_ran = false;
  count_progress_call();
  return parcelport_->background_work();
}

void Runtime::Impl::count_progress_call() noexcept {
  if (tls_worker_of == this) {
    std::atomic<std::uint64_t>& n = progress_calls_[static_cast<std::size_t>(tls_worker_index)].n;
    n.store(n.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  } else {
    progress_calls_[workers_count_].n.fetch_add(1, std::memory_order_relaxed);
  }
}

std::uint64_t Runtime::Impl::progress_calls() const noexcept {
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i <= workers_count_; ++i) sum += progress_calls_[i].n.load(std::memory_order_relaxed);
  return sum;
}

void Runtime::Impl::work(int index) {
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

thread_local const Runtime::Impl* Runtime::Impl::tls_worker_of = nullptr;
thread_local int Runtime::Impl::tls_worker_index = 0;
thread_local int Runtime::Impl::tls_task_depth = 0;
thread_local bool Runtime::Impl::tls_inline_ran = false;

}  // namespace ferry::amt
