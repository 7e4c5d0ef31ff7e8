#include "core/lock_model.hpp"

#include <cerrno>

#include <exception>
#include <utility>
#include <vector>

#include "common/cpu_relax.hpp"
#include "common/log.hpp"
#include "core/device.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {

// ---- what the lock model knows of each operation ------------------------------------------
//
// Every post reaches the lock model with its static type (LockModelImpl::post<A>), so each
// per-operation rule below is an overload chosen at compile time. Only a deferred descriptor
// has lost its type: execute_deferred is the one visitor of OpDesc::Args.

namespace {

Status perform(DeviceImpl& d, const AmArgs& a) { return d.post_am(a); }
Status perform(DeviceImpl& d, const AmIovecArgs& a) { return d.post_am_iovec(a); }
Status perform(DeviceImpl& d, const SendArgs& a) { return d.post_send(a); }
Status perform(DeviceImpl& d, const RecvArgs& a) { return d.post_recv(a); }
Status perform(DeviceImpl& d, const PutArgs& a) { return d.post_put(a); }
Status perform(DeviceImpl& d, const GetArgs& a) { return d.post_get(a); }
Status perform(DeviceImpl& d, const AtomicArgs& a) { return d.post_atomic(a); }

// What a deferred operation that finished at once reports to its local completion object.
Completion completion(OpKind op, int rank, Tag tag, std::size_t size, void* context) {
  Completion c;
  c.op = op, c.rank = rank, c.tag = tag, c.size = size, c.context = context;
  return c;
}
Completion completion_of(const AmArgs& a, const Status&) { return completion(OpKind::am, a.rank, a.tag, a.size, a.context); }
Completion completion_of(const AmIovecArgs& a, const Status&) { return completion(OpKind::am, a.rank, a.tag, 0, a.context); }
Completion completion_of(const SendArgs& a, const Status&) {
  return completion(OpKind::send, a.rank, a.tag, a.size, a.context);
}
// A receive reports what arrived: the sender, its tag and the bytes delivered.
Completion completion_of(const RecvArgs& a, const Status& s) {
  return completion(OpKind::recv, s.rank, s.tag, s.size, a.context);
}
Completion completion_of(const PutArgs& a, const Status&) { return completion(OpKind::put, a.rank, 0, a.size, a.context); }
Completion completion_of(const GetArgs& a, const Status&) { return completion(OpKind::get, a.rank, 0, a.size, a.context); }
Completion completion_of(const AtomicArgs& a, const Status&) {
  return completion(OpKind::atomic, a.rank, 0, size_of(a.type), a.context);
}

// Copies `size` bytes into the descriptor and returns where they now are.
const void* keep(OpDesc& d, const void* buffer, std::size_t size) {
  const auto* p = static_cast<const unsigned char*>(buffer);
  d.copy.assign(p, p + size);
  return d.copy.data();
}
// Eager payloads are copied into the descriptor when it is made, so the caller gets the
// `done` the direct call would give and may reuse its buffer at once. Returns whether the
// caller is told `done`.
bool keep_eager(const DeviceImpl& dev, OpDesc& d, AmArgs& a) {
  if (a.size > dev.eager_limit()) return false;
  a.buffer = keep(d, a.buffer, a.size);
  return true;
}
bool keep_eager(const DeviceImpl& dev, OpDesc& d, SendArgs& a) {
  if (a.size > dev.eager_limit()) return false;
  a.buffer = keep(d, a.buffer, a.size);
  return true;
}
bool keep_eager(const DeviceImpl&, OpDesc& d, AmIovecArgs& a) {
  a.eager.buffer = keep(d, a.eager.buffer, a.eager.size);  // the parts stay the caller's
  return false;
}
bool keep_eager(const DeviceImpl& dev, OpDesc& d, PutArgs& a) {
  if (a.notify || a.size > dev.inject_size(a.rank)) return false;
  a.buffer = keep(d, a.buffer, a.size);
  return true;
}
bool keep_eager(const DeviceImpl&, OpDesc&, RecvArgs&) { return false; }
bool keep_eager(const DeviceImpl&, OpDesc&, GetArgs&) { return false; }
// An atomic's values are in its arguments; its result is written when it is performed.
bool keep_eager(const DeviceImpl&, OpDesc&, AtomicArgs&) { return false; }

}  // namespace

