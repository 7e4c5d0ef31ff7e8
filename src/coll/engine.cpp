// engine.cpp — the execution of collectives (TeamImpl's rounds) and the Engine's messages:
// what arrives, the sends and their completions, retries and failures.
#include "coll/engine.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <string>
#include <utility>

#include "common/log.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {

namespace {

// Beyond this many messages for teams this rank has not made, further ones are dropped (a
// peer that runs that far ahead of this rank's team construction is not waited for).
constexpr std::size_t kMaxOrphans = 1 << 16;

// Devices other than 0 reach the runtime's one engine through this.
class EngineLink final : public DeviceExtension {
 public:
  explicit EngineLink(Engine& engine) noexcept : engine_(engine) {}
  void slow_path() noexcept override { engine_.slow_path(); }

 private:
  Engine& engine_;
};

}  // namespace

// ---- TeamImpl ---------------------------------------------------------------------------

TeamImpl::TeamImpl(Engine& engine, Device& device, std::uint64_t id, std::vector<int> members, int world_size)
    : engine_(engine), device_(device), id_(id), members_(std::move(members)) {
  const int self = engine.runtime().rank();
  // A vector by job rank when the team is at least an eighth of the job: O(1) lookups for the
  // world and large teams, memory proportional to the team for small ones.
  if (members_.size() * 8 >= static_cast<std::size_t>(world_size)) {
    index_by_rank_.assign(static_cast<std::size_t>(world_size), -1);
    for (std::size_t i = 0; i < members_.size(); ++i) index_by_rank_[static_cast<std::size_t>(members_[i])] = static_cast<int>(i);
  } else {
    for (std::size_t i = 0; i < members_.size(); ++i) index_sorted_.emplace_back(members_[i], static_cast<int>(i));
    std::sort(index_sorted_.begin(), index_sorted_.end());
  }
  me_ = index_of(self);
}

int TeamImpl::index_of(int world_rank) const noexcept {
  if (!index_by_rank_.empty()) {
    return world_rank >= 0 && static_cast<std::size_t>(world_rank) < index_by_rank_.size()
               ? index_by_rank_[static_cast<std::size_t>(world_rank)]
               : -1;
  }
  const auto it = std::lower_bound(index_sorted_.begin(), index_sorted_.end(), std::make_pair(world_rank, -1));
  return it != index_sorted_.end() && it->first == world_rank ? it->second : -1;
}

// One load while the job has no failure; the members are looked at once per change of the
// runtime's failure count (a team of the whole job has as many members as the job).
int TeamImpl::failed_member() noexcept {
  const std::uint32_t count = engine_.runtime().failure_count();
  if (count == 0) return -1;
  if (count != failures_checked_) {
    failed_ = -1;
    for (int r : members_) {
      if (engine_.peer_failed(r)) {
        failed_ = r;
        break;
      }
    }
    failures_checked_ = count;
  }
  return failed_;
}

