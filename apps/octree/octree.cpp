// ferry-octree: an Octo-Tiger-like proxy on ferry's AMT runtime. An adaptive octree of leaves
// (each n³ cells, refined near one or two "stars") is spread over the ranks in Morton order;
// every time step each leaf takes halos from its neighbours (small messages, many in flight,
// sent by whichever worker finished the neighbour), then runs a stencil with a source term.
// Every `regrid_every` steps the partition shifts, and each rank sends the leaves it gives up
// to their new owner as one large message per destination (a subtree's migration).
//
// No barrier per step: a leaf's step is a continuation of its inputs. Each leaf counts what
// has arrived for step s (one halo message per neighbouring leaf, and its own state: from the
// local step before, or migrated in); the arrival that completes the count spawns the step.
// A neighbour is never more than one step ahead (it needs this leaf's halo to get there), so
// two ghost buffers, by step parity, hold everything that can be in flight.
//
// Deterministic: every value depends only on the initial state, never on arrival order, so
// the final checksum equals the serial reference's bit for bit (--verify computes it).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ferry/amt.hpp"
#include "ferry/error.hpp"
#include "ferry/parcel.hpp"
#include "app_main.hpp"
#include "tree.hpp"

using Clock = std::chrono::steady_clock;

namespace {

// One leaf as this rank holds it. Every rank keeps a slot for every leaf (halos for a leaf
// can arrive before the leaf itself migrates in), and allocates its cells on first use.
struct LeafSlot {
  std::vector<double> u, next;        // the state at `step`, and the step's output
  std::vector<double> ghost[2];       // by step parity
  // Arrivals for the step of that parity: halo messages and the state itself. acq_rel: each
  // arrival publishes its ghost writes (or the migrated state) to the one that completes the
  // count, which spawns the step.
  std::atomic<int> arrived[2] = {0, 0};
};

struct App {
  ferry::amt::Runtime* rt = nullptr;
  int me = 0, ranks = 1;
  std::unique_ptr<octree::Mesh> mesh;
  std::unique_ptr<LeafSlot[]> slots;
  std::size_t shift = 1;  // leaves the partition moves by at each regrid

  ferry::amt::Action<void, std::uint32_t, std::uint32_t, std::uint32_t, std::vector<double>> halo{};
  ferry::amt::Action<void, std::uint32_t, std::vector<std::uint32_t>, std::vector<double>> migrate{};
  ferry::amt::Action<void, std::vector<std::uint64_t>> done{};

  // Leaves given up at a regrid, gathered per (step, destination) into one message.
  struct Bundle {
    std::size_t expected = 0;
    std::vector<std::uint32_t> ids;
    std::vector<double> data;
  };
  std::mutex bundles_lock;
  std::map<std::pair<int, int>, Bundle> bundles;

  // Counters: what this rank sent, and checks of what it received.
  std::atomic<std::uint64_t> halo_messages{0}, halo_bytes{0}, migrations{0}, migrated_leaves{0}, migration_bytes{0};
  std::atomic<std::uint64_t> bad_messages{0};
  std::vector<octree::LeafSum> final_sums;      // by leaf; written by the leaf's last step here
  std::vector<std::uint32_t> final_here;        // ids, under final_lock
  std::mutex final_lock;
  std::size_t final_expected = 0;               // leaves whose last step runs here
  std::atomic<std::size_t> final_count{0};

  // Rank 0: reports from the ranks, the clock, and every rank's counters summed (counters():
  // halo messages, halo bytes, migrations, migrated leaves, migration bytes, errors, progress
  // calls up to the rank's last step).
  std::atomic<int> reports{0};
  std::mutex totals_lock;
  std::vector<std::uint64_t> totals = std::vector<std::uint64_t>(7, 0);
  Clock::time_point t0, t1;
  std::atomic<bool> finished{false};

  int epoch(int step) const { return mesh->params().regrid_every > 0 ? step / mesh->params().regrid_every : 0; }
  int owner(std::size_t leaf, int ep) const {
    const std::size_t L = mesh->leaves();
    const std::size_t pos = (leaf + (static_cast<std::size_t>(ep) % L) * shift) % L;
    return static_cast<int>(pos * static_cast<std::size_t>(ranks) / L);
  }
  int expected_arrivals(std::size_t leaf) const { return static_cast<int>(mesh->in_links(leaf).size()) + 1; }