// ---- csync nodes ---------------------------------------------------------------------------

// One announced call. The announcing thread owns `args` (on its stack) until `wait` drops;
// the combiner runs `call`, which writes result or progressed, then writes error, completed
// (release) and wait (release); the owner reads them after seeing wait == false (acquire).
struct CsyncNode {
  std::atomic<CsyncNode*> next{nullptr};
  std::atomic<bool> wait{false};
  std::atomic<bool> completed{false};
  void (*call)(DeviceImpl&, CsyncNode&) = nullptr;
  const void* args = nullptr;  // what call reads: an AmArgs, SendArgs, ... (null for progress)
  Status result{};
  bool progressed = false;
  std::exception_ptr error;
};

namespace {

template <class A>
void announced_post(DeviceImpl& dev, CsyncNode& n) {
  n.result = perform(dev, *static_cast<const A*>(n.args));
}

void announced_progress(DeviceImpl& dev, CsyncNode& n) { n.progressed = dev.progress(); }

// csync's form of exclusive(): args points at the call.
struct ExclusiveCall {
  bool (*fn)(DeviceImpl&, void*);
  void* ctx;
};
void announced_exclusive(DeviceImpl& dev, CsyncNode& n) {
  const auto* call = static_cast<const ExclusiveCall*>(n.args);
  n.progressed = call->fn(dev, call->ctx);
}

std::atomic<std::uint64_t> next_generation{1};

// Each thread keeps one spare node per LockModelImpl (keyed by generation, never by address,
// so a node of a destroyed device is never reused). Nodes change hands in CC-Synch: the node a
// thread announces in becomes the spare of that thread, the spare goes into the list.
struct Spare {
  std::uint64_t generation;
  CsyncNode* node;
};
thread_local std::vector<Spare> tls_spares;

std::mutex all_nodes_mutex;
std::vector<std::pair<std::uint64_t, CsyncNode*>> all_nodes;  // for deletion with their device

}  // namespace

// ---- LockModelImpl ---------------------------------------------------------------------------

// Marks the calling thread inside the device for a scope (see inside_). lockq and offload never
// mark it: a call from inside is queued behind the descriptors already waiting, which keeps
// their order, and never waits.
class LockModelImpl::Inside {
 public:
  explicit Inside(LockModelImpl& m) noexcept : m_(m) { m_.inside_.store(std::this_thread::get_id(), std::memory_order_relaxed); }
  ~Inside() { m_.inside_.store(std::thread::id{}, std::memory_order_relaxed); }
  Inside(const Inside&) = delete;
  Inside& operator=(const Inside&) = delete;

 private:
  LockModelImpl& m_;
};

LockModelImpl::LockModelImpl(DeviceImpl& device, LockModel model)
    : dev_(device), model_(model), generation_(next_generation.fetch_add(1, std::memory_order_relaxed)) {
  if (model_ == LockModel::lockless || model_ == LockModel::serialized) {
    throw Error("LockModelImpl: lockless and serialized call the device directly, without a lock model");
  }
  if (model_ == LockModel::csync) {
    auto* dummy = new CsyncNode;
    {
      std::lock_guard<std::mutex> g(all_nodes_mutex);
      all_nodes.emplace_back(generation_, dummy);
    }
    tail_.store(dummy, std::memory_order_release);
  }
  if (model_ == LockModel::offload) offload_ = std::thread([this] { offload_loop(); });
}

LockModelImpl::~LockModelImpl() {
  stop();
  while (OpDesc* d = (stuck_ != nullptr ? std::exchange(stuck_, nullptr) : queue_.pop())) delete d;
  std::lock_guard<std::mutex> g(all_nodes_mutex);
  for (auto it = all_nodes.begin(); it != all_nodes.end();) {
    if (it->first == generation_) {
      delete it->second;
      it = all_nodes.erase(it);
    } else {
      ++it;
    }
  }
}

void LockModelImpl::stop() {
  if (offload_.joinable()) {
    stop_.store(true, std::memory_order_release);
    offload_.join();
  }
}

