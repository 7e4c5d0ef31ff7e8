#include "core/lock_model.hpp"

#include <rdma/fi_errno.h>

#include <exception>
#include <utility>
#include <vector>

#include "common/cpu_relax.hpp"
#include "common/log.hpp"
#include "core/device.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {

// ---- csync nodes ---------------------------------------------------------------------------

// One announced call. The announcing thread owns `req` (on its stack) until `wait` drops;
// the combiner writes result/error, then completed (release), then wait (release); the owner
// reads them after seeing wait == false (acquire).
struct ThreadSafety::Node {
  std::atomic<Node*> next{nullptr};
  std::atomic<bool> wait{false};
  std::atomic<bool> completed{false};
  const OpDesc::Args* req = nullptr;
  Status result{};
  std::exception_ptr error;
};

namespace {

std::atomic<std::uint64_t> next_generation{1};

// Each thread keeps one spare node per ThreadSafety (keyed by generation, never by address,
// so a node of a destroyed device is never reused). Nodes change hands in CC-Synch: the node a
// thread announces in becomes the spare of that thread, the spare goes into the list.
struct Spare {
  std::uint64_t generation;
  void* node;
};
thread_local std::vector<Spare> tls_spares;

std::mutex all_nodes_mutex;
std::vector<std::pair<std::uint64_t, void*>> all_nodes;  // for deletion with their device

}  // namespace

// ---- ThreadSafety ------------------------------------------------------------------------------

ThreadSafety::ThreadSafety(DeviceImpl& device, LockModel model)
    : dev_(device), model_(model), generation_(next_generation.fetch_add(1, std::memory_order_relaxed)) {
  if (model_ == LockModel::csync) {
    auto* dummy = new Node;
    {
      std::lock_guard<std::mutex> g(all_nodes_mutex);
      all_nodes.emplace_back(generation_, dummy);
    }
    tail_.store(dummy, std::memory_order_release);
  }
  if (model_ == LockModel::offload) offload_ = std::thread([this] { offload_loop(); });
}

ThreadSafety::~ThreadSafety() {
  stop();
  while (OpDesc* d = (stuck_ != nullptr ? std::exchange(stuck_, nullptr) : queue_.pop())) delete d;
  std::lock_guard<std::mutex> g(all_nodes_mutex);
  for (auto it = all_nodes.begin(); it != all_nodes.end();) {
    if (it->first == generation_) {
      delete static_cast<Node*>(it->second);
      it = all_nodes.erase(it);
    } else {
      ++it;
    }
  }
}

void ThreadSafety::stop() {
  if (offload_.joinable()) {
    stop_.store(true, std::memory_order_release);
    offload_.join();
  }
}

Status ThreadSafety::execute(const OpDesc::Args& args) {
  return std::visit(
      [this](const auto& a) -> Status {
        using A = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<A, std::monostate>) {
          Status s;
          s.size = dev_.progress() ? 1 : 0;  // a progress call: "did something" rides in size
          return s;
        } else if constexpr (std::is_same_v<A, AmArgs>) {
          return dev_.post_am(a);
        } else if constexpr (std::is_same_v<A, AmIovecArgs>) {
          return dev_.post_am_iovec(a);
        } else if constexpr (std::is_same_v<A, SendArgs>) {
          return dev_.post_send(a);
        } else if constexpr (std::is_same_v<A, RecvArgs>) {
          return dev_.post_recv(a);
        } else if constexpr (std::is_same_v<A, PutArgs>) {
          return dev_.post_put(a);
        } else {
          return dev_.post_get(a);
        }
      },
      args);
}

namespace {

// What a deferred operation that finished at once reports to its local completion object.
Completion completion_of(const OpDesc::Args& args, const Status& s, CompletionObject** local) {
  Completion c;
  std::visit(
      [&](const auto& a) {
        using A = std::decay_t<decltype(a)>;
        if constexpr (!std::is_same_v<A, std::monostate>) {
          *local = a.local;
          c.context = a.context;
          c.rank = a.rank;
          if constexpr (std::is_same_v<A, AmArgs>) {
            c.op = OpKind::am, c.tag = a.tag, c.size = a.size;
          } else if constexpr (std::is_same_v<A, AmIovecArgs>) {
            c.op = OpKind::am, c.tag = a.tag;
          } else if constexpr (std::is_same_v<A, SendArgs>) {
            c.op = OpKind::send, c.tag = a.tag, c.size = a.size;
          } else if constexpr (std::is_same_v<A, RecvArgs>) {
            c.op = OpKind::recv, c.rank = s.rank, c.tag = s.tag, c.size = s.size;
          } else if constexpr (std::is_same_v<A, PutArgs>) {
            c.op = OpKind::put, c.size = a.size;
          } else {
            c.op = OpKind::get, c.size = a.size;
          }
        }
      },
      args);
  return c;
}

}  // namespace