namespace {

std::uint64_t mix(std::uint64_t z) noexcept {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

std::uint64_t TeamImpl::next_child_id(std::uint64_t salt, std::uint64_t extra) {
  const std::uint64_t n = child_count_[salt]++;
  const std::uint64_t z = mix(mix(mix(id_ ^ salt) + n) ^ extra);
  return z < 2 ? z + 2 : z;  // 1 is the world's
}

Op* TeamImpl::take_op() {
  if (free_ops_.empty()) {
    ops_.push_back(std::make_unique<Op>());
    free_ops_.push_back(ops_.back().get());
  }
  Op* op = free_ops_.back();
  free_ops_.pop_back();
  return op;
}

void TeamImpl::release(Op& op) noexcept {
  if (--op.refs != 0) return;
  op.got.clear();  // the messages' Buffers go back to the device now
  op.early.clear();
  free_ops_.push_back(&op);  // capacity reserved by take_op's growth: ops_ only grows with it
}

void TeamImpl::start(Op& op, std::size_t bytes, CompletionObject* local, void* context, Outbox& out) {
  op.team = this;
  op.seq = next_seq_++;
  op.round = 0;
  op.round_started = false;
  op.sends_left = op.missing = 0;
  op.local = local;
  op.context = context;
  op.bytes = bytes;
  op.in_post = true;
  op.finished = false;
  op.error = 0;
  op.error_rank = -1;
  op.refs = 1;
  op.send_count = op.round_sends = op.get_count = 0;
  active_.emplace_back(op.seq, &op);
  for (std::size_t i = 0; i < unexpected_.size();) {
    if (unexpected_[i].first == op.seq) {
      op.early.push_back(std::move(unexpected_[i].second));
      unexpected_.erase(unexpected_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  advance(op, out);
}

Status TeamImpl::posted(Op& op, Outbox& out) {
  engine_.run(out);
  std::lock_guard<std::mutex> guard(mutex_);
  op.in_post = false;
  Status st = Status::make_posted();
  if (op.finished) st = op.error == 0 ? Status::make_done() : Status::make_failed(op.error_rank);
  if (op.finished) release(op);  // finish() left the in-flight reference to this thread
  return st;
}

void TeamImpl::advance(Op& op, Outbox& out) {
  const std::size_t elem = std::max<std::size_t>(1, size_of(op.schedule.reduction().type));
  while (!op.finished) {
    if (op.round == op.schedule.size()) {
      finish(op, 0, -1, out);
      return;
    }
    Round& r = op.schedule[op.round];
    if (!op.round_started) {
      op.round_started = true;
      for (const LocalStep& l : r.locals) {
        if (l.reduce) {
          reduce_into(l.dst, l.src, l.size / elem, op.schedule.reduction());
        } else {
          std::memmove(l.dst, l.src, l.size);
        }
      }
      op.sends_left = r.sends.size();
      op.round_sends = op.send_count;
      for (const SendStep& s : r.sends) {
        if (op.send_count == op.sends.size()) op.sends.emplace_back();
        SendRec& rec = op.sends[op.send_count++];
        // A registration an earlier use left (its fin never came: a failure) goes first.
        if (rec.region) out.drop.push_back(std::move(rec.region));
        rec.op = &op;
        rec.rank = members_[static_cast<std::size_t>(s.peer)];
        rec.data = s.data;
        if (sizeof(CollHeader) + s.size <= device_.eager_limit()) {
          // The data as it is now (the round's start): a receive of this round changes it later.
          rec.header = CollHeader{kCollMagic, s.step, static_cast<std::uint16_t>(CollKind::data), id_, op.seq, s.size};
          rec.awaiting_fin = false;
          rec.bytes.resize(sizeof(CollHeader) + s.size);
          std::memcpy(rec.bytes.data(), &rec.header, sizeof(CollHeader));
          if (s.size != 0) std::memcpy(rec.bytes.data() + sizeof(CollHeader), s.data, s.size);
        } else {
          // Zero-copy: the receiver reads the data where it is (post_send registers it and
          // adds the key); the round waits for its fin before the data may change.
          rec.header = CollHeader{kCollMagic, s.step, static_cast<std::uint16_t>(CollKind::rts), id_, op.seq, s.size};
          rec.awaiting_fin = true;
          rec.bytes.resize(sizeof(CollHeader) + sizeof(RemoteKey));
          std::memcpy(rec.bytes.data(), &rec.header, sizeof(CollHeader));
        }
        ++op.refs;
        out.sends.push_back(&rec);
      }
      if (op.landing.size() < r.recvs.size()) op.landing.resize(r.recvs.size());
      op.got.clear();
      op.got.resize(r.recvs.size());
      op.missing = r.recvs.size();
      if (!op.early.empty()) {
        std::vector<Message> early = std::move(op.early);
        op.early.clear();
        for (Message& m : early) {
          accept(op, std::move(m), out);
          if (op.finished) return;
        }
      }
    }
    if (op.sends_left != 0 || op.missing != 0) return;
    for (std::size_t i = 0; i < r.recvs.size(); ++i) {
      const RecvStep& rs = r.recvs[i];
      const Message& m = op.got[i];
      if (rs.reduce) {
        reduce_into(rs.dst, m.data, rs.size / elem, op.schedule.reduction());
      } else if (rs.size != 0 && !m.in_place) {
        std::memcpy(rs.dst, m.data, rs.size);
      }
    }
    op.got.clear();  // the messages' Buffers go back to the device
    ++op.round;
    op.round_started = false;
  }
}

void TeamImpl::accept(Op& op, Message&& m, Outbox& out) {
  const Round& r = op.schedule[op.round];
  for (std::size_t i = 0; i < r.recvs.size(); ++i) {
    const RecvStep& rs = r.recvs[i];
    if (rs.peer != m.src || rs.step != m.step || op.got[i].src >= 0) continue;
    if (m.size != rs.size) {
      FERRY_LOG_AT(warn, engine_.runtime().rank(), device_.index(),
                   "collective %llu on team %llx: rank %d sent %zu bytes for step %u, %zu expected; the members "
                   "disagree on the call's sizes",
                   static_cast<unsigned long long>(op.seq), static_cast<unsigned long long>(id_), members_[static_cast<std::size_t>(m.src)],
                   m.size, static_cast<unsigned>(m.step), rs.size);
      finish(op, -EPROTO, members_[static_cast<std::size_t>(m.src)], out);
      return;
    }
    if (m.rts) {
      // Read it with a get: into the destination itself, or a landing buffer to reduce from.
      // The receive has arrived once the get completes (get_complete).
      unsigned char* dst = rs.dst;
      if (rs.reduce) {
        op.landing[i].resize(rs.size);
        dst = op.landing[i].data();
      } else {
        m.in_place = true;
      }
      m.data = dst;
      if (op.get_count == op.gets.size()) op.gets.emplace_back();
      GetRec& g = op.gets[op.get_count++];
      g = GetRec{&op, i, members_[static_cast<std::size_t>(m.src)], m.step, m.key, dst, rs.size};
      ++op.refs;
      out.gets.push_back(&g);
      op.got[i] = std::move(m);
      return;
    }
    op.got[i] = std::move(m);
    --op.missing;
    return;
  }
  op.early.push_back(std::move(m));  // for a later round (its sender is ahead of this rank)
}

// The in-flight reference goes with the end: to the posting thread (posted()) while it is
// still inside post, else here once the end is queued for its signal.
void TeamImpl::finish(Op& op, int error, int rank, Outbox& out) {
  if (op.finished) return;
  op.finished = true;
  op.error = error;
  op.error_rank = rank;
  op.got.clear();
  op.early.clear();
  if (const std::size_t i = active_index(op.seq); i != kNone) active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(i));
  if (!op.in_post) {
    out.ended.push_back(Ended{op.local, op.context, op.bytes, error, rank});
    release(op);
  }
}

void TeamImpl::on_message(int src, std::uint64_t seq, std::uint16_t step, Message&& m) {
  Outbox out;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    m.src = index_of(src);
    m.step = step;
    if (m.src < 0 || m.src == me_) {
      FERRY_LOG_AT(warn, engine_.runtime().rank(), device_.index(), "dropped a collective's message from rank %d: not a member of team %llx",
                   src, static_cast<unsigned long long>(id_));
      return;
    }
    if (seq >= next_seq_) {
      unexpected_.emplace_back(seq, std::move(m));
      return;
    }
    const std::size_t at = active_index(seq);
    if (at == kNone) return;  // an operation already ended (by a failure): nothing waits for it
    Op& op = *active_[at].second;
    accept(op, std::move(m), out);
    advance(op, out);
  }
  engine_.run(out);
}

void TeamImpl::send_complete(SendRec& s, int error, int rank) {
  Outbox out;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    Op& op = *s.op;
    if (!op.finished) {
      if (error != 0) {
        finish(op, error, rank, out);
      } else {
        --op.sends_left;
        advance(op, out);
      }
    }
    release(op);
  }
  engine_.run(out);
}

void TeamImpl::send_dropped(SendRec& s) {
  std::lock_guard<std::mutex> guard(mutex_);
  release(*s.op);
}

void TeamImpl::posted_only(SendRec& s) {
  std::lock_guard<std::mutex> guard(mutex_);
  release(*s.op);
}

void TeamImpl::get_complete(GetRec& g, int error) {
  Outbox out;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    Op& op = *g.op;
    if (!op.finished) {
      if (error != 0) {
        finish(op, error, g.rank, out);
      } else {
        // The sender may let its data change now.
        if (op.send_count == op.sends.size()) op.sends.emplace_back();
        SendRec& fin = op.sends[op.send_count++];
        fin.op = &op;
        fin.rank = g.rank;
        fin.data = nullptr;
        fin.awaiting_fin = false;
        fin.header = CollHeader{kCollMagic, g.step, static_cast<std::uint16_t>(CollKind::fin), id_, op.seq, 0};
        fin.bytes.resize(sizeof(CollHeader));
        std::memcpy(fin.bytes.data(), &fin.header, sizeof(CollHeader));
        ++op.refs;
        out.sends.push_back(&fin);
        --op.missing;
        advance(op, out);
      }
    }
    release(op);
  }
  engine_.run(out);
}

void TeamImpl::on_fin(int src, std::uint64_t seq, std::uint16_t step) {
  Outbox out;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    const std::size_t at = active_index(seq);
    if (at == kNone) return;  // ended already (by a failure)
    Op& op = *active_[at].second;
    for (std::size_t i = op.round_sends; i < op.send_count; ++i) {
      SendRec& s = op.sends[i];
      if (!s.awaiting_fin || s.rank != src || s.header.step != step) continue;
      s.awaiting_fin = false;
      out.drop.push_back(std::move(s.region));
      --op.sends_left;
      advance(op, out);
      break;
    }
  }
  engine_.run(out);
}

