// monitor_ring.cpp — the monitoring ring (monitor_ring.hpp): the layout, guardians, wards and
// links, and one rank's monitor.
#include "core/monitor_ring.hpp"

#include <algorithm>
#include <cerrno>
#include <unordered_map>
#include <utility>

namespace ferry::detail {

RingLayout::RingLayout(const std::vector<int>& host) : rank_at_(host.size()), position_(host.size()), host_(host) {
  // Hosts in the order of their lowest rank; each rank's index among its host's ranks.
  std::unordered_map<int, int> order;
  std::vector<int> count;
  std::vector<std::pair<int, int>> key(host.size());  // (index on its host, host's order)
  for (std::size_t r = 0; r < host.size(); ++r) {
    const auto [at, fresh] = order.emplace(host[r], static_cast<int>(count.size()));
    if (fresh) count.push_back(0);
    key[r] = {count[static_cast<std::size_t>(at->second)]++, at->second};
  }
  one_host_ = count.size() <= 1;
  for (std::size_t r = 0; r < host.size(); ++r) rank_at_[r] = static_cast<int>(r);
  std::sort(rank_at_.begin(), rank_at_.end(), [&](int a, int b) {
    return key[static_cast<std::size_t>(a)] < key[static_cast<std::size_t>(b)];
  });
  for (std::size_t p = 0; p < rank_at_.size(); ++p) position_[static_cast<std::size_t>(rank_at_[p])] = static_cast<int>(p);
}

std::vector<int> host_indices(const std::vector<std::string>& names) {
  std::unordered_map<std::string, int> index;
  std::vector<int> out(names.size());
  for (std::size_t r = 0; r < names.size(); ++r) {
    out[r] = index.emplace(names[r], static_cast<int>(index.size())).first->second;
  }
  return out;
}

namespace {

// The rank `step` positions from `rank` on the ring (step may be negative).
int step_from(const RingLayout& ring, int rank, long step) {
  const long n = ring.size();
  long p = (ring.position_of(rank) + step) % n;
  if (p < 0) p += n;
  return ring.rank_at(static_cast<int>(p));
}

// Calls visit(s) for each rank on another host than `rank`, side `dir`, nearest first, gone or
// not, while it returns true and for at most kReach of them.
template <class Visit>
void near_others(const RingLayout& ring, int rank, int dir, Visit visit) {
  const int h = ring.host_of(rank);
  int seen = 0;
  for (long step = 1; step < ring.size() && seen < kReach; ++step) {
    const int s = step_from(ring, rank, dir * step);
    if (ring.host_of(s) == h) continue;
    ++seen;
    if (!visit(s)) return;
  }
}

// Calls visit(s) for each rank s on side `dir` of `rank` that may have `rank` among its first
// kReach ranks on other hosts on side -dir. Of the m ranks passed, at most `most` are on any
// one host: once m - most >= kReach, every later rank has kReach ranks of other hosts than its
// own between it and `rank`, so none can.
template <class Visit>
void maybe_guarded(const RingLayout& ring, int rank, int dir, Visit visit) {
  std::vector<std::pair<int, int>> hosts;  // (host, ranks passed on it)
  int most = 0;
  for (long step = 1; step < ring.size() && step - 1 - most < kReach; ++step) {
    const int s = step_from(ring, rank, dir * step);
    visit(s);
    const int h = ring.host_of(s);
    auto at = std::find_if(hosts.begin(), hosts.end(), [h](const auto& e) { return e.first == h; });
    if (at == hosts.end()) {
      hosts.emplace_back(h, 0);
      at = hosts.end() - 1;
    }
    most = std::max(most, ++at->second);
  }
}

}  // namespace

int guardian(const RingLayout& ring, int rank, int dir, const GoneFn& gone) {
  int found = -1;
  near_others(ring, rank, dir, [&](int s) {
    if (gone(s)) return true;
    found = s;
    return false;
  });
  return found;
}

void wards(const RingLayout& ring, int rank, const GoneFn& gone, std::vector<int>& out) {
  const std::size_t first = out.size();
  for (const int dir : {+1, -1}) {
    maybe_guarded(ring, rank, dir, [&](int s) {
      if (s == rank || ring.host_of(s) == ring.host_of(rank) || gone(s)) return;
      if (guardian(ring, s, -dir, gone) == rank) out.push_back(s);
    });
  }
  std::sort(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
  out.erase(std::unique(out.begin() + static_cast<std::ptrdiff_t>(first), out.end()), out.end());
}

std::vector<int> links(const RingLayout& ring, int rank) {
  std::vector<int> out;
  if (ring.one_host()) return out;
  for (const int dir : {+1, -1}) {
    near_others(ring, rank, dir, [&](int s) {
      out.push_back(s);
      return true;
    });
    maybe_guarded(ring, rank, dir, [&](int s) {
      if (s == rank) return;
      near_others(ring, s, -dir, [&](int t) {
        if (t != rank) return true;
        out.push_back(s);
        return false;
      });
    });
  }
  for (long d = 1; d < ring.size(); d *= 2) {
    out.push_back(step_from(ring, rank, d));
    out.push_back(step_from(ring, rank, -d));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  out.erase(std::remove(out.begin(), out.end(), rank), out.end());
  return out;
}

RingMonitor::RingMonitor(std::shared_ptr<const RingLayout> ring, int rank, int timeout_ms, int check_ms)
    : ring_(std::move(ring)),
      rank_(rank),
      beat_every_ns_(std::int64_t{std::max(1, timeout_ms / 4)} * 1000000),
      links_(detail::links(*ring_, rank)) {
  silence_.start(links_, timeout_ms, check_ms);
  silence_.watch({});
}

void RingMonitor::spread(int subject) { owed_.push_back(Owed{subject, 0}); }

void RingMonitor::note_error(int rc, int peer) noexcept {
  if (send_error_ != 0) return;
  send_error_ = rc;
  send_error_peer_ = peer;
}

void RingMonitor::tick(std::int64_t now_ns, std::int64_t elapsed_ns, std::uint64_t gone_version, const GoneFn& gone,
                       Outbox& out, std::vector<int>& silent) {
  if (gone_version != version_) {
    version_ = gone_version;
    for (int side = 0; side < 2; ++side) {
      const int g = guardian(*ring_, rank_, side == 0 ? -1 : +1, gone);
      if (g != guardians_[side].rank) guardians_[side] = Guardian{g, now_ns};  // a new one hears at once
    }
    wards_.clear();
    detail::wards(*ring_, rank_, gone, wards_);
    silence_.watch(wards_);
  }
  for (int side = 0; side < 2; ++side) {
    Guardian& g = guardians_[side];
    if (g.rank < 0 || now_ns < g.due_ns) continue;
    if (side == 1 && g.rank == guardians_[0].rank) continue;  // one guardian both sides: one beat
    const int rc = out.send(g.rank, Beat::alive, 0);
    if (rc == -EAGAIN) continue;  // due again at the next tick
    g.due_ns = now_ns + beat_every_ns_;
    if (rc == 0) {
      ++beats_sent_;
    } else {
      note_error(rc, g.rank);
    }
  }
  flush(gone, out);
  silence_.check(elapsed_ns, silent);
}

void RingMonitor::flush(const GoneFn& gone, Outbox& out) {
  std::size_t done = 0;
  for (Owed& o : owed_) {
    for (; o.next < links_.size(); ++o.next) {
      const int to = links_[o.next];
      if (to == o.subject || gone(to)) continue;
      const int rc = out.send(to, Beat::failed, o.subject);
      if (rc == -EAGAIN) break;
      if (rc == 0) {
        ++notices_sent_;
      } else {
        note_error(rc, to);
      }
    }
    if (o.next < links_.size()) break;  // refused for now: the rest keep their order
    ++done;
  }
  owed_.erase(owed_.begin(), owed_.begin() + static_cast<std::ptrdiff_t>(done));
}

void RingMonitor::depart(const GoneFn& gone, Outbox& out) {
  for (int to : links_) {
    if (!gone(to)) (void)out.send(to, Beat::departing, 0);
  }
}

}  // namespace ferry::detail