  void allocate() {
    const std::size_t L = mesh->leaves();
    slots = std::make_unique<LeafSlot[]>(L);
    final_sums.resize(L);
    const auto cells = static_cast<std::size_t>(mesh->cells());
    const auto ghosts = static_cast<std::size_t>(mesh->ghosts());
    const int last = epoch(mesh->params().steps - 1);
    for (std::size_t a = 0; a < L; ++a) {
      // Every leaf this rank may ever hold: allocated now, before any message can arrive.
      // Ownership repeats with the epoch modulo L.
      bool mine = false;
      for (int e = 0; e <= std::min<long long>(last, static_cast<long long>(L) - 1) && !mine; ++e) mine = owner(a, e) == me;
      if (mine) {
        slots[a].ghost[0].assign(ghosts, 0.0);
        slots[a].ghost[1].assign(ghosts, 0.0);
        slots[a].u.assign(cells, 0.0);
        slots[a].next.assign(cells, 0.0);
      }
      if (owner(a, last) == me) ++final_expected;
    }
  }

  // One arrival for (leaf, step); the one that completes the count runs the step.
  void arrive(std::uint32_t leaf, int step) {
    LeafSlot& s = slots[leaf];
    if (s.arrived[step & 1].fetch_add(1, std::memory_order_acq_rel) + 1 == expected_arrivals(leaf)) {
      rt->spawn([this, leaf, step] { advance(leaf, step); });
    }
  }

  void send_halos(std::uint32_t a, int step) {
    const LeafSlot& s = slots[a];
    const int ep = epoch(step);
    for (const octree::Link& o : mesh->out_links(a)) {
      std::vector<double> values(o.cells.size());
      for (std::size_t k = 0; k < values.size(); ++k) values[k] = s.u[static_cast<std::size_t>(o.cells[k])];
      halo_messages.fetch_add(1, std::memory_order_relaxed);
      halo_bytes.fetch_add(values.size() * sizeof(double), std::memory_order_relaxed);
      rt->async(owner(o.peer, ep), halo, o.peer, a, static_cast<std::uint32_t>(step), std::move(values));
    }
  }

  // The leaf holds state `step` here, and every halo of that step has arrived: step it.
  void advance(std::uint32_t a, int step) {
    LeafSlot& s = slots[a];
    const int p = step & 1;
    double* ghost = s.ghost[p].data();
    octree::fill_mirrored(*mesh, a, s.u.data(), ghost);
    octree::step_leaf(*mesh, s.u.data(), ghost, s.next.data());
    s.u.swap(s.next);
    // Relaxed: the next arrivals of this parity (step + 2) follow from this task's own sends
    // (a neighbour needs this leaf's step + 1 halo first), which order them after this store.
    s.arrived[p].store(0, std::memory_order_relaxed);
    const int next = step + 1;
    if (next == mesh->params().steps) {
      final_sums[a] = octree::leaf_sum(*mesh, s.u.data());
      {
        std::lock_guard<std::mutex> g(final_lock);
        final_here.push_back(a);
      }
      if (final_count.fetch_add(1, std::memory_order_acq_rel) + 1 == final_expected) report();
      return;
    }
    send_halos(a, next);
    const int to = owner(a, epoch(next));
    if (to == me) {
      arrive(a, next);
    } else {
      give_away(a, next, to);
    }
  }

  // A regrid: leaf a's state `step` moves to rank `to`, bundled with the others this rank
  // gives `to` at this step.
  void give_away(std::uint32_t a, int step, int to) {
    Bundle out;
    {
      std::lock_guard<std::mutex> g(bundles_lock);
      auto [it, fresh] = bundles.try_emplace({step, to});
      Bundle& b = it->second;
      if (fresh) {
        const int before = epoch(step - 1), after = epoch(step);
        for (std::size_t x = 0; x < mesh->leaves(); ++x)
          if (owner(x, before) == me && owner(x, after) == to) ++b.expected;
      }
      b.ids.push_back(a);
      b.data.insert(b.data.end(), slots[a].u.begin(), slots[a].u.end());
      if (b.ids.size() < b.expected) return;
      out = std::move(b);
      bundles.erase(it);
    }
    migrations.fetch_add(1, std::memory_order_relaxed);
    migrated_leaves.fetch_add(out.ids.size(), std::memory_order_relaxed);
    migration_bytes.fetch_add(out.data.size() * sizeof(double), std::memory_order_relaxed);
    rt->async(to, migrate, static_cast<std::uint32_t>(step), std::move(out.ids), std::move(out.data));
  }