Status ThreadSafety::execute_deferred(OpDesc* d) {
  Status s;
  try {
    s = execute(d->args);
  } catch (const std::exception& e) {
    // Arguments were validated before deferring, so this is the provider failing.
    FERRY_LOG_AT(error, log_rank(), dev_.index(), "a deferred operation failed: %s", e.what());
    CompletionObject* local = nullptr;
    Completion c = completion_of(d->args, s, &local);
    c.error = -FI_EIO;
    const bool told_done = d->returned_done;
    delete d;
    if (local != nullptr && !told_done) local->signal(std::move(c));
    return Status::make_done();
  }
  if (s.is_retry()) return s;
  if (s.is_done() && !d->returned_done) {
    CompletionObject* local = nullptr;
    Completion c = completion_of(d->args, s, &local);
    if (local != nullptr) local->signal(std::move(c));
  }
  delete d;
  return s;
}

void ThreadSafety::note_batch(std::uint64_t n) noexcept {
  if (n == 0) return;
  combined_.fetch_add(n, std::memory_order_relaxed);
  std::uint64_t seen = max_batch_.load(std::memory_order_relaxed);
  while (n > seen && !max_batch_.compare_exchange_weak(seen, n, std::memory_order_relaxed)) {
  }
}

bool ThreadSafety::combine() {
  bool any = false;
  std::uint64_t batch = 0;
  struct Note {
    ThreadSafety* t;
    std::uint64_t* n;
    ~Note() { t->note_batch(*n); }
  } note{this, &batch};
  for (int n = 0; n < kMaxCombine; ++n) {
    OpDesc* d = stuck_ != nullptr ? std::exchange(stuck_, nullptr) : queue_.pop();
    if (d == nullptr) break;
    if (execute_deferred(d).is_retry()) {
      stuck_ = d;  // keeps its place: order per device is preserved
      dev_.progress();
      break;
    }
    queued_.fetch_sub(1, std::memory_order_relaxed);
    ++batch;
    any = true;
  }
  return any;
}

Status ThreadSafety::defer(OpDesc::Args&& args) {
  auto* d = new OpDesc;
  d->args = std::move(args);
  // Eager payloads are copied now, so the caller gets the `done` the direct call would give.
  auto keep = [d](const void* buffer, std::size_t size) -> const void* {
    const auto* p = static_cast<const unsigned char*>(buffer);
    d->copy.assign(p, p + size);
    return d->copy.data();
  };
  std::visit(
      [&](auto& a) {
        using A = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<A, AmArgs> || std::is_same_v<A, SendArgs>) {
          if (a.size <= dev_.eager_limit()) {
            a.buffer = keep(a.buffer, a.size);
            d->returned_done = true;
          }
        } else if constexpr (std::is_same_v<A, AmIovecArgs>) {
          a.eager.buffer = keep(a.eager.buffer, a.eager.size);  // the parts stay the caller's
        } else if constexpr (std::is_same_v<A, PutArgs>) {
          if (!a.notify && a.size <= dev_.caps().inject_size) {
            a.buffer = keep(a.buffer, a.size);
            d->returned_done = true;
          }
        }
      },
      d->args);
  const bool done = d->returned_done;
  queued_.fetch_add(1, std::memory_order_relaxed);  // a statistic for teardown: relaxed
  deferred_.fetch_add(1, std::memory_order_relaxed);
  queue_.push(d);
  return done ? Status::make_done() : Status::make_posted();
}

Status ThreadSafety::post(OpDesc::Args&& args) {
  switch (model_) {
    case LockModel::lockless:
      return execute(args);
    case LockModel::trylock: {
      if (!try_lock_.try_lock()) return Status::make_retry(RetryReason::lock);
      std::lock_guard<SpinLock> g(try_lock_, std::adopt_lock);
      return execute(args);
    }
    case LockModel::block: {
      std::lock_guard<std::mutex> g(block_);
      return execute(args);
    }
    case LockModel::lockq: {
      dev_.validate(args);
      if (!try_lock_.try_lock()) return defer(std::move(args));
      std::lock_guard<SpinLock> g(try_lock_, std::adopt_lock);
      combine();
      // Older descriptors still waiting go first: this call queues behind them.
      if (stuck_ != nullptr || queued_.load(std::memory_order_relaxed) != 0) return defer(std::move(args));
      return execute(args);
    }
    case LockModel::csync:
      dev_.validate(args);
      return csync(args, nullptr);
    case LockModel::offload:
      dev_.validate(args);
      return defer(std::move(args));
  }
  return Status::make_retry(RetryReason::lock);
}

