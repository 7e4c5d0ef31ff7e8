// collectives.cpp — the AMT runtime's collectives and remote counters, over any parcelport.
//
// A collective travels on a binomial tree of ranks rooted at rank 0 (a broadcast: at its root;
// tree positions count from the root). A gather sends each subtree's parts up, one parcel per
// tree edge, once a rank has called the collective and heard from all its children; the root
// then sends the whole result down the same edges. Every rank forwards what comes down at once,
// whether or not it has called the collective yet, so a slow rank delays only its own future.
// Parcels name their collective by its number: each rank numbers its calls in order, and
// collectives are called in the same order everywhere.
//
// Counters are ordinary calls to the owner, which performs them with one CPU atomic on its
// counter and replies with the value before.
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "amt/runtime_impl.hpp"
#include "common/log.hpp"

namespace ferry::amt {

namespace {

// Tree positions: v is a rank's distance from the root, modulo n.
int position(int rank, int root, int n) { return (rank - root + n) % n; }
int rank_at(int v, int root, int n) { return (v + root) % n; }
// The parent's position (-1 for the root) and the children's.
int parent_of(int v) {
  if (v == 0) return -1;
  return v & (v - 1);  // v without its lowest set bit
}
std::vector<int> children_of(int v, int n) {
  std::vector<int> out;
  for (int m = 1; m < n; m <<= 1) {
    if ((v & m) != 0) break;
    if (v + m < n) out.push_back(v + m);
  }
  return out;
}

}  // namespace

void Runtime::Impl::start_collective(int kind, int root, std::vector<std::byte> mine,
                                     std::function<void(std::vector<std::vector<std::byte>>&&)> done,
                                     std::function<void(std::exception_ptr)> failed, std::size_t part_size) {
  if (root < 0 || root >= size()) {
    throw Error("broadcast: root=" + std::to_string(root) + " is out of range; the job has " + std::to_string(size()) + " ranks");
  }
  std::vector<std::function<void()>> then;
  {
    std::lock_guard<std::mutex> g(coll_mutex_);
    const std::uint64_t seq = next_coll_++;
    if (const int f = first_failed_.load(std::memory_order_acquire); f >= 0) {
      colls_.erase(seq);
      then.push_back([failed, f] {
        failed(std::make_exception_ptr(PeerFailed(f, "amt: rank " + std::to_string(f) + " failed: no collective can complete")));
      });
    } else {
      Collective& c = colls_[seq];
      if (c.kind >= 0 && (c.kind != kind || c.root != root)) {
        // A peer's parcel for this number named another collective: the ranks disagree on the order.
        colls_.erase(seq);
        then.push_back([failed, seq] {
          failed(std::make_exception_ptr(Error("amt: collective " + std::to_string(seq) +
                                               ": the ranks called different collectives in this place")));
        });
      } else {
        c.kind = kind, c.root = root, c.part_size = part_size, c.started = true;
        c.done = std::move(done), c.failed = std::move(failed);
        if (kind == 0) {
          c.parts.resize(static_cast<std::size_t>(size()));
          c.have.resize(static_cast<std::size_t>(size()), false);
          c.parts[static_cast<std::size_t>(rank())] = std::move(mine);
          c.have[static_cast<std::size_t>(rank())] = true;
        } else if (rank() == root) {
          c.result.push_back(std::move(mine));
          c.down_arrived = true;
          // The root sends down at once.
          const auto result = c.result;
          for (const int v : children_of(0, size())) {
            const int child = rank_at(v, root, size());
            then.push_back([this, child, seq, kind, root, result] {
              send_coll(child, coll_down_action(), seq, kind, root, result, nullptr);
            });
          }
        }
        advance(seq, c, then);
      }
    }
  }
  for (auto& f : then) f();
}

// Under coll_mutex_.
void Runtime::Impl::advance(std::uint64_t seq, Collective& c, std::vector<std::function<void()>>& then) {
  if (!c.started) return;
  const int n = size();
  if (c.kind == 0 && !c.sent_up) {
    const int v = position(rank(), 0, n);
    if (c.ups < static_cast<int>(children_of(v, n).size())) return;
    c.sent_up = true;
    if (v == 0) {
      c.result = std::move(c.parts);
      c.down_arrived = true;
      const auto result = c.result;
      for (const int w : children_of(0, n)) {
        const int child = rank_at(w, 0, n);
        then.push_back([this, child, seq, result] {
          send_coll(child, coll_down_action(), seq, 0, 0, result, nullptr);
        });
      }
    } else {
      const int parent = rank_at(parent_of(v), 0, n);
      auto parts = std::move(c.parts);
      auto have = std::move(c.have);
      then.push_back([this, parent, seq, parts = std::move(parts), have = std::move(have)] {
        send_coll(parent, coll_up_action(), seq, 0, 0, parts, &have);
      });
    }
  }
  if (!c.down_arrived) return;
  // The end: check the parts' sizes, hand them over, forget the collective.
  auto done = std::move(c.done);
  auto failed = std::move(c.failed);
  auto result = std::move(c.result);
  const std::size_t part_size = c.part_size;
  const std::size_t want = c.kind == 0 ? static_cast<std::size_t>(n) : 1;
  colls_.erase(seq);
  then.push_back([done = std::move(done), failed = std::move(failed), result = std::move(result), part_size, want, seq]() mutable {
    bool ok = result.size() == want;
    for (const auto& p : result) ok = ok && p.size() == part_size;
    if (!ok) {
      failed(std::make_exception_ptr(Error("amt: collective " + std::to_string(seq) +
                                           ": the ranks' values differ in size (do all ranks pass the same type?)")));
      return;
    }
    done(std::move(result));
  });
}

// A parcel of collective `seq`: its kind and root, then the parts it carries ([rank][bytes]).
void Runtime::Impl::send_coll(int dest, std::uint64_t action, std::uint64_t seq, int kind, int root,
                              const std::vector<std::vector<std::byte>>& parts, const std::vector<bool>* which) {
  detail::Writer w;
  w.zc_threshold = options_.zc_threshold;
  w.pod(seq);
  w.pod(static_cast<std::uint8_t>(kind));
  w.pod(static_cast<std::int32_t>(root));
  std::uint32_t count = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) count += which == nullptr || (*which)[i] ? 1u : 0u;
  w.pod(count);
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (which != nullptr && !(*which)[i]) continue;
    w.pod(static_cast<std::int32_t>(which == nullptr && kind == 1 ? root : static_cast<int>(i)));
    w.arg(parts[i]);
  }
  try {
    send(dest, Kind::call, action, 0, std::move(w), true);
  } catch (const std::exception& e) {
    FERRY_LOG_AT(error, rank(), -1, "amt: collective %llu: cannot send to rank %d: %s", static_cast<unsigned long long>(seq), dest,
                 e.what());
    errors_.fetch_add(1, std::memory_order_relaxed);
  }
}

