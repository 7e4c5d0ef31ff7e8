// ferry-monitor-sim: the failure detector's monitoring ring (src/core/monitor_ring.hpp) with
// thousands to 100 000 virtual ranks in one process, over a scripted network, to show what it
// costs each process and how long a failure takes to reach every survivor as the job grows.
//
// Each virtual rank runs the runtime's own RingMonitor the way the keepalive thread does: a
// step every check interval (heartbeats to its guardians, the silence of its wards, notices
// owed), and while notices move a poll-and-forward every 2 ms between steps. Messages arrive
// after a fixed latency and are read at the receiver's next wake, as from the channel. Ranks of
// the failed rank's own host learn of a killed process from their process watch (one to two
// check intervals, as check_peers does), then spread it like any other failure.
//
// One JSON object on stdout per run: the job's shape, the steady per-process monitoring
// traffic (messages per second sent and received, mean and max, before the failure), and for
// the failure scenario the time until the first survivor and until every survivor knew of
// every failed rank, the notices each survivor sent for it (median, max), and any survivor
// blamed falsely. Exit status 1 when a survivor never learned of a failure or blamed a
// survivor.
//   ferry-monitor-sim --ranks 100000 --per-host 64 --kill host
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/monitor_ring.hpp"

namespace {

using ferry::detail::Beat;
using ferry::detail::GoneFn;
using ferry::detail::RingLayout;
using ferry::detail::RingMonitor;

constexpr std::int64_t kUs = 1000;  // nanoseconds

struct Message {
  int from;
  Beat kind;
  int subject;
};

struct Rank {
  std::unique_ptr<RingMonitor> monitor;
  std::vector<int> known;  // failed ranks it knows, sorted
  std::vector<Message> inbox;
  std::int64_t next_check = 0, last_check = 0, busy_until = 0;
  bool dead = false;
  bool waking = false;  // a wake is queued
  std::uint64_t sent = 0, received = 0, notices_at_kill = 0;
  bool knows(int r) const { return std::binary_search(known.begin(), known.end(), r); }
};

struct Event {
  std::int64_t at;
  int rank;
  int kind;  // 0: wake; 1: a message arrives (in `message`)
  Message message;
  bool operator>(const Event& o) const { return at > o.at; }
};

struct Sim {
  std::shared_ptr<const RingLayout> ring;
  std::vector<Rank> ranks;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;
  std::int64_t now = 0, latency_ns, check_ns, poll_ns = 2000 * kUs;
  std::vector<int> victims;
  std::int64_t kill_at = -1;
  std::vector<std::int64_t> learned_last;  // by victim index: latest time a survivor learned of it
  std::vector<std::int64_t> learned_first;
  std::vector<int> learned_count;
  std::uint64_t false_blames = 0;

  struct Out final : RingMonitor::Outbox {
    Sim* sim;
    int from;
    int send(int to, Beat kind, int subject) noexcept override {
      Rank& r = sim->ranks[static_cast<std::size_t>(from)];
      ++r.sent;
      sim->events.push(Event{sim->now + sim->latency_ns, to, 1, Message{from, kind, subject}});
      return 0;
    }
  };

  void wake(int r, std::int64_t at) { events.push(Event{at, r, 0, {}}); }

  void learn(int r, int subject) {
    Rank& me = ranks[static_cast<std::size_t>(r)];
    if (subject == r || me.knows(subject)) return;
    me.known.insert(std::lower_bound(me.known.begin(), me.known.end(), subject), subject);
    me.monitor->spread(subject);
    const auto v = std::find(victims.begin(), victims.end(), subject);
    if (v == victims.end() || kill_at < 0) {
      ++false_blames;
      return;
    }
    const std::size_t i = static_cast<std::size_t>(v - victims.begin());
    if (learned_count[i]++ == 0) learned_first[i] = now;
    learned_last[i] = std::max(learned_last[i], now);
    if (!me.waking) {
      me.waking = true;
      wake(r, now);  // spread at once, as the keepalive thread does after its poll
    }
  }

  void run_wake(int r) {
    Rank& me = ranks[static_cast<std::size_t>(r)];
    me.waking = false;
    if (me.dead) return;
    Out out;
    out.sim = this;
    out.from = r;
    const GoneFn gone = [&me](int s) { return me.knows(s); };
    bool notices = false;
    std::vector<Message> inbox;
    inbox.swap(me.inbox);
    for (const Message& m : inbox) {
      ++me.received;
      if (m.kind == Beat::alive) me.monitor->heard(m.from);
      if (m.kind == Beat::failed) {
        notices = true;
        learn(r, m.subject == r ? m.from : m.subject);
      }
    }
    if (now >= me.next_check) {
      std::vector<int> silent;
      me.monitor->tick(now, now - me.last_check, me.known.size(), gone, out, silent);
      me.last_check = now;
      me.next_check = now + check_ns;
      for (int s : silent) learn(r, s);
    }
    me.monitor->flush(gone, out);
    if (notices || me.monitor->spreading()) me.busy_until = now + check_ns;
    const std::int64_t next = now < me.busy_until ? std::min(me.next_check, now + poll_ns) : me.next_check;
    me.waking = true;
    wake(r, next);
  }

