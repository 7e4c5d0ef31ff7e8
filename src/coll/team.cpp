// team.cpp — Team, ferry/coll.hpp's public face: argument checks, the schedule each post
// builds, team construction (split, subset, host) and the blocking conveniences.
#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "coll/engine.hpp"
#include "common/cpu_relax.hpp"
#include "core/extension.hpp"
#include "ferry/coll.hpp"
#include "ferry/error.hpp"

namespace ferry {

using detail::Schedule;
using detail::TeamImpl;

namespace {

std::string str(long long v) { return std::to_string(v); }

TeamImpl& need(const std::shared_ptr<TeamImpl>& impl, const char* call) {
  if (!impl) throw Error(std::string(call) + ": on an empty Team (a split with a negative colour makes none)");
  return *impl;
}

void check_local(const char* call, CompletionObject* local) {
  if (local == nullptr) throw Error(std::string(call) + ": local=null; a collective signals its end there");
}

void check_root(const char* call, const TeamImpl& t, int root) {
  if (root < 0 || root >= t.size()) {
    throw Error(std::string(call) + ": root=" + str(root) + " is out of range; the team has " + str(t.size()) + " members");
  }
}

void check_buffer(const char* call, const char* name, const void* p, std::size_t size) {
  if (p == nullptr && size != 0) throw Error(std::string(call) + ": " + name + "=null with " + str(static_cast<long long>(size)) + " bytes");
}

// The bytes of `count` elements, checked for overflow.
std::size_t bytes_of(const char* call, std::size_t count, std::size_t elem, std::size_t times = 1) {
  if (elem != 0 && count > (std::size_t{1} << 62) / elem / times) {
    throw Error(std::string(call) + ": count=" + std::to_string(count) + " is too large");
  }
  return count * elem * times;
}

detail::Reduction reduction_of(const char* call, const ReduceArgs& a) {
  detail::Reduction r{a.type, a.op, a.fn, a.fn_arg};
  detail::check_reduction(call, r);
  return r;
}

auto* u8(void* p) { return static_cast<unsigned char*>(p); }
auto* u8(const void* p) { return static_cast<const unsigned char*>(p); }

// Progresses the team's device until `sync` is signalled; throws on a failure.
void wait_for(TeamImpl& t, Status st, Synchronizer& sync, const char* call) {
  if (st.is_failed()) throw PeerFailed(st.rank, std::string(call) + ": rank " + str(st.rank) + " failed");
  if (st.is_done()) return;
  if (detail::progressing_here(t.device())) {
    throw Error(std::string(call) + ": called from inside the team's device's progress (from a Handler's callback, "
                "say); its messages arrive through that progress, which must return first");
  }
  detail::IdleBackoff idle;
  while (!sync.test()) idle(t.device().progress());
  const Completion& c = sync.results().front();
  if (c.error == peer_failed_error) throw PeerFailed(c.rank, std::string(call) + ": rank " + str(c.rank) + " failed");
  if (c.error != 0) throw Error(std::string(call) + ": " + c.error_string());
}

}  // namespace

Team Team::world(Runtime& runtime, int device) {
  if (device < 0 || device >= runtime.device_count()) {
    throw Error("Team::world: device=" + str(device) + " is out of range; the runtime has " + str(runtime.device_count()) +
                " devices");
  }
  return Team(detail::Engine::of(runtime).world(device));
}

int Team::size() const noexcept { return impl_ ? impl_->size() : 0; }
int Team::rank() const noexcept { return impl_ ? impl_->me() : -1; }

int Team::world_rank(int index) const {
  TeamImpl& t = need(impl_, "Team::world_rank");
  if (index < 0 || index >= t.size()) {
    throw Error("Team::world_rank: index=" + str(index) + " is out of range; the team has " + str(t.size()) + " members");
  }
  return t.world_rank(index);
}

int Team::index_of(int world_rank) const noexcept { return impl_ ? impl_->index_of(world_rank) : -1; }

Team Team::split(int color, int key) const {
  TeamImpl& t = need(impl_, "Team::split");
  std::lock_guard<std::mutex> guard(t.make_mutex);
  const int n = t.size();
  std::vector<int> mine{color, key};
  std::vector<int> all(static_cast<std::size_t>(2 * n));
  Synchronizer sync;
  const auto build = [&](Schedule& s) { detail::allgather_schedule(s, n, t.me(), u8(mine.data()), u8(all.data()), sizeof(int) * 2); };
  wait_for(t, t.post(build, 0, &sync, nullptr), sync, "Team::split");
  // Every member computes every colour's id in the same order, so the counters stay equal.
  const std::uint64_t id = t.next_child_id(0x5311, static_cast<std::uint32_t>(color));
  if (color < 0) return Team();
  std::vector<std::tuple<int, int, int>> members;  // (key, index here, job rank)
  for (int i = 0; i < n; ++i) {
    if (all[static_cast<std::size_t>(2 * i)] == color) members.emplace_back(all[static_cast<std::size_t>(2 * i + 1)], i, t.world_rank(i));
  }
  std::sort(members.begin(), members.end());
  std::vector<int> ranks;
  for (const auto& m : members) ranks.push_back(std::get<2>(m));
  return Team(t.engine().add_team(t.device().index(), id, std::move(ranks)));
}

Team Team::subset(const std::vector<int>& indices) const {
  TeamImpl& t = need(impl_, "Team::subset");
  std::vector<int> ranks;
  std::vector<char> seen(static_cast<std::size_t>(t.size()), 0);
  bool in = false;
  std::uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a over the list
  for (int i : indices) {
    if (i < 0 || i >= t.size()) {
      throw Error("Team::subset: index=" + str(i) + " is out of range; the team has " + str(t.size()) + " members");
    }
    if (seen[static_cast<std::size_t>(i)] != 0) throw Error("Team::subset: index=" + str(i) + " is listed twice");
    seen[static_cast<std::size_t>(i)] = 1;
    in = in || i == t.me();
    ranks.push_back(t.world_rank(i));
    h = (h ^ static_cast<std::uint32_t>(i)) * 0x100000001B3ull;
  }
  if (!in) throw Error("Team::subset: this member (index " + str(t.me()) + ") is not in the list; only listed members call it");
  std::lock_guard<std::mutex> guard(t.make_mutex);
  const std::uint64_t id = t.next_child_id(h);
  return Team(t.engine().add_team(t.device().index(), id, std::move(ranks)));
}

Team Team::host() const {
  TeamImpl& t = need(impl_, "Team::host");
  std::lock_guard<std::mutex> guard(t.make_mutex);
  if (!t.host_team) {
    const auto& host_of = detail::host_of(t.engine().runtime());
    const std::uint32_t mine = host_of[static_cast<std::size_t>(t.world_rank(t.me()))];
    std::vector<int> ranks;
    for (int r : t.members()) {
      if (host_of[static_cast<std::size_t>(r)] == mine) ranks.push_back(r);
    }
    const std::uint64_t id = t.next_child_id(0x4057, mine);
    t.host_team = t.engine().add_team(t.device().index(), id, std::move(ranks));
  }
  return Team(t.host_team);
}

Status Team::post_barrier(const CollArgs& a) {
  TeamImpl& t = need(impl_, "post_barrier");
  check_local("post_barrier", a.local);
  return t.post([&](Schedule& s) { detail::barrier_schedule(s, t.size(), t.me()); }, 0, a.local, a.context);
}

Status Team::post_broadcast(const BroadcastArgs& a) {
  TeamImpl& t = need(impl_, "post_broadcast");
  check_local("post_broadcast", a.local);
  check_root("post_broadcast", t, a.root);
  check_buffer("post_broadcast", "buffer", a.buffer, a.size);
  const RuntimeSettings& o = t.engine().runtime().options().settings;
  const bool scatter = o.coll_bcast == BcastAlgorithm::scatter_allgather ||
                       (o.coll_bcast == BcastAlgorithm::automatic && a.size >= o.coll_large && t.size() >= 3);
  return t.post(
      [&](Schedule& s) {
        if (scatter) {
          detail::scatter_allgather_broadcast_schedule(s, t.size(), t.me(), a.root, u8(a.buffer), a.size);
        } else {
          detail::broadcast_schedule(s, t.size(), t.me(), a.root, u8(a.buffer), a.size);
        }
      },
      a.size, a.local, a.context);
}

namespace {

// A reduction's checks: the completion object, the reduction, the sizes and buffers
// (`blocks` of `count` elements in `send`; `recv` holds one block and is checked where
// `recv_here`). Returns the reduction and the bytes of one block.
std::pair<detail::Reduction, std::size_t> check_reduce(const char* call, const ReduceArgs& a, std::size_t blocks = 1,
                                                       bool recv_here = true) {
  check_local(call, a.local);
  const detail::Reduction r = reduction_of(call, a);
  const std::size_t block = bytes_of(call, a.count, size_of(a.type));
  check_buffer(call, "send", a.send, bytes_of(call, a.count, size_of(a.type), blocks));
  if (recv_here) check_buffer(call, "recv", a.recv, block);
  return {r, block};
}

}  // namespace

Status Team::post_reduce(const ReduceArgs& a) {
  TeamImpl& t = need(impl_, "post_reduce");
  check_root("post_reduce", t, a.root);
  const auto checked = check_reduce("post_reduce", a, 1, t.me() == a.root);
  const detail::Reduction r = checked.first;
  const std::size_t bytes = checked.second;
  return t.post([&](Schedule& s) { detail::reduce_schedule(s, t.size(), t.me(), a.root, u8(a.send), u8(a.recv), bytes, r); }, bytes, a.local, a.context);
}

Status Team::post_allreduce(const ReduceArgs& a) {
  TeamImpl& t = need(impl_, "post_allreduce");
  const auto checked = check_reduce("post_allreduce", a);
  const detail::Reduction r = checked.first;
  const std::size_t bytes = checked.second;
  const RuntimeSettings& o = t.engine().runtime().options().settings;
  const bool ring = o.coll_allreduce == AllreduceAlgorithm::ring ||
                    (o.coll_allreduce == AllreduceAlgorithm::automatic && bytes >= o.coll_large);
  return t.post([&](Schedule& s) { detail::allreduce_schedule(s, t.size(), t.me(), u8(a.send), u8(a.recv), bytes, r, ring); },
                bytes, a.local, a.context);
}

Status Team::post_reduce_scatter(const ReduceArgs& a) {
  TeamImpl& t = need(impl_, "post_reduce_scatter");
  const auto checked = check_reduce("post_reduce_scatter", a, static_cast<std::size_t>(t.size()));
  const detail::Reduction r = checked.first;
  const std::size_t block = checked.second;
  return t.post([&](Schedule& s) { detail::reduce_scatter_schedule(s, t.size(), t.me(), u8(a.send), u8(a.recv), block, r); }, block, a.local, a.context);
}

Status Team::post_scan(const ReduceArgs& a) {
  TeamImpl& t = need(impl_, "post_scan");
  const auto checked = check_reduce("post_scan", a);
  const detail::Reduction r = checked.first;
  const std::size_t bytes = checked.second;
  return t.post([&](Schedule& s) { detail::scan_schedule(s, t.size(), t.me(), u8(a.send), u8(a.recv), bytes, r); }, bytes, a.local, a.context);
}

Status Team::post_gather(const GatherArgs& a) {
  TeamImpl& t = need(impl_, "post_gather");
  check_local("post_gather", a.local);
  check_root("post_gather", t, a.root);
  check_buffer("post_gather", "send", a.send, a.size);
  const std::size_t total = bytes_of("post_gather", a.size, 1, static_cast<std::size_t>(t.size()));
  if (t.me() == a.root) check_buffer("post_gather", "recv", a.recv, total);
  return t.post([&](Schedule& s) { detail::gather_schedule(s, t.size(), t.me(), a.root, u8(a.send), u8(a.recv), a.size); }, a.size, a.local, a.context);
}

Status Team::post_allgather(const GatherArgs& a) {
  TeamImpl& t = need(impl_, "post_allgather");
  check_local("post_allgather", a.local);
  check_buffer("post_allgather", "send", a.send, a.size);
  const std::size_t total = bytes_of("post_allgather", a.size, 1, static_cast<std::size_t>(t.size()));
  check_buffer("post_allgather", "recv", a.recv, total);
  const RuntimeSettings& o = t.engine().runtime().options().settings;
  const bool ring = o.coll_allgather == AllgatherAlgorithm::ring ||
                    (o.coll_allgather == AllgatherAlgorithm::automatic && a.size >= o.coll_large);
  return t.post([&](Schedule& s) { detail::allgather_schedule(s, t.size(), t.me(), u8(a.send), u8(a.recv), a.size, ring); },
                a.size, a.local, a.context);
}

namespace {

void check_vector(const char* call, const char* name, const std::vector<std::size_t>& v, int n) {
  if (v.size() != static_cast<std::size_t>(n)) {
    throw Error(std::string(call) + ": " + name + " has " + std::to_string(v.size()) + " entries; the team has " + str(n) +
                " members");
  }
}

}  // namespace

Status Team::post_allgatherv(const AllgathervArgs& a) {
  TeamImpl& t = need(impl_, "post_allgatherv");
  check_local("post_allgatherv", a.local);
  check_vector("post_allgatherv", "counts", a.counts, t.size());
  check_vector("post_allgatherv", "offsets", a.offsets, t.size());
  check_buffer("post_allgatherv", "send", a.send, a.counts[static_cast<std::size_t>(t.me())]);
  std::size_t total = 0;
  for (std::size_t c : a.counts) total += c;
  check_buffer("post_allgatherv", "recv", a.recv, total);
  return t.post([&](Schedule& s) { detail::allgatherv_schedule(s, t.size(), t.me(), u8(a.send), u8(a.recv), a.counts, a.offsets); },
                a.counts[static_cast<std::size_t>(t.me())], a.local, a.context);
}

Status Team::post_alltoall(const AlltoallArgs& a) {
  TeamImpl& t = need(impl_, "post_alltoall");
  check_local("post_alltoall", a.local);
  const auto n = static_cast<std::size_t>(t.size());
  const std::size_t total = bytes_of("post_alltoall", a.size, 1, n);
  check_buffer("post_alltoall", "send", a.send, total);
  check_buffer("post_alltoall", "recv", a.recv, total);
  if (a.send == a.recv && total != 0) throw Error("post_alltoall: send and recv are one buffer; alltoall is not in place");
  std::vector<std::size_t> counts(n, a.size), offsets(n);
  for (std::size_t i = 0; i < n; ++i) offsets[i] = i * a.size;
  return t.post([&](Schedule& s) { detail::alltoallv_schedule(s, t.size(), t.me(), u8(a.send), counts, offsets, u8(a.recv), counts, offsets); }, a.size,
                a.local, a.context);
}

Status Team::post_alltoallv(const AlltoallvArgs& a) {
  TeamImpl& t = need(impl_, "post_alltoallv");
  check_local("post_alltoallv", a.local);
  check_vector("post_alltoallv", "send_counts", a.send_counts, t.size());
  check_vector("post_alltoallv", "send_offsets", a.send_offsets, t.size());
  check_vector("post_alltoallv", "recv_counts", a.recv_counts, t.size());
  check_vector("post_alltoallv", "recv_offsets", a.recv_offsets, t.size());
  std::size_t sent = 0, received = 0;
  for (std::size_t c : a.send_counts) sent += c;
  for (std::size_t c : a.recv_counts) received += c;
  check_buffer("post_alltoallv", "send", a.send, sent);
  check_buffer("post_alltoallv", "recv", a.recv, received);
  return t.post([&](Schedule& s) { detail::alltoallv_schedule(s, t.size(), t.me(), u8(a.send), a.send_counts, a.send_offsets, u8(a.recv), a.recv_counts,
                                           a.recv_offsets); },
                sent, a.local, a.context);
}

void Team::barrier() {
  TeamImpl& t = need(impl_, "Team::barrier");
  Synchronizer sync;
  wait_for(t, post_barrier({.local = &sync}), sync, "Team::barrier");
}

void Team::allreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op) {
  TeamImpl& t = need(impl_, "Team::allreduce");
  Synchronizer sync;
  wait_for(t, post_allreduce({.send = send, .recv = recv, .count = count, .type = type, .op = op, .local = &sync}), sync,
           "Team::allreduce");
}

}  // namespace ferry