namespace {

struct CollParcel {
  std::uint64_t seq;
  int kind, root;
  std::vector<std::pair<int, std::vector<std::byte>>> parts;
};

// Reads a collective's parcel, checking what it names against the job; null and the reason.
const char* read_coll(detail::Reader& r, int n, CollParcel& out) {
  out.seq = r.pod<std::uint64_t>();
  out.kind = r.pod<std::uint8_t>();
  out.root = r.pod<std::int32_t>();
  const auto count = r.pod<std::uint32_t>();
  if (out.kind > 1) return "an unknown kind";
  if (out.root < 0 || out.root >= n || (out.kind == 0 && out.root != 0)) return "a root outside the job";
  if (count > static_cast<std::uint32_t>(n)) return "more parts than ranks";
  for (std::uint32_t i = 0; i < count; ++i) {
    const int rank = r.pod<std::int32_t>();
    if (rank < 0 || rank >= n) return "a part of a rank outside the job";
    out.parts.emplace_back(rank, r.arg<std::vector<std::byte>>());
  }
  return nullptr;
}

}  // namespace

void Runtime::Impl::on_coll_up(int source, detail::Reader& r) {
  CollParcel m;
  const char* why = read_coll(r, size(), m);
  const int n = size();
  const int v = position(rank(), 0, n);
  if (why == nullptr && (m.kind != 0 || position(source, 0, n) <= v || parent_of(position(source, 0, n)) != v)) {
    why = "parts from a rank that is not a child of this one";
  }
  std::vector<std::function<void()>> then;
  {
    std::lock_guard<std::mutex> g(coll_mutex_);
    if (why == nullptr) {
      Collective& c = colls_[m.seq];
      if (c.kind < 0) {
        c.kind = 0;
        c.parts.resize(static_cast<std::size_t>(n));
        c.have.resize(static_cast<std::size_t>(n), false);
      }
      if (c.kind != 0 || c.sent_up) {
        why = "parts for a collective that takes none now";
      } else {
        for (auto& [rank, bytes] : m.parts) {
          if (c.have[static_cast<std::size_t>(rank)]) continue;  // a second copy: dropped
          c.have[static_cast<std::size_t>(rank)] = true;
          c.parts[static_cast<std::size_t>(rank)] = std::move(bytes);
        }
        ++c.ups;
        advance(m.seq, c, then);
      }
    }
  }
  if (why != nullptr) {
    FERRY_LOG_AT(warn, rank(), -1, "amt: dropped a collective's parcel from rank %d: %s", source, why);
    errors_.fetch_add(1, std::memory_order_relaxed);
  }
  for (auto& f : then) f();
}