bool TeamImpl::running(const GetRec& g) {
  std::lock_guard<std::mutex> guard(mutex_);
  return !g.op->finished;
}

void TeamImpl::get_dropped(GetRec& g) {
  std::lock_guard<std::mutex> guard(mutex_);
  release(*g.op);
}

void TeamImpl::fail_if_broken() {
  Outbox out;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (active_.empty()) return;
    const int failed = failed_member();
    if (failed < 0) return;
    std::vector<Op*> ops;
    for (auto& [seq, op] : active_) ops.push_back(op);
    for (Op* op : ops) finish(*op, peer_failed_error, failed, out);
  }
  engine_.run(out);
}

bool TeamImpl::running(const SendRec& s) {
  std::lock_guard<std::mutex> guard(mutex_);
  return !s.op->finished;
}

void TeamImpl::clear() noexcept {
  std::lock_guard<std::mutex> guard(mutex_);
  active_.clear();
  unexpected_.clear();
  free_ops_.clear();
  ops_.clear();
}

// ---- Engine -----------------------------------------------------------------------------

Engine::Engine(Runtime& runtime) : runtime_(runtime) {
  worlds_.resize(static_cast<std::size_t>(runtime.device_count()));
  expose_collectives(runtime_, *this);
}

// The device that owns the engine unexposed it first (extension.hpp): nothing signals it now.
Engine::~Engine() {
  std::lock_guard<std::mutex> guard(mutex_);
  retry_.clear();  // the sends and gets live in their ops, which the teams own
  retry_gets_.clear();
  for (auto& [id, team] : teams_) team->clear();
  orphans_.clear();
}