Status LockModelImpl::execute_deferred(OpDesc* d) {
  return std::visit(
      [this, d](const auto& a) -> Status {
        Status s;
        try {
          s = perform(dev_, a);
        } catch (const std::exception& e) {
          // Arguments were validated before deferring, so this is the provider failing.
          FERRY_LOG_AT(error, log_rank(), dev_.index(), "a deferred operation failed: %s", e.what());
          Completion c = completion_of(a, s);
          c.error = -EIO;
          CompletionObject* local = a.local;
          const bool told_done = d->returned_done;
          delete d;
          if (local != nullptr && !told_done) local->signal(std::move(c));
          return Status::make_done();
        }
        if (s.is_retry()) return s;
        if (s.is_done() && !d->returned_done && a.local != nullptr) a.local->signal(completion_of(a, s));
        if (s.is_failed() && !d->returned_done && a.local != nullptr) {
          // The caller was told `posted`: the failure reaches it through the completion.
          Completion c = completion_of(a, s);
          c.rank = s.rank;
          c.error = peer_failed_error;
          a.local->signal(std::move(c));
        }
        delete d;
        return s;
      },
      d->args);
}

void LockModelImpl::note_batch(std::uint64_t n) noexcept {
  if (n == 0) return;
  combined_.fetch_add(n, std::memory_order_relaxed);
  std::uint64_t seen = max_batch_.load(std::memory_order_relaxed);
  while (n > seen && !max_batch_.compare_exchange_weak(seen, n, std::memory_order_relaxed)) {
  }
}

bool LockModelImpl::combine() {
  bool any = false;
  std::uint64_t batch = 0;
  struct Note {
    LockModelImpl* t;
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
    performed_.fetch_add(1, std::memory_order_relaxed);  // read only to wait for it (Barrier::wait)
    ++batch;
    any = true;
  }
  return any;
}

template <class A>
Status LockModelImpl::defer(const A& args) {
  auto* d = new OpDesc;
  d->returned_done = keep_eager(dev_, *d, d->args.template emplace<A>(args));
  const bool done = d->returned_done;
  queued_.fetch_add(1, std::memory_order_relaxed);  // a statistic for teardown: relaxed
  deferred_.fetch_add(1, std::memory_order_relaxed);
  queue_.push(d);
  return done ? Status::make_done() : Status::make_posted();
}

template <class A>
Status LockModelImpl::post(const A& args) {
  if (inside()) return perform(dev_, args);
  switch (model_) {
    case LockModel::trylock: {
      if (!try_lock_.try_lock()) return Status::make_retry(RetryReason::lock);
      std::lock_guard<SpinLock> g(try_lock_, std::adopt_lock);
      const Inside mark(*this);
      return perform(dev_, args);
    }
    case LockModel::block: {
      std::lock_guard<std::mutex> g(block_);
      const Inside mark(*this);
      return perform(dev_, args);
    }
    case LockModel::lockq: {
      dev_.validate(args);
      if (!try_lock_.try_lock()) return defer(args);
      std::lock_guard<SpinLock> g(try_lock_, std::adopt_lock);
      combine();
      // Older descriptors still waiting go first: this call queues behind them.
      if (stuck_ != nullptr || queued_.load(std::memory_order_relaxed) != 0) return defer(args);
      return perform(dev_, args);
    }
    case LockModel::csync:
      dev_.validate(args);
      return csync(&announced_post<A>, &args).status;
    case LockModel::offload:
      dev_.validate(args);
      return defer(args);
    case LockModel::lockless:
    case LockModel::serialized:
      break;  // never wrapped: the constructor refuses them
  }
  __builtin_unreachable();
}

template Status LockModelImpl::post(const AmArgs&);
template Status LockModelImpl::post(const AmIovecArgs&);
template Status LockModelImpl::post(const SendArgs&);
template Status LockModelImpl::post(const RecvArgs&);
template Status LockModelImpl::post(const PutArgs&);
template Status LockModelImpl::post(const GetArgs&);
template Status LockModelImpl::post(const AtomicArgs&);