bool ThreadSafety::progress() {
  switch (model_) {
    case LockModel::lockless:
      return dev_.progress();
    case LockModel::trylock: {
      if (!try_lock_.try_lock()) return false;
      std::lock_guard<SpinLock> g(try_lock_, std::adopt_lock);
      return dev_.progress();
    }
    case LockModel::block: {
      std::lock_guard<std::mutex> g(block_);
      return dev_.progress();
    }
    case LockModel::lockq: {
      // Try the lock with exponential back-off; never block.
      for (int attempt = 0, pause = 1; attempt < 4; ++attempt, pause *= 4) {
        if (try_lock_.try_lock()) {
          std::lock_guard<SpinLock> g(try_lock_, std::adopt_lock);
          const bool combined = combine();
          return dev_.progress() || combined;
        }
        for (int i = 0; i < pause; ++i) cpu_relax();
      }
      return false;
    }
    case LockModel::csync: {
      bool progressed = false;
      (void)csync(OpDesc::Args{}, &progressed);
      return progressed;
    }
    case LockModel::offload:
      // The communication thread progresses; a caller spinning here gives it the core.
      std::this_thread::yield();
      return false;
  }
  return false;
}

Status ThreadSafety::csync(const OpDesc::Args& args, bool* progressed) {
  // This thread's spare node for this device.
  Node* mine = nullptr;
  Spare* slot = nullptr;
  for (auto& s : tls_spares) {
    if (s.generation == generation_) {
      slot = &s;
      mine = static_cast<Node*>(s.node);
      break;
    }
  }
  if (mine == nullptr) {
    mine = new Node;
    {
      std::lock_guard<std::mutex> g(all_nodes_mutex);
      all_nodes.emplace_back(generation_, mine);
    }
    tls_spares.push_back({generation_, mine});
    slot = &tls_spares.back();
  }
  mine->next.store(nullptr, std::memory_order_relaxed);
  mine->wait.store(true, std::memory_order_relaxed);
  mine->completed.store(false, std::memory_order_relaxed);
  // acq_rel: publishes the reset node to the next announcer, and receives the node the
  // previous announcer prepared.
  Node* cur = tail_.exchange(mine, std::memory_order_acq_rel);
  cur->req = &args;
  cur->error = nullptr;
  cur->next.store(mine, std::memory_order_release);  // announces the request to the combiner
  slot->node = cur;                                   // the announced node becomes the spare

  for (int spins = 0; cur->wait.load(std::memory_order_acquire); ++spins) {
    if (spins < 128) {
      cpu_relax();
    } else {
      std::this_thread::yield();  // the combiner may be preempted: give it the core
    }
  }
  if (!cur->completed.load(std::memory_order_acquire)) {
    // This thread is the combiner: serve announced requests in order, its own first.
    Node* tmp = cur;
    std::uint64_t served = 0;
    for (int n = 0; n < kMaxCombine; ++n, ++served) {
      Node* next = tmp->next.load(std::memory_order_acquire);
      if (next == nullptr) break;  // tmp is the tail: its request is not announced yet
      try {
        tmp->result = execute(*tmp->req);
      } catch (...) {
        tmp->error = std::current_exception();
      }
      tmp->completed.store(true, std::memory_order_release);
      tmp->wait.store(false, std::memory_order_release);
      tmp = next;
    }
    tmp->wait.store(false, std::memory_order_release);  // hands the combiner role on
    if (served > 1) note_batch(served - 1);  // calls of other threads
  }
  if (cur->error) std::rethrow_exception(cur->error);
  if (progressed != nullptr) *progressed = cur->result.size != 0;
  return cur->result;
}

void ThreadSafety::offload_loop() {
  int idle = 0;
  for (;;) {
    const bool combined = combine();
    const bool progressed = dev_.progress();
    if (combined || progressed) {
      idle = 0;
      continue;
    }
    if (stop_.load(std::memory_order_acquire) && stuck_ == nullptr && queued_.load(std::memory_order_relaxed) == 0) return;
    if (++idle >= 64) {
      std::this_thread::yield();
      idle = 0;
    }
  }
}

}  // namespace ferry::detail
