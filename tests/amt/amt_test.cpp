// The AMT runtime across ranks, for one parcelport (FERRY_PARCELPORT or --parcelport):
// async / future, nested asyncs, every argument kind (zero-copy included), windows and gets,
// collectives (all_gather, all_reduce, broadcast from every root, barrier; 33 in flight; a
// continuation), remote counters (fetch_add from tasks of every rank: the fetched values
// exact; compare_swap: one winner), termination with work in flight, and bad input. Exit 0 when every check passed on this rank.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <functional>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "ferry/amt.hpp"
#ifdef FERRY_HAVE_PARCEL_MPI
#include "ferry/parcel_mpi.hpp"
#endif

using ferry::amt::Blob;

namespace {

int failures = 0;
int me = -1;
#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "rank %d: FAILED %s:%d: %s: ", me, __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                       \
      std::fprintf(stderr, "\n");                                              \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

std::atomic<long> spread_runs{0};

// The cascade spread(depth) runs on: node (loc, depth) sends to (loc+depth)%n and (loc+depth+1)%n.
void simulate(int loc, int depth, int n, std::vector<long>& runs) {
  ++runs[static_cast<std::size_t>(loc)];
  if (depth == 0) return;
  simulate((loc + depth) % n, depth - 1, n, runs);
  simulate((loc + depth + 1) % n, depth - 1, n, runs);
}

}  // namespace