  void run_until(std::int64_t end, bool stop_when_known) {
    while (!events.empty() && events.top().at <= end) {
      const Event e = events.top();
      events.pop();
      now = e.at;
      if (e.kind == 1) {
        Rank& to = ranks[static_cast<std::size_t>(e.rank)];
        if (!to.dead) to.inbox.push_back(e.message);
        continue;
      }
      run_wake(e.rank);
      if (stop_when_known && all_known()) return;
    }
    now = end;
  }

  std::size_t alive = 0;  // survivors of the failure
  bool all_known() const {
    for (int c : learned_count)
      if (static_cast<std::size_t>(c) < alive) return false;
    return true;
  }
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 4096, per_host = 64, kills = 1, timeout_ms = 4000, check_ms = 200;
  double latency_us = 50, steady_s = 10;
  std::string kill = "one";
  unsigned seed = 1;
  CLI::App app{"ferry-monitor-sim: the failure detector's ring with many virtual ranks", "ferry-monitor-sim"};
  app.add_option("--ranks", ranks, "virtual ranks")->check(CLI::Range(2, 10000000));
  app.add_option("--per-host", per_host, "ranks per host")->check(CLI::Range(1, 100000));
  app.add_option("--kill", kill, "what fails: none, one (a rank's process), several (--kills ranks at once), host")
      ->check(CLI::IsMember({"none", "one", "several", "host"}));
  app.add_option("--kills", kills, "ranks failed at once with --kill several")->check(CLI::Range(1, 100000));
  app.add_option("--timeout-ms", timeout_ms, "FERRY_PEER_TIMEOUT_MS")->check(CLI::Range(4, 86400000));
  app.add_option("--check-ms", check_ms, "FERRY_PEER_CHECK_MS")->check(CLI::Range(1, 60000));
  app.add_option("--latency-us", latency_us, "one message's latency")->check(CLI::Range(0.0, 1e6));
  app.add_option("--steady-s", steady_s, "seconds before the failure (traffic measured over the second half)")
      ->check(CLI::Range(1.0, 3600.0));
  app.add_option("--seed", seed, "random seed (phases, victims)");
  CLI11_PARSE(app, argc, argv);
  if (timeout_ms < 4 * check_ms) {
    std::fprintf(stderr, "ferry-monitor-sim: --timeout-ms=%d is below 4 x --check-ms=%d\n", timeout_ms, check_ms);
    return 2;
  }

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int> host(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) host[static_cast<std::size_t>(r)] = r / per_host;
  Sim sim;
  sim.ring = std::make_shared<const RingLayout>(host);
  sim.latency_ns = static_cast<std::int64_t>(latency_us * 1000);
  sim.check_ns = std::int64_t{check_ms} * 1000000;
  sim.ranks.resize(static_cast<std::size_t>(ranks));
  std::mt19937_64 rng(seed);
  std::size_t links_total = 0, links_most = 0;
  for (int r = 0; r < ranks; ++r) {
    Rank& me = sim.ranks[static_cast<std::size_t>(r)];
    me.monitor = std::make_unique<RingMonitor>(sim.ring, r, timeout_ms, check_ms);
    links_total += me.monitor->links().size();
    links_most = std::max(links_most, me.monitor->links().size());
    // Ranks start within one check interval of each other, each at its own phase.
    const std::int64_t phase = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(sim.check_ns));
    me.next_check = me.last_check = phase;
    me.waking = true;
    sim.wake(r, phase);
  }
  const double setup_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const std::int64_t steady_ns = static_cast<std::int64_t>(steady_s * 1e9);
  sim.run_until(steady_ns / 2, false);
  std::vector<std::uint64_t> sent_mid(sim.ranks.size()), received_mid(sim.ranks.size());
  for (std::size_t r = 0; r < sim.ranks.size(); ++r) {
    sent_mid[r] = sim.ranks[r].sent;
    received_mid[r] = sim.ranks[r].received;
  }
  sim.run_until(steady_ns, false);
  const double window_s = steady_s / 2;
  double sent_sum = 0, sent_max = 0, recv_sum = 0, recv_max = 0;
  for (std::size_t r = 0; r < sim.ranks.size(); ++r) {
    Rank& me = sim.ranks[r];
    const double s = static_cast<double>(me.sent - sent_mid[r]) / window_s;
    const double v = static_cast<double>(me.received - received_mid[r]) / window_s;
    sent_sum += s;
    recv_sum += v;
    sent_max = std::max(sent_max, s);
    recv_max = std::max(recv_max, v);
    me.notices_at_kill = me.monitor->notices_sent();
  }
  const std::uint64_t false_before = sim.false_blames;

