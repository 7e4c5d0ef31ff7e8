// calls.cpp — the AMT runtime's messages: an incoming parcel dispatched by kind (the
// parcelport's upcalls), actions registered and run (a call for an action not registered yet
// waits for it), replies matched to the calls waiting for them, every send, and a peer's
// failure, which fails the calls waiting on that peer.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "amt/runtime_impl.hpp"
#include "common/log.hpp"

namespace ferry::amt {

std::vector<parcel::Chunk> Runtime::Impl::allocate_zc_chunks(int, const parcel::Chunk&,
                                                             const std::vector<std::size_t>& sizes) {
  std::vector<parcel::Chunk> out;
  out.reserve(sizes.size());
  for (std::size_t s : sizes) {
    auto* p = static_cast<std::byte*>(std::malloc(s != 0 ? s : 1));
    if (p == nullptr) throw Error("amt: cannot allocate a " + std::to_string(s) + "-byte argument");
    out.push_back({p, s});
  }
  return out;
}

void Runtime::Impl::handle_parcel(int source, parcel::Parcel&& p) {
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

void Runtime::Impl::register_invoker(std::uint64_t id, const std::string& name, detail::Invoker inv) {
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

void Runtime::Impl::run_call(int source, parcel::Parcel& p) {
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

void Runtime::Impl::run_reply(int source, parcel::Parcel& p) {
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

void Runtime::Impl::free_zc(parcel::Parcel& p, const std::vector<bool>& taken) {
  if (!p.zc_storage.empty()) return;  // the parcelport owns them
  for (std::size_t i = 0; i < p.zc.size(); ++i) {
    if (i >= taken.size() || !taken[i]) std::free(p.zc[i].data);
  }
  p.zc.clear();
}

std::uint64_t Runtime::Impl::register_pending(int rank, std::shared_ptr<void> keep,
                                              std::function<void(detail::Reader&)> on_reply,
                                              std::function<void(std::exception_ptr)> on_error) {
  const std::uint64_t token = pending_.add(Pending{rank, std::move(keep), std::move(on_reply), std::move(on_error)});
  // A call to a rank already known failed fails at once (the parcel would go nowhere).
  if (rank >= 0 && rank < size() && failed_[static_cast<std::size_t>(rank)].load(std::memory_order_acquire)) fail_calls(rank);
  return token;
}

void Runtime::Impl::send(int dest, Kind kind, std::uint64_t a, std::uint64_t b, detail::Writer&& w, bool count) {
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

void Runtime::Impl::peer_failed(int r) {
  if (r < 0 || r >= size()) return;
  int none = -1;
  first_failed_.compare_exchange_strong(none, r, std::memory_order_acq_rel);
  // Release: a caller that sees the flag (acquire, register_pending) and fails its own call
  // needs nothing else from here; the pending table's mutex orders the two sweeps.
  failed_[static_cast<std::size_t>(r)].store(true, std::memory_order_release);
  fail_calls(r);
  fail_collectives(r);
}
void Runtime::Impl::send_failed(int destination, int) {
  errors_.fetch_add(1, std::memory_order_relaxed);
  peer_failed(destination);
}
void Runtime::Impl::receive_failed(int source, parcel::Parcel&& p, int) {
  errors_.fetch_add(1, std::memory_order_relaxed);
  free_zc(p, {});
  (void)source;
}
// Every call waiting for a reply from `r` gets ferry::PeerFailed.
void Runtime::Impl::fail_calls(int r) {
  for (Pending& p : pending_.take_rank(r)) {
    if (p.on_error) p.on_error(std::make_exception_ptr(PeerFailed(r, "amt: rank " + std::to_string(r) + " failed before it replied")));
  }
}
// Throws PeerFailed if a rank failed; first, for 1.5 s, keeps helping, so that parcels from
// the failed rank still being received complete (a transport gives up a dead peer's
// operations after 1 s) and their memory goes back through receive_failed before teardown.
void Runtime::Impl::throw_if_failed(const char* call) {
  const int r = first_failed_.load(std::memory_order_acquire);
  if (r < 0) return;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  while (std::chrono::steady_clock::now() < until) {
    if (!help()) std::this_thread::yield();
  }
  throw PeerFailed(r, std::string("amt: ") + call + ": rank " + std::to_string(r) + " failed");
}

}  // namespace ferry::amt