void Runtime::Impl::on_coll_down(int source, detail::Reader& r) {
  CollParcel m;
  const char* why = read_coll(r, size(), m);
  const int n = size();
  if (why == nullptr) {
    const int v = position(rank(), m.root, n);
    if (v == 0 || rank_at(parent_of(v), m.root, n) != source) why = "a result from a rank that is not this one's parent";
    else if (m.parts.size() != (m.kind == 0 ? static_cast<std::size_t>(n) : 1u)) why = "a result with the wrong number of parts";
  }
  std::vector<std::function<void()>> then;
  {
    std::lock_guard<std::mutex> g(coll_mutex_);
    if (why == nullptr) {
      Collective& c = colls_[m.seq];
      if (c.kind < 0) c.kind = m.kind, c.root = m.root;
      if (c.kind != m.kind || c.root != m.root || c.down_arrived) {
        why = "a result for a collective that takes none now";
      } else {
        std::vector<std::vector<std::byte>> result(m.kind == 0 ? static_cast<std::size_t>(n) : 1u);
        std::vector<bool> seen(result.size(), false);
        for (auto& [rank, bytes] : m.parts) {
          const std::size_t at = m.kind == 0 ? static_cast<std::size_t>(rank) : 0;
          if (seen[at]) why = "a result that names a rank twice";
          seen[at] = true;
          result[at] = std::move(bytes);
        }
        if (why == nullptr) {
          c.down_arrived = true;
          c.result = result;
          // Forwarded at once: the subtree below waits for this rank's parent, not for its call.
          for (const int w : children_of(position(rank(), m.root, n), n)) {
            const int child = rank_at(w, m.root, n);
            then.push_back([this, child, seq = m.seq, kind = m.kind, root = m.root, result] {
              send_coll(child, coll_down_action(), seq, kind, root, result, nullptr);
            });
          }
          advance(m.seq, c, then);
        }
      }
    }
  }
  if (why != nullptr) {
    FERRY_LOG_AT(warn, rank(), -1, "amt: dropped a collective's parcel from rank %d: %s", source, why);
    errors_.fetch_add(1, std::memory_order_relaxed);
  }
  for (auto& f : then) f();
}