  // The failure.
  if (kill == "one") {
    sim.victims.push_back(static_cast<int>(rng() % static_cast<std::uint64_t>(ranks)));
  } else if (kill == "several") {
    while (static_cast<int>(sim.victims.size()) < std::min(kills, ranks - 1)) {
      const int v = static_cast<int>(rng() % static_cast<std::uint64_t>(ranks));
      if (std::find(sim.victims.begin(), sim.victims.end(), v) == sim.victims.end()) sim.victims.push_back(v);
    }
  } else if (kill == "host") {
    const int h = static_cast<int>(rng() % static_cast<std::uint64_t>((ranks + per_host - 1) / per_host));
    for (int r = h * per_host; r < std::min(ranks, (h + 1) * per_host); ++r) sim.victims.push_back(r);
  }
  sim.kill_at = sim.now;
  sim.learned_first.assign(sim.victims.size(), -1);
  sim.learned_last.assign(sim.victims.size(), -1);
  sim.learned_count.assign(sim.victims.size(), 0);
  for (int v : sim.victims) sim.ranks[static_cast<std::size_t>(v)].dead = true;
  sim.alive = sim.ranks.size() - sim.victims.size();
  // Survivors on a victim's host see its process end at their watch's next check or the one
  // after (check_peers confirms a process seen ended at the following check).
  if (kill != "host") {
    for (int v : sim.victims) {
      const int h = host[static_cast<std::size_t>(v)];
      for (int r = h * per_host; r < std::min(ranks, (h + 1) * per_host); ++r) {
        if (sim.ranks[static_cast<std::size_t>(r)].dead) continue;
        const std::int64_t seen = sim.now + sim.check_ns + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(sim.check_ns));
        sim.events.push(Event{seen, r, 1, Message{r, Beat::failed, v}});  // its own watch, read at that wake
      }
    }
  }
  const std::int64_t horizon = sim.now + 3 * std::int64_t{timeout_ms} * 1000000;
  if (!sim.victims.empty()) sim.run_until(horizon, true);
  const bool everyone = sim.victims.empty() || sim.all_known();
  // Notices each survivor sent for the failure.
  std::vector<double> notice_sent;
  double notice_max = 0;
  for (const Rank& me : sim.ranks) {
    if (me.dead) continue;
    notice_sent.push_back(static_cast<double>(me.monitor->notices_sent() - me.notices_at_kill));
    notice_max = std::max(notice_max, notice_sent.back());
  }
  double first_ms = -1, all_ms = -1;
  for (std::size_t i = 0; i < sim.victims.size(); ++i) {
    const double f = static_cast<double>(sim.learned_first[i] - sim.kill_at) / 1e6;
    const double l = static_cast<double>(sim.learned_last[i] - sim.kill_at) / 1e6;
    first_ms = first_ms < 0 ? f : std::min(first_ms, f);
    all_ms = std::max(all_ms, l);
  }

  nlohmann::json j{{"bench", "monitor_sim"},
                   {"ranks", ranks},
                   {"per_host", per_host},
                   {"hosts", (ranks + per_host - 1) / per_host},
                   {"kill", kill},
                   {"failed", sim.victims.size()},
                   {"timeout_ms", timeout_ms},
                   {"check_ms", check_ms},
                   {"latency_us", latency_us},
                   {"seed", seed},
                   {"links_mean", static_cast<double>(links_total) / ranks},
                   {"links_max", links_most},
                   {"steady_sent_per_s_mean", sent_sum / ranks},
                   {"steady_sent_per_s_max", sent_max},
                   {"steady_received_per_s_mean", recv_sum / ranks},
                   {"steady_received_per_s_max", recv_max},
                   {"false_failures_steady", false_before},
                   {"false_failures", sim.false_blames},
                   {"every_survivor_knew", everyone},
                   {"first_knew_ms", first_ms},
                   {"all_knew_ms", all_ms},
                   {"notices_sent_median", median(notice_sent)},
                   {"notices_sent_max", notice_max},
                   {"setup_s", setup_s},
                   {"wall_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}};
  std::printf("%s\n", j.dump().c_str());
  return everyone && sim.false_blames == 0 ? 0 : 1;
}