Engine& Engine::of(Runtime& runtime) {
  auto& engine = static_cast<Engine&>(device_extension(runtime.device(0), [&] { return std::make_unique<Engine>(runtime); }));
  for (int d = 1; d < runtime.device_count(); ++d) {
    (void)device_extension(runtime.device(d), [&] { return std::make_unique<EngineLink>(engine); });
  }
  return engine;
}

bool Engine::peer_failed(int rank) const noexcept { return detail::peer_failed(runtime_, rank); }

std::shared_ptr<TeamImpl> Engine::world(int device) {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (auto& w = worlds_.at(static_cast<std::size_t>(device))) return w;
  }
  std::vector<int> all(static_cast<std::size_t>(runtime_.size()));
  for (int r = 0; r < runtime_.size(); ++r) all[static_cast<std::size_t>(r)] = r;
  // The world of device d: id 1 on device 0, and an id of its own on each other device.
  const std::uint64_t id = device == 0 ? 1 : (0xD0000000ull + static_cast<std::uint64_t>(device));
  auto team = add_team(device, id, std::move(all));
  std::lock_guard<std::mutex> guard(mutex_);
  auto& w = worlds_[static_cast<std::size_t>(device)];
  if (!w) w = team;
  return w;
}

std::shared_ptr<TeamImpl> Engine::add_team(int device, std::uint64_t id, std::vector<int> members) {
  std::vector<Orphan> mine;
  std::shared_ptr<TeamImpl> team;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (auto it = teams_.find(id); it != teams_.end()) return it->second;
    team = std::make_shared<TeamImpl>(*this, runtime_.device(device), id, std::move(members), runtime_.size());
    teams_.emplace(id, team);
    for (auto it = orphans_.begin(); it != orphans_.end();) {
      if (it->team == id) {
        mine.push_back(std::move(*it));
        it = orphans_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Orphan& o : mine) team->on_message(o.src, o.seq, o.step, std::move(o.m));
  return team;
}

void Engine::run(Outbox& out) {
  while (!out.empty()) {
    if (!out.ended.empty()) {
      for (std::size_t i = 0; i < out.ended.size(); ++i) {
        const Ended& e = out.ended[i];
        Completion c;
        c.op = OpKind::coll;
        c.rank = e.rank;
        c.size = e.bytes;
        c.context = e.context;
        c.error = e.error;
        e.local->signal(std::move(c));
      }
      out.ended.clear();
      continue;
    }
    if (!out.drop.empty()) {
      std::vector<MemoryRegion> drop = std::move(out.drop);
      out.drop.clear();
      continue;  // deregistered here, outside every lock
    }
    if (out.next_get < out.gets.size()) {
      GetRec* g = out.gets[out.next_get++];
      if (out.next_get == out.gets.size()) {
        out.gets.clear();
        out.next_get = 0;
      }
      post_get(g);
      continue;
    }
    SendRec* s = out.sends[out.next++];
    if (out.next == out.sends.size()) {
      out.sends.clear();
      out.next = 0;
    }
    post_send(s);
  }
}

namespace {

CollKind kind_of(const SendRec& s) noexcept { return static_cast<CollKind>(s.header.kind); }

}  // namespace

void Engine::post_send(SendRec* s) {
  TeamImpl& team = *s->op->team;
  Device& dev = team.device();
  if (kind_of(*s) == CollKind::rts && !s->region) {
    // Registered here, outside the team's lock (a device call); once, even when retried.
    s->region = dev.register_memory(const_cast<unsigned char*>(s->data), static_cast<std::size_t>(s->header.size));
    const RemoteKey key = s->region.remote_key();
    std::memcpy(s->bytes.data() + sizeof(CollHeader), &key, sizeof key);
  }
  const Status st = dev.post_am(AmArgs{.rank = s->rank, .buffer = s->bytes.data(), .size = s->bytes.size(),
                                       .target = RemoteTarget{kCollectiveTarget}, .local = this, .context = s});
  if (st.is_posted()) return;  // signal() completes it
  if (st.is_retry()) {
    std::lock_guard<std::mutex> guard(mutex_);
    retry_.push_back(s);
    retry_count_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  sent(*s, st.is_failed() ? peer_failed_error : 0, st.rank);
}

// A message's post completed (at once, or signalled later).
void Engine::sent(SendRec& s, int error, int rank) {
  TeamImpl& team = *s.op->team;
  switch (kind_of(s)) {
    case CollKind::data: team.send_complete(s, error, error == 0 ? -1 : rank); break;
    case CollKind::rts:
      if (error != 0) {
        team.send_complete(s, error, rank);
      } else {
        team.posted_only(s);  // the send itself ends with the fin
      }
      break;
    case CollKind::fin: team.posted_only(s); break;  // a failed peer's collective ends anyway
  }
}

void Engine::post_get(GetRec* g) {
  TeamImpl& team = *g->op->team;
  const Status st = team.device().post_get(
      GetArgs{.rank = g->rank, .buffer = g->dst, .size = g->size, .remote = g->key, .local = this, .context = g});
  if (st.is_posted()) return;
  if (st.is_retry()) {
    std::lock_guard<std::mutex> guard(mutex_);
    retry_gets_.push_back(g);
    retry_count_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  team.get_complete(*g, st.is_failed() ? peer_failed_error : 0);
}

void Engine::signal(Completion&& c) noexcept {
  try {
    if (c.op == OpKind::remote_am) {
      on_message(std::move(c));
      return;
    }
    if (c.context == nullptr) return;
    if (c.op == OpKind::get) {
      auto* g = static_cast<GetRec*>(c.context);
      g->op->team->get_complete(*g, c.error);
      return;
    }
    // One of this engine's messages left (posted: a send the device reports later).
    auto* s = static_cast<SendRec*>(c.context);
    sent(*s, c.error, s->rank);
  } catch (const std::exception& e) {
    FERRY_LOG_AT(error, runtime_.rank(), -1, "collectives: %s", e.what());
  }
}

void Engine::on_message(Completion&& c) {
  if (c.error != 0) return;  // a message its sender's failure cut short: the failure ends its op
  const auto malformed = [&](const char* why) {
    FERRY_LOG_AT(warn, runtime_.rank(), -1, "dropped a malformed collective's message from rank %d: %s", c.rank, why);
  };
  if (!c.parts.empty()) return malformed("it has zero-copy parts");
  CollMessage d;
  if (const char* why = decode_coll(c.buffer.data(), c.buffer.size(), c.rank, d)) return malformed(why);
  const CollHeader& h = d.header;
  Message m;
  m.data = d.data;
  m.size = d.size;
  m.rts = d.kind == CollKind::rts;
  m.key = d.key;
  m.holder = std::move(c.buffer);
  // The team of the last message, without the engine's lock: teams live as long as the engine.
  TeamImpl* team = last_team_.load(std::memory_order_acquire);
  if (team == nullptr || team->id() != h.team) {
    std::lock_guard<std::mutex> guard(mutex_);
    if (auto it = teams_.find(h.team); it != teams_.end()) {
      team = it->second.get();
      last_team_.store(team, std::memory_order_release);
    } else if (static_cast<CollKind>(h.kind) == CollKind::fin) {
      return malformed("a fin for a team this rank has not made");
    } else if (orphans_.size() < kMaxOrphans) {
      orphans_.push_back(Orphan{h.team, h.seq, c.rank, h.step, std::move(m)});
      return;
    } else {
      return malformed("for a team this rank has not made, past the limit of messages kept for such teams");
    }
  }
  if (static_cast<CollKind>(h.kind) == CollKind::fin) {
    team->on_fin(c.rank, h.seq, h.step);
  } else {
    team->on_message(c.rank, h.seq, h.step, std::move(m));
  }
}

void Engine::slow_path() noexcept {
  try {
    std::vector<std::shared_ptr<TeamImpl>> teams;
    std::vector<SendRec*> again;
    std::vector<GetRec*> again_gets;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      if (retry_count_.load(std::memory_order_relaxed) != 0) {
        again.swap(retry_);
        again_gets.swap(retry_gets_);
        retry_count_.store(0, std::memory_order_relaxed);
      }
      const std::uint32_t failures = runtime_.failure_count();
      if (failures != failures_seen_) {
        failures_seen_ = failures;
        for (auto& [id, t] : teams_) teams.push_back(t);
      }
    }
    for (auto& t : teams) t->fail_if_broken();
    Outbox out;
    for (SendRec* s : again) {
      if (s->op->team->running(*s)) {
        out.sends.push_back(s);
      } else {
        s->op->team->send_dropped(*s);
      }
    }
    for (GetRec* g : again_gets) {
      if (g->op->team->running(*g)) {
        out.gets.push_back(g);
      } else {
        g->op->team->get_dropped(*g);
      }
    }
    run(out);
  } catch (const std::exception& e) {
    FERRY_LOG_AT(error, runtime_.rank(), -1, "collectives: %s", e.what());
  }
}

}  // namespace ferry::detail