// Every collective this rank called and that has not ended gets ferry::PeerFailed: each one
// needs every rank.
void Runtime::Impl::fail_collectives(int r) {
  std::vector<std::function<void(std::exception_ptr)>> failed;
  {
    std::lock_guard<std::mutex> g(coll_mutex_);
    for (auto it = colls_.begin(); it != colls_.end();) {
      if (it->second.started && it->second.failed) {
        failed.push_back(std::move(it->second.failed));
        it = colls_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& f : failed) {
    f(std::make_exception_ptr(PeerFailed(r, "amt: rank " + std::to_string(r) + " failed during a collective")));
  }
}

// ---- counters ------------------------------------------------------------------------------

Counter Runtime::Impl::counter(std::int64_t initial) {
  std::uint32_t id;
  {
    std::lock_guard<std::mutex> g(counters_mutex_);
    counters_.emplace_back(initial);
    id = static_cast<std::uint32_t>(counters_.size());
  }
  self_.barrier().get();  // every rank has it before any uses it
  return Counter{id};
}

std::int64_t Runtime::Impl::counter_value(Counter c) {
  std::lock_guard<std::mutex> g(counters_mutex_);
  if (c.id == 0 || c.id > counters_.size()) throw Error("value: counter " + std::to_string(c.id) + " was not made here");
  return counters_[c.id - 1].load(std::memory_order_seq_cst);
}

namespace {

// op 0: fetch_add(a); 1: compare_swap(expected a, desired b). Returns the value before.
std::int64_t perform(std::atomic<std::int64_t>& v, std::uint8_t op, std::int64_t a, std::int64_t b) {
  if (op == 0) return v.fetch_add(a, std::memory_order_seq_cst);
  std::int64_t expected = a;
  v.compare_exchange_strong(expected, b, std::memory_order_seq_cst);
  return expected;
}

}  // namespace

Future<std::int64_t> Runtime::Impl::counter_op(int rank, Counter c, std::uint8_t op, std::int64_t a, std::int64_t b) {
  const char* call = op == 0 ? "fetch_add" : "compare_swap";
  if (rank < 0 || rank >= size()) {
    throw Error(std::string(call) + ": rank=" + std::to_string(rank) + " is out of range; the job has " + std::to_string(size()) +
                " ranks");
  }
  std::atomic<std::int64_t>* mine = nullptr;
  {
    std::lock_guard<std::mutex> g(counters_mutex_);
    if (c.id == 0 || c.id > counters_.size()) throw Error(std::string(call) + ": counter " + std::to_string(c.id) + " was not made here");
    mine = &counters_[c.id - 1];
  }
  auto state = std::make_shared<Future<std::int64_t>::State>();
  Future<std::int64_t> f(&self_, state);
  if (rank == this->rank()) {
    state->value = perform(*mine, op, a, b);
    state->set_ready();
    return f;
  }
  const std::uint64_t token = register_pending(
      rank, state,
      [state, rank](detail::Reader& r) {
        try {
          if (r.pod<std::uint8_t>() == 0) throw Error("rank " + std::to_string(rank) + " refused: " + r.arg<std::string>());
          state->value = r.pod<std::int64_t>();
        } catch (const std::exception& e) {
          state->error = std::make_exception_ptr(Error(std::string("amt: counter: ") + e.what()));
        }
        state->set_ready();
      },
      [state](std::exception_ptr e) {
        state->error = std::move(e);
        state->set_ready();
      });
  detail::Writer m;
  m.pod(c.id);
  m.pod(op);
  m.pod(a);
  m.pod(b);
  send(rank, Kind::call, counter_action(), token, std::move(m), true);
  return f;
}

// The owner's side: the request's counter and operation are checked before use.
void Runtime::Impl::on_counter_request(int source, detail::Reader& r, std::uint64_t reply_to) {
  const auto id = r.pod<std::uint32_t>();
  const auto op = r.pod<std::uint8_t>();
  const auto a = r.pod<std::int64_t>();
  const auto b = r.pod<std::int64_t>();
  std::atomic<std::int64_t>* v = nullptr;
  {
    std::lock_guard<std::mutex> g(counters_mutex_);
    if (id != 0 && id <= counters_.size()) v = &counters_[id - 1];
  }
  detail::Writer w;
  if (v == nullptr || op > 1) {
    const std::string why = v == nullptr ? "counter " + std::to_string(id) + " was not made here" : "an unknown operation";
    FERRY_LOG_AT(warn, rank(), -1, "amt: refused a counter request from rank %d: %s", source, why.c_str());
    w.pod<std::uint8_t>(0);
    w.arg(why);
  } else {
    const std::int64_t before = perform(*v, op, a, b);
    w.pod<std::uint8_t>(1);
    w.pod(before);
  }
  if (reply_to != 0) self_.send_reply(source, reply_to, std::move(w));
}

std::uint64_t Runtime::Impl::coll_up_action() noexcept {
  static const std::uint64_t id = detail::hash_name("ferry.amt.coll_up");
  return id;
}
std::uint64_t Runtime::Impl::coll_down_action() noexcept {
  static const std::uint64_t id = detail::hash_name("ferry.amt.coll_down");
  return id;
}
std::uint64_t Runtime::Impl::counter_action() noexcept {
  static const std::uint64_t id = detail::hash_name("ferry.amt.counter");
  return id;
}

}  // namespace ferry::amt