  // ---- actions (bytes from the wire: checked before use) ----
  void on_halo(std::uint32_t dst, std::uint32_t src, std::uint32_t step, const std::vector<double>& values) {
    const auto steps = static_cast<std::uint32_t>(mesh->params().steps);
    if (dst >= mesh->leaves() || src >= mesh->leaves() || step >= steps || owner(dst, epoch(static_cast<int>(step))) != me) {
      bad_messages.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    const int k = mesh->in_link_of(dst, src);
    if (k < 0 || mesh->in_links(dst)[static_cast<std::size_t>(k)].slots.size() != values.size()) {
      bad_messages.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    const auto& slots_of = mesh->in_links(dst)[static_cast<std::size_t>(k)].slots;
    double* ghost = slots[dst].ghost[step & 1].data();
    for (std::size_t i = 0; i < values.size(); ++i) ghost[slots_of[i]] = values[i];
    arrive(dst, static_cast<int>(step));
  }

  void on_migrate(std::uint32_t step, const std::vector<std::uint32_t>& ids, const std::vector<double>& data) {
    const auto cells = static_cast<std::size_t>(mesh->cells());
    const int st = static_cast<int>(step);
    bool ok = step < static_cast<std::uint32_t>(mesh->params().steps) && data.size() == ids.size() * cells;
    for (std::size_t i = 0; ok && i < ids.size(); ++i) ok = ids[i] < mesh->leaves() && owner(ids[i], epoch(st)) == me;
    if (!ok) {
      bad_messages.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    for (std::size_t i = 0; i < ids.size(); ++i) {
      std::copy_n(data.begin() + static_cast<std::ptrdiff_t>(i * cells), cells, slots[ids[i]].u.begin());
      arrive(ids[i], st);
    }
  }

  void start() {
    const int n = mesh->params().n;
    std::vector<std::uint32_t> mine;
    for (std::size_t a = 0; a < mesh->leaves(); ++a)
      if (owner(a, 0) == me) mine.push_back(static_cast<std::uint32_t>(a));
    if (final_expected == 0) report();
    // In tasks of a few leaves each, so every worker sends.
    constexpr std::size_t batch = 4;
    for (std::size_t i = 0; i < mine.size(); i += batch) {
      std::vector<std::uint32_t> part(mine.begin() + static_cast<std::ptrdiff_t>(i),
                                      mine.begin() + static_cast<std::ptrdiff_t>(std::min(mine.size(), i + batch)));
      rt->spawn([this, n, part = std::move(part)] {
        for (std::uint32_t a : part) {
          std::vector<double>& u = slots[a].u;
          for (int x = 0; x < n; ++x)
            for (int y = 0; y < n; ++y)
              for (int z = 0; z < n; ++z) u[static_cast<std::size_t>(octree::cell_index(n, x, y, z))] = octree::initial_value(*mesh, a, x, y, z);
          send_halos(a, 0);
          arrive(a, 0);
        }
      });
    }
  }

  std::vector<std::uint64_t> counters() const {
    return {halo_messages.load(), halo_bytes.load(), migrations.load(), migrated_leaves.load(), migration_bytes.load(),
            bad_messages.load() + rt->errors(), rt->progress_calls()};
  }

  // This rank's last leaf has finished (exactly once).
  void report() {
    if (me == 0) {
      on_done(counters());
    } else {
      rt->async(0, done, counters());
    }
  }
  // Rank 0: one rank's leaves have all finished.
  void on_done(const std::vector<std::uint64_t>& c) {
    {
      std::lock_guard<std::mutex> g(totals_lock);
      for (std::size_t i = 0; i < totals.size() && i < c.size(); ++i) totals[i] += c[i];
      if (c.size() != totals.size()) ++totals[5];
    }
    if (reports.fetch_add(1, std::memory_order_acq_rel) + 1 == ranks) {
      t1 = Clock::now();
      finish();
    }
  }
  void finish() {
    finished.store(true, std::memory_order_release);
    finished.notify_all();
  }

  // (leaf, sum bits, hash) of every leaf whose last step ran here.
  std::vector<std::uint64_t> results() {
    std::lock_guard<std::mutex> g(final_lock);
    std::vector<std::uint64_t> out;
    for (std::uint32_t a : final_here) {
      std::uint64_t bits = 0;
      std::memcpy(&bits, &final_sums[a].sum, sizeof bits);
      out.insert(out.end(), {a, bits, final_sums[a].hash});
    }
    return out;
  }
};

std::string hex(std::uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "%016" PRIx64, v);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  octree::Params p;
  std::int64_t threads = 0;
  std::string parcelport = ferry::amt::option_table().resolve().settings.parcelport;
  bool json = false, verify = false, inline_tasks = false;

  CLI::App app{"ferry-octree: an Octo-Tiger-like adaptive octree proxy on ferry's AMT runtime", "ferry-octree"};
  app.add_option("--cells", p.n, "cells per leaf edge (2 to 64)");
  app.add_option("--min-level", p.min_level, "every leaf at least this deep (0 to 8)");
  app.add_option("--max-level", p.max_level, "refinement near the stars stops here (min-level to 10)");
  app.add_option("--stars", p.stars, "refinement centres (1 or 2)");
  app.add_option("--steps", p.steps, "time steps");
  app.add_option("--regrid-every", p.regrid_every, "steps between regrids, where leaves migrate (0: never)");
  app.add_option("--work", p.work, "source-term terms per cell per step (compute intensity)");
  app.add_option("--threads", threads, "worker threads per rank (0: FERRY_AMT_THREADS, else 1)");
  app.add_option("--parcelport", parcelport, "ferry, mpi, mpi_a, mpix (default: FERRY_PARCELPORT, else ferry)");
  app.add_flag("--inline-tasks", inline_tasks, "run arriving calls on the worker that polled them (amt::Options::inline_calls)");
  app.add_flag("--verify", verify, "rank 0 also runs the serial reference and compares the checksums (exit 1 on a mismatch)");
  app.add_flag("--json", json, "one JSON object (rank 0)");
  if (const int rc = apps::parse(app, argc, argv, "ferry-octree",
                                 [&] {
                                   octree::check(p);
                                   apps::check_range("--threads", threads, 0, 4096);
                                 });
      rc >= 0) {
    return rc;
  }
  if (const int rc = apps::check_parcelport("ferry-octree", parcelport); rc >= 0) return rc;

  std::unique_ptr<octree::Mesh> mesh;
  try {
    mesh = std::make_unique<octree::Mesh>(p);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "ferry-octree: error: %s\n", e.what());
    return apps::exit_usage;
  }

  ferry::amt::Options opt;
  opt.parcelport = parcelport;
  opt.threads = static_cast<int>(threads);
  opt.inline_calls = inline_tasks;
  static App a;  // static: outlives any task still running during teardown
  try {
    ferry::amt::Runtime rt(opt);
    a.rt = &rt;
    a.me = rt.rank();
    a.ranks = rt.size();
    a.mesh = std::move(mesh);
    a.shift = std::max<std::size_t>(1, a.mesh->leaves() / (4 * static_cast<std::size_t>(a.ranks)));
    a.allocate();  // before the actions exist: calls that arrive earlier are held until then

    a.halo = rt.action("octree.halo", [](std::uint32_t dst, std::uint32_t src, std::uint32_t step, std::vector<double> v) {
      a.on_halo(dst, src, step, v);
    });
    a.migrate = rt.action("octree.migrate", [](std::uint32_t step, std::vector<std::uint32_t> ids, std::vector<double> d) {
      a.on_migrate(step, ids, d);
    });
    a.done = rt.action("octree.done", [](std::vector<std::uint64_t> c) { a.on_done(c); });
    auto go = rt.action("octree.go", []() { a.start(); });
    auto ping = rt.action("octree.ping", []() { return 0; });
    auto results = rt.action("octree.results", []() { return a.results(); });
    auto stop = rt.action("octree.stop", []() { a.finish(); });

    std::vector<octree::LeafSum> sums(a.mesh->leaves());
    std::vector<bool> seen(a.mesh->leaves(), false);
    std::uint64_t errors = 0;
    if (a.me == 0) {
      // Every rank is up with its actions registered before the clock starts.
      for (int r = 1; r < a.ranks; ++r) rt.async_future(r, ping).get();
      a.t0 = Clock::now();
      for (int r = 1; r < a.ranks; ++r) rt.async(r, go);
      a.start();
      a.finished.wait(false, std::memory_order_acquire);
      for (int r = 0; r < a.ranks; ++r) {
        const std::vector<std::uint64_t> got = r == 0 ? a.results() : rt.async_future(r, results).get();
        for (std::size_t i = 0; i + 3 <= got.size(); i += 3) {
          const std::uint64_t leaf = got[i];
          if (leaf >= sums.size() || seen[leaf]) {
            ++errors;
            continue;
          }
          seen[leaf] = true;
          std::memcpy(&sums[leaf].sum, &got[i + 1], sizeof(double));
          sums[leaf].hash = got[i + 2];
        }
        if (got.size() % 3 != 0) ++errors;
      }
      for (int r = 1; r < a.ranks; ++r) rt.async(r, stop);
    } else {
      a.finished.wait(false, std::memory_order_acquire);
    }
    rt.finalize();

    if (a.me != 0) return 0;
    errors += a.totals[5] + static_cast<std::uint64_t>(std::count(seen.begin(), seen.end(), false));
    const octree::LeafSum total = octree::combine(sums);
    const double time_s = std::chrono::duration<double>(a.t1 - a.t0).count();
    int verified = -1;  // not asked
    if (verify) {
      const octree::LeafSum ref = octree::combine(octree::run_serial(*a.mesh));
      verified = ref.hash == total.hash && std::memcmp(&ref.sum, &total.sum, sizeof(double)) == 0 ? 1 : 0;
      if (verified == 0) {
        std::fprintf(stderr, "ferry-octree: checksum %s (sum %.17g) differs from the serial reference's %s (sum %.17g)\n",
                     hex(total.hash).c_str(), total.sum, hex(ref.hash).c_str(), ref.sum);
      }
    }
    const char* progress = std::getenv("FERRY_PROGRESS");
    if (json) {
      nlohmann::json j = {{"app", "octree"},
                          {"parcelport", rt.parcelport()},
                          {"transport", rt.transport()},
                          {"progress", rt.parcelport() == "ferry" ? (progress != nullptr ? progress : "explicit") : "mpi"},
                          {"ranks", a.ranks},
                          {"threads", rt.threads()},
                          {"leaves", a.mesh->leaves()},
                          {"cells", p.n},
                          {"min_level", p.min_level},
                          {"max_level", a.mesh->max_level_present()},
                          {"steps", p.steps},
                          {"regrid_every", p.regrid_every},
                          {"work", p.work},
                          {"time_s", time_s},
                          {"time_per_step_ms", time_s * 1e3 / p.steps},
                          {"halo_messages", a.totals[0]},
                          {"halo_bytes", a.totals[1]},
                          {"migration_messages", a.totals[2]},
                          {"migrated_leaves", a.totals[3]},
                          {"migration_bytes", a.totals[4]},
                          {"parcels_sent_rank0", rt.parcels_sent()},
                          {"progress_calls", a.totals[6]},
                          {"checksum", hex(total.hash)},
                          {"sum", total.sum},
                          {"verified", verified < 0 ? nlohmann::json(nullptr) : nlohmann::json(verified == 1)},
                          {"errors", errors}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("octree %s: %zu leaves, %d steps, %d ranks x %d threads: %.4f s, %.3f ms/step, %llu halo messages, "
                  "%llu migrations, checksum %s%s, %llu errors\n",
                  rt.parcelport().c_str(), a.mesh->leaves(), p.steps, a.ranks, rt.threads(), time_s, time_s * 1e3 / p.steps,
                  static_cast<unsigned long long>(a.totals[0]), static_cast<unsigned long long>(a.totals[2]),
                  hex(total.hash).c_str(), verified < 0 ? "" : (verified == 1 ? " (verified)" : " (WRONG)"),
                  static_cast<unsigned long long>(errors));
    }
    std::fflush(stdout);
    return errors == 0 && verified != 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-octree: error: %s\n", e.what());
    return 1;
  }
}