int main(int argc, char** argv) {
  ferry::amt::Options opt;
  opt.threads = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--parcelport" && i + 1 < argc) opt.parcelport = argv[++i];
    else if (a == "--threads" && i + 1 < argc) opt.threads = std::atoi(argv[++i]);
    else if (a == "--inline-calls") opt.inline_calls = true;
    else {
      std::fprintf(stderr, "amt_test: unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
#ifdef FERRY_HAVE_PARCEL_MPI
  ferry::parcel::register_mpi_parcelports();
#endif
  ferry::amt::Runtime rt(opt);
  me = rt.rank();
  const int n = rt.size();

  auto add = rt.action("add", [](int a, int b) { return a + b; });
  auto where = rt.action("where", [&rt]() { return rt.rank(); });
  auto sum_vec = rt.action("sum_vec", [](std::vector<std::uint32_t> v) {
    return std::accumulate(v.begin(), v.end(), std::uint64_t{0});
  });
  auto echo_str = rt.action("echo_str", [](std::string s) { return s + "!"; });
  auto blob_sum = rt.action("blob_sum", [](Blob b, std::uint64_t salt) {
    std::uint64_t h = salt;
    for (std::size_t i = 0; i < b.size(); ++i) h = h * 31 + static_cast<std::uint8_t>(b.data()[i]);
    return h;
  });
  auto make_blob = rt.action("make_blob", [](std::uint64_t size) {
    Blob b(size);
    for (std::size_t i = 0; i < size; ++i) b.data()[i] = static_cast<std::byte>(i * 7);
    return b;
  });
  auto plus_one_via = rt.action("plus_one_via", [&rt, add](int via, int x) {
    // Nested: this action itself waits for another remote call (the worker helps meanwhile).
    return rt.async_future(via, add, x, 1).get();
  });
  ferry::amt::Action<void, int> spread{};
  spread = rt.action("spread", [&rt, &spread](int depth) {
    spread_runs.fetch_add(1);
    if (depth == 0) return;
    const int l = rt.rank(), k = rt.size();
    rt.async((l + depth) % k, spread, depth - 1);
    rt.async((l + depth + 1) % k, spread, depth - 1);
  });
  if (me == 0) rt.action("only_on_zero", [](int) {});

  for (int peer = 0; peer < n; ++peer) {
    CHECK(rt.async_future(peer, add, 40, 2).get() == 42, "add on %d", peer);
    CHECK(rt.async_future(peer, where).get() == peer, "where on %d", peer);
    for (std::size_t len : {std::size_t{0}, std::size_t{5}, std::size_t{3000}, std::size_t{100000}}) {
      std::vector<std::uint32_t> v(len);
      std::iota(v.begin(), v.end(), 1u);
      const auto expect = std::accumulate(v.begin(), v.end(), std::uint64_t{0});
      CHECK(rt.async_future(peer, sum_vec, v).get() == expect, "sum_vec len %zu on %d", len, peer);
    }
    CHECK(rt.async_future(peer, echo_str, std::string(20000, 'x')).get() == std::string(20000, 'x') + "!", "echo_str");
    for (std::size_t size : {std::size_t{16}, std::size_t{8192}, std::size_t{1} << 20}) {
      Blob b(size);
      std::uint64_t h = 5;
      for (std::size_t i = 0; i < size; ++i) {
        b.data()[i] = static_cast<std::byte>(i ^ (i >> 8));
        h = h * 31 + static_cast<std::uint8_t>(b.data()[i]);
      }
      CHECK(rt.async_future(peer, blob_sum, std::move(b), std::uint64_t{5}).get() == h, "blob_sum %zu on %d", size, peer);
      Blob back = rt.async_future(peer, make_blob, std::uint64_t{size}).get();
      bool ok = back.size() == size;
      for (std::size_t i = 0; ok && i < size; ++i) ok = back.data()[i] == static_cast<std::byte>(i * 7);
      CHECK(ok, "make_blob %zu from %d", size, peer);
    }
    CHECK(rt.async_future(peer, plus_one_via, (peer + 1) % n, 9).get() == 10, "nested via %d", peer);
  }

  auto error_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const ferry::Error& e) {
      return e.what();
    }
    return "no error";
  };

  // Windows: every rank exposes a part of its own size; gets from every rank (one-sided over
  // ferry, answered by the owner over the MPI parcelports), small, zero-copy sized and whole.
  static std::vector<std::uint8_t> part;  // static: a window's memory outlives the runtime
  auto byte_of = [](int rank, std::size_t i) { return static_cast<std::uint8_t>(i * 13 + static_cast<std::size_t>(rank) * 101); };
  auto part_size = [](int rank) { return (std::size_t{1} << 20) + static_cast<std::size_t>(rank) * 4096; };
  part.resize(part_size(me));
  for (std::size_t i = 0; i < part.size(); ++i) part[i] = byte_of(me, i);
  const ferry::amt::Window win = rt.expose(part.data(), part.size());
  const ferry::amt::Window empty = rt.expose(nullptr, 0);
  for (int peer = 0; peer < n; ++peer) {
    const std::size_t ps = part_size(peer);
    const std::pair<std::size_t, std::size_t> ranges[] = {{0, 8}, {3, 1000}, {4096, 65536}, {0, ps}, {ps - 5, 5}, {ps, 0}};
    for (const auto& [off, len] : ranges) {
      std::vector<std::uint8_t> got(len + 1, 0xEE);
      rt.get(peer, win, off, got.data(), len).get();
      bool ok = got[len] == 0xEE;  // nothing past the end
      for (std::size_t i = 0; ok && i < len; ++i) ok = got[i] == byte_of(peer, off + i);
      CHECK(ok, "get of %zu bytes at %zu from rank %d", len, off, peer);
    }
    std::uint64_t word = 0;
    const std::string outside = error_of([&] { (void)rt.get(peer, win, ps - 4, &word, 8); });
    CHECK(outside.find("outside rank " + std::to_string(peer) + "'s part") != std::string::npos, "message: %s", outside.c_str());
    const std::string in_empty = error_of([&] { (void)rt.get(peer, empty, 0, &word, 1); });
    CHECK(in_empty.find("outside rank") != std::string::npos, "message: %s", in_empty.c_str());
  }
  const std::string unknown = error_of([&] { (void)rt.get(0, ferry::amt::Window{999}, 0, nullptr, 0); });
  CHECK(unknown.find("window 999 is not one this runtime exposed") != std::string::npos, "message: %s", unknown.c_str());
  const std::string null_data = error_of([&] { (void)rt.expose(nullptr, 5); });
  CHECK(null_data.find("data is null with size=5") != std::string::npos, "message: %s", null_data.c_str());
  // Gets from many tasks at once, each waiting in its worker (which helps meanwhile).
  std::atomic<int> gets_done{0}, gets_ok{0};
  constexpr int kGetTasks = 64;
  for (int t = 0; t < kGetTasks; ++t) {
    rt.spawn([&, t] {
      const int peer = (me + 1 + t) % n;
      std::uint8_t got[24];
      const std::size_t off = static_cast<std::size_t>(t) * 997;
      rt.get(peer, win, off, got, sizeof got).get();
      bool ok = true;
      for (std::size_t i = 0; i < sizeof got; ++i) ok = ok && got[i] == byte_of(peer, off + i);
      if (ok) gets_ok.fetch_add(1);
      gets_done.fetch_add(1);
    });
  }
  while (gets_done.load() < kGetTasks) rt.help();
  CHECK(gets_ok.load() == kGetTasks, "%d of %d concurrent gets read the right bytes", gets_ok.load(), kGetTasks);

  // Continuations: on futures of calls and of gets, ready or not when then() is called.
  std::atomic<int> continued{0}, continued_ok{0};
  for (int peer = 0; peer < n; ++peer) {
    auto f = rt.async_future(peer, add, peer, 100);
    f.then([&, peer](ferry::amt::Future<int> g) {
      if (g.get() == peer + 100) continued_ok.fetch_add(1);
      continued.fetch_add(1);
    });
    auto ready = rt.async_future(peer, add, 1, 1);
    while (!ready.ready()) rt.help();
    ready.then([&](ferry::amt::Future<int> g) {
      if (g.get() == 2) continued_ok.fetch_add(1);
      continued.fetch_add(1);
    });
    const std::string twice = error_of([&] { ready.then([](ferry::amt::Future<int>) {}); });
    CHECK(twice.find("the future has a continuation already") != std::string::npos, "message: %s", twice.c_str());
    auto word = std::make_shared<std::uint64_t>(0);
    rt.get(peer, win, 8, word.get(), 8).then([&, peer, word](ferry::amt::Future<void> g) {
      g.get();
      std::uint64_t want = 0;
      for (int i = 7; i >= 0; --i) want = (want << 8) | byte_of(peer, 8 + static_cast<std::size_t>(i));
      if (*word == want) continued_ok.fetch_add(1);
      continued.fetch_add(1);
    });
  }
  while (continued.load() < 3 * n) rt.help();
  CHECK(continued_ok.load() == 3 * n, "%d of %d continuations saw their value", continued_ok.load(), 3 * n);

  // Collectives: every kind, with many in flight, against the values each rank knows.
  {
    const std::vector<int> all = rt.all_gather(me * 10 + 1).get();
    CHECK(all.size() == static_cast<std::size_t>(n), "all_gather gave %zu values", all.size());
    for (int r = 0; r < n && r < static_cast<int>(all.size()); ++r) {
      CHECK(all[static_cast<std::size_t>(r)] == r * 10 + 1, "all_gather[%d] = %d", r, all[static_cast<std::size_t>(r)]);
    }
    const double sum = rt.all_reduce(me + 0.5, std::plus<>{}).get();
    CHECK(sum == n * (n - 1) / 2.0 + 0.5 * n, "all_reduce sum = %g", sum);
    const std::uint64_t highest = rt.all_reduce(static_cast<std::uint64_t>(me), [](std::uint64_t x, std::uint64_t y) { return std::max(x, y); }).get();
    CHECK(highest == static_cast<std::uint64_t>(n - 1), "all_reduce max = %llu", static_cast<unsigned long long>(highest));
    for (int root = 0; root < n; ++root) {
      const long got = rt.broadcast(root, me == root ? root * 100L + 7 : -1L).get();
      CHECK(got == root * 100L + 7, "broadcast from %d gave %ld", root, got);
    }
    rt.barrier().get();
    std::vector<ferry::amt::Future<std::int64_t>> inflight;
    for (int i = 0; i < 32; ++i) inflight.push_back(rt.all_reduce(static_cast<std::int64_t>(i) * (me + 1), std::plus<>{}));
    auto late = rt.broadcast(n - 1, static_cast<int>(me == n - 1 ? 4242 : 0));
    for (int i = 0; i < 32; ++i) {
      const std::int64_t v = inflight[static_cast<std::size_t>(i)].get();
      CHECK(v == static_cast<std::int64_t>(i) * n * (n + 1) / 2, "in-flight all_reduce %d = %lld", i, static_cast<long long>(v));
    }
    CHECK(late.get() == 4242, "the broadcast behind 32 all_reduces");
    // A continuation waits for a collective without blocking a worker.
    std::atomic<int> seen{0};
    auto f = rt.all_reduce(1, std::plus<>{});
    f.then([&seen, n](ferry::amt::Future<int> g) { seen.store(g.get() == n ? 1 : 2); });
    while (seen.load() == 0) rt.help();
    CHECK(seen.load() == 1, "the continuation saw a wrong all_reduce");
  }

  // Remote counters: tasks of every rank fetch-add rank 0's counter; the fetched values are
  // exactly 0 .. total-1 (a bitmap of them, OR-reduced, and each rank's count, summed).
  {
    constexpr int kTasks = 3, kEach = 50;
    const ferry::amt::Counter c = rt.counter();
    using Bits = std::array<std::uint64_t, 64>;  // up to 4096 values
    Bits bits{};
    std::mutex bits_mutex;
    std::atomic<int> duplicates{0}, tasks_done{0};
    for (int t = 0; t < kTasks; ++t) {
      rt.spawn([&] {
        for (int i = 0; i < kEach; ++i) {
          const std::int64_t v = rt.fetch_add(0, c, 1).get();
          std::lock_guard<std::mutex> g(bits_mutex);
          if (v < 0 || v >= 4096 || (bits[static_cast<std::size_t>(v / 64)] >> (v % 64) & 1) != 0) {
            duplicates.fetch_add(1);
          } else {
            bits[static_cast<std::size_t>(v / 64)] |= std::uint64_t{1} << (v % 64);
          }
        }
        tasks_done.fetch_add(1);
      });
    }
    while (tasks_done.load() < kTasks) rt.help();
    CHECK(duplicates.load() == 0, "%d fetched values were out of range or seen twice here", duplicates.load());
    const Bits all_bits = rt.all_reduce(bits, [](Bits x, const Bits& y) {
      for (std::size_t i = 0; i < x.size(); ++i) x[i] |= y[i];
      return x;
    }).get();
    int ones = 0;
    for (std::uint64_t w : all_bits) ones += __builtin_popcountll(w);
    const int total = n * kTasks * kEach;
    CHECK(ones == total, "the fetched values cover %d of 0..%d", ones, total - 1);
    CHECK((all_bits[static_cast<std::size_t>((total - 1) / 64)] >> ((total - 1) % 64) & 1) != 0, "the last value was fetched");
    rt.barrier().get();
    if (me == 0) CHECK(rt.value(c) == total, "rank 0's counter holds %lld", static_cast<long long>(rt.value(c)));
    // compare_swap: of all ranks swapping 0 for their id, exactly one finds 0.
    const ferry::amt::Counter lock = rt.counter();
    const std::int64_t found = rt.compare_swap(0, lock, 0, me + 1).get();
    const int winners = rt.all_reduce(found == 0 ? 1 : 0, std::plus<>{}).get();
    CHECK(winners == 1, "%d ranks won the compare_swap", winners);
    const std::int64_t winner = rt.broadcast(0, rt.value(lock)).get();
    CHECK(found == 0 ? winner == me + 1 : found == winner, "found %lld, the winner is %lld", static_cast<long long>(found),
          static_cast<long long>(winner));
    const std::string bad_rank = error_of([&] { (void)rt.fetch_add(n, c, 1); });
    CHECK(bad_rank.find("fetch_add: rank=" + std::to_string(n) + " is out of range") != std::string::npos, "message: %s", bad_rank.c_str());
    const std::string bad_counter = error_of([&] { (void)rt.fetch_add(0, ferry::amt::Counter{99}, 1); });
    CHECK(bad_counter.find("fetch_add: counter 99 was not made here") != std::string::npos, "message: %s", bad_counter.c_str());
    const std::string bad_root = error_of([&] { (void)rt.broadcast(n, 1); });
    CHECK(bad_root.find("broadcast: root=" + std::to_string(n)) != std::string::npos, "message: %s", bad_root.c_str());
  }

  // Bad input: clear errors, nothing crashes.
  try {
    rt.async(n, add, 1, 2);
    CHECK(false, "async to rank %d did not throw", n);
  } catch (const ferry::Error& e) {
    CHECK(std::string(e.what()).find("rank=" + std::to_string(n)) != std::string::npos, "message: %s", e.what());
  }
  const std::string again = error_of([&] { rt.action("add", [](int a, int b) { return a - b; }); });
  CHECK(again.find("action 'add' is already registered") != std::string::npos, "message: %s", again.c_str());
  // Two names whose 64-bit FNV-1a hashes (the action ids) are equal: 0x8f2370314d6d4990.
  CHECK(ferry::amt::detail::hash_name("8WfLGe3aPLL") == ferry::amt::detail::hash_name("YCJrBq4Je4I"), "the pair collides");
  rt.action("8WfLGe3aPLL", [](int) {});
  const std::string same_id = error_of([&] { rt.action("YCJrBq4Je4I", [](int) {}); });
  CHECK(same_id.find("action 'YCJrBq4Je4I' has the same id as action '8WfLGe3aPLL'; rename one") != std::string::npos,
        "message: %s", same_id.c_str());
  if (me == 0 && n > 1) {
    ferry::amt::Action<void, int> only{ferry::amt::detail::hash_name("only_on_zero"), "only_on_zero"};
    rt.async(1, only, 7);  // rank 1 never registers it: reported there at finalize
  }

  // Every wait above helped: the runtime counted its progress calls.
  CHECK(rt.progress_calls() > 0, "progress_calls() = %llu", static_cast<unsigned long long>(rt.progress_calls()));

  // Termination with work in flight: start cascades and finalize at once.
  const int depth = 9;
  rt.async(me, spread, depth);
  rt.finalize();

  std::vector<long> runs(static_cast<std::size_t>(n), 0);
  for (int root = 0; root < n; ++root) simulate(root, depth, n, runs);
  CHECK(spread_runs.load() == runs[static_cast<std::size_t>(me)], "spread ran %ld times here, expected %ld",
        spread_runs.load(), runs[static_cast<std::size_t>(me)]);
  const std::uint64_t expected_errors = (me == 1) ? 1 : 0;
  CHECK(rt.errors() == expected_errors, "errors() = %llu, expected %llu", static_cast<unsigned long long>(rt.errors()),
        static_cast<unsigned long long>(expected_errors));
  if (failures == 0) {
    std::printf("rank %d (%s, %d workers): all AMT checks passed; %ld cascade tasks\n", me, rt.parcelport().c_str(),
                rt.threads(), spread_runs.load());
  }
  return failures == 0 ? 0 : 1;
}