bool LockModelImpl::progress() {
  if (inside()) return dev_.progress();
  switch (model_) {
    case LockModel::trylock: {
      if (!try_lock_.try_lock()) return false;
      std::lock_guard<SpinLock> g(try_lock_, std::adopt_lock);
      const Inside mark(*this);
      return dev_.progress();
    }
    case LockModel::block: {
      std::lock_guard<std::mutex> g(block_);
      const Inside mark(*this);
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
    case LockModel::csync:
      return csync(&announced_progress, nullptr).progressed;
    case LockModel::offload:
      // The communication thread progresses; a caller spinning here gives it the core.
      std::this_thread::yield();
      return false;
    case LockModel::lockless:
    case LockModel::serialized:
      break;  // never wrapped: the constructor refuses them
  }
  __builtin_unreachable();
}

bool LockModelImpl::exclusive(bool (*fn)(DeviceImpl&, void*), void* ctx) {
  if (inside()) return fn(dev_, ctx);
  switch (model_) {
    case LockModel::trylock:
    case LockModel::lockq: {
      while (!try_lock_.try_lock()) std::this_thread::yield();  // the holder may be preempted
      std::lock_guard<SpinLock> g(try_lock_, std::adopt_lock);
      if (model_ == LockModel::lockq) return fn(dev_, ctx);
      const Inside mark(*this);
      return fn(dev_, ctx);
    }
    case LockModel::block: {
      std::lock_guard<std::mutex> g(block_);
      const Inside mark(*this);
      return fn(dev_, ctx);
    }
    case LockModel::csync: {
      ExclusiveCall call{fn, ctx};
      return csync(&announced_exclusive, &call).progressed;
    }
    case LockModel::offload: {
      if (!offload_.joinable()) return fn(dev_, ctx);  // stopped: this thread is the only one
      std::lock_guard<std::mutex> g(requests_);
      Request r{.fn = fn, .ctx = ctx, .result = false, .error = nullptr};
      request_.store(&r, std::memory_order_release);
      while (!r.done.load(std::memory_order_acquire)) std::this_thread::yield();
      if (r.error) std::rethrow_exception(r.error);
      return r.result;
    }
    case LockModel::lockless:
    case LockModel::serialized:
      break;  // never wrapped: the constructor refuses them
  }
  __builtin_unreachable();
}

LockModelImpl::Outcome LockModelImpl::csync(void (*call)(DeviceImpl&, CsyncNode&), const void* args) {
  // This thread's spare node for this device.
  CsyncNode* mine = nullptr;
  Spare* slot = nullptr;
  for (auto& s : tls_spares) {
    if (s.generation == generation_) {
      slot = &s;
      mine = s.node;
      break;
    }
  }
  if (mine == nullptr) {
    mine = new CsyncNode;
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
  CsyncNode* cur = tail_.exchange(mine, std::memory_order_acq_rel);
  cur->call = call;
  cur->args = args;
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
    CsyncNode* tmp = cur;
    std::uint64_t served = 0;
    {
      // Cleared before the hand-off below, so the next combiner's mark is never erased.
      const Inside mark(*this);
      for (int n = 0; n < kMaxCombine; ++n, ++served) {
        CsyncNode* next = tmp->next.load(std::memory_order_acquire);
        if (next == nullptr) break;  // tmp is the tail: its request is not announced yet
        try {
          tmp->call(dev_, *tmp);
        } catch (...) {
          tmp->error = std::current_exception();
        }
        tmp->completed.store(true, std::memory_order_release);
        tmp->wait.store(false, std::memory_order_release);
        tmp = next;
      }
    }
    tmp->wait.store(false, std::memory_order_release);  // hands the combiner role on
    if (served > 1) note_batch(served - 1);  // calls of other threads
  }
  if (cur->error) std::rethrow_exception(cur->error);
  return {cur->result, cur->progressed};
}

void LockModelImpl::offload_loop() {
  int idle = 0;
  for (;;) {
    if (Request* r = request_.load(std::memory_order_acquire); r != nullptr) {
      request_.store(nullptr, std::memory_order_relaxed);  // only requests_' holder stores a new one, after `done`
      try {
        r->result = r->fn(dev_, r->ctx);
      } catch (...) {
        r->error = std::current_exception();
      }
      r->done.store(true, std::memory_order_release);
      idle = 0;
    }
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
