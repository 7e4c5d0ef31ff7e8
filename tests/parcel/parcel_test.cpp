// Random parcels through a parcelport, from several worker threads per rank:
// every parcel is delivered exactly once and intact, and on_sent runs exactly once per parcel.
//   ferryrun -n 2 ferry-parcel-test --parcelport ferry [--iovec]
//   mpiexec.hydra -n 4 ferry-parcel-test --parcelport mpi_a
// The MPI baselines are registered unless --no-mpi-registration (which checks the error a
// program gets when it asks for one without registering them).
// Exit 0 on success; every failure is printed with the rank.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/cpu_relax.hpp"
#include "ferry/error.hpp"
#include "ferry/parcel.hpp"
#ifdef FERRY_HAVE_PARCEL_MPI
#include "ferry/parcel_mpi.hpp"
#endif

using namespace ferry::parcel;

namespace {

// A wait's background_work call yields the core after 32 in a row that found nothing, so that
// a job with more ranks than cores hands the core to the peer it waits for.
using Idle = ferry::detail::IdleBackoff;

constexpr std::uint32_t kData = 0xDA7A, kCount = 0xC0C0;

struct Stamp {
  std::uint32_t magic;
  std::uint32_t src;
  std::uint32_t thread;
  std::uint32_t seq;
  std::uint64_t count;  // kCount parcels: how many data parcels the sender sent here
  std::uint64_t nzc_sum;
  std::uint64_t zc_sum[4];
};

std::uint64_t sum(const std::byte* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<std::uint8_t>(p[i])) * 1099511628211ull;
  return h;
}

class Checker final : public Upcalls {
 public:
  std::vector<Chunk> allocate_zc_chunks(int, const Chunk& nzc, const std::vector<std::size_t>& sizes) override {
    if (nzc.size < sizeof(Stamp)) errors++;
    std::vector<Chunk> out;
    for (std::size_t s : sizes) out.push_back({static_cast<std::byte*>(std::malloc(s ? s : 1)), s});
    return out;
  }
  void handle_parcel(int source, Parcel&& p) override {
    Stamp st{};
    if (p.nzc.size < sizeof st) {
      errors++;
      return;
    }
    std::memcpy(&st, p.nzc.data, sizeof st);
    bool ok = static_cast<int>(st.src) == source && (st.magic == kData || st.magic == kCount);
    if (st.magic == kData) {
      ok = ok && p.zc.size() <= 4 && st.nzc_sum == sum(p.nzc.data + sizeof st, p.nzc.size - sizeof st);
      for (std::size_t i = 0; ok && i < p.zc.size(); ++i) ok = st.zc_sum[i] == sum(p.zc[i].data, p.zc[i].size);
      std::lock_guard<std::mutex> g(mutex);
      if (!seen.insert({st.src, st.thread, st.seq}).second) duplicates++;
      data_received++;
    } else if (st.magic == kCount) {
      expected += static_cast<long>(st.count);
      counts_received++;
    }
    if (!ok) {
      if (errors.fetch_add(1) < 3) {
        std::fprintf(stderr, "corrupt parcel from %d: magic %x src %u nzc %zu zc %zu (first zc %zu)\n", source, st.magic,
                     st.src, p.nzc.size, p.zc.size(), p.zc.empty() ? 0 : p.zc[0].size);
      }
    }
    if (p.zc_storage.empty()) {
      for (auto& c : p.zc) std::free(c.data);
    }
  }
  std::mutex mutex;
  std::set<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>> seen;
  std::atomic<long> data_received{0}, expected{0}, counts_received{0}, errors{0}, duplicates{0};
};

}  // namespace

int main(int argc, char** argv) {
  ParcelportOptions opt;
  opt.kind = std::getenv("FERRY_PARCELPORT") ? std::getenv("FERRY_PARCELPORT") : "ferry";
  int threads = 4, per_thread = 2000;
  bool register_mpi = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--parcelport" && i + 1 < argc) opt.kind = argv[++i];
    else if (a == "--iovec") opt.iovec = true;
    else if (a == "--no-mpi-registration") register_mpi = false;
    else if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--parcels" && i + 1 < argc) per_thread = std::atoi(argv[++i]);
    else if (a == "--devices" && i + 1 < argc) opt.devices = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "parcel_test: unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
#ifdef FERRY_HAVE_PARCEL_MPI
  if (register_mpi) register_mpi_parcelports();
#else
  (void)register_mpi;
#endif
  Checker checker;
  std::unique_ptr<Parcelport> t;
  try {
    t = make_parcelport(opt, checker);
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  const int me = t->rank(), n = t->size();
  int failures = 0;
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) {
      std::fprintf(stderr, "rank %d (%s): FAILED: %s\n", me, t->name().c_str(), what.c_str());
      ++failures;
    }
  };
  // Bad input: a destination that does not exist, and a header too large for its chunk table.
  {
    std::byte b{};
    auto error_of = [&](int dest, std::size_t chunks) -> std::string {
      Parcel p;
      p.nzc = {&b, 1};
      p.zc.assign(chunks, Chunk{&b, 1});
      try {
        t->send(dest, std::move(p), [] {});
      } catch (const ferry::Error& e) {
        return e.what();
      }
      return "no error";
    };
    const std::string bad_dest = error_of(n, 0);
    check(bad_dest.find(std::to_string(n)) != std::string::npos && bad_dest.find("destination") != std::string::npos,
          "send to rank " + std::to_string(n) + ": " + bad_dest);
    const std::string too_big = error_of(0, 5000);
    check(too_big.find("5000") != std::string::npos && too_big.find("header") != std::string::npos,
          "5000 zero-copy chunks: " + too_big);
    if (t->name() == "ferry(iovec)") {
      // 300 sizes fit the header, but not beside 301 rendezvous descriptors in one packet.
      const std::string no_room = error_of(0, 300);
      check(no_room.find("300 zero-copy chunks need a") != std::string::npos, "300 zero-copy chunks, iovec: " + no_room);
    }
    // A chunk with a size but no data is refused before a byte of it is read.
    std::byte five[5]{};
    auto null_chunk = [&](bool nzc) -> std::string {
      Parcel p;
      p.nzc = {nzc ? nullptr : five, 5};
      if (!nzc) p.zc = {Chunk{&b, 1}, Chunk{nullptr, 7}};
      try {
        t->send(0, std::move(p), [] {});
      } catch (const ferry::Error& e) {
        return e.what();
      }
      return "no error";
    };
    const std::string null_nzc = null_chunk(true), null_zc = null_chunk(false);
    check(null_nzc.find("nzc chunk has size 5 but no data") != std::string::npos, "nzc {null, 5}: " + null_nzc);
    check(null_zc.find("zc chunk 1 has size 7 but no data") != std::string::npos, "zc[1] {null, 7}: " + null_zc);
  }
  std::vector<std::atomic<long>> sent_to(static_cast<std::size_t>(n));
  std::vector<std::atomic<int>> on_sent(static_cast<std::size_t>(threads * per_thread));
  std::atomic<int> counts_sent_by{0};
  std::atomic<int> count_on_sent{0};
  std::atomic<bool> all_sent{false};

  auto worker = [&](int w) {
    set_thread_index(w);
    std::mt19937_64 rng(static_cast<std::uint64_t>(me) * 1000003u + static_cast<std::uint64_t>(w));
    std::vector<std::vector<std::byte>> keep;  // each parcel's chunks live until the end
    keep.reserve(static_cast<std::size_t>(per_thread) * 5);
    for (int i = 0; i < per_thread; ++i) {
      const int dest = static_cast<int>(rng() % static_cast<unsigned>(n));
      const std::size_t nzc_size = sizeof(Stamp) + (rng() % 8 == 0 ? rng() % 12000 : rng() % 200);
      const int nzc_count = static_cast<int>(rng() % 5);
      keep.emplace_back(nzc_size);
      std::vector<std::byte>& nzc = keep.back();
      for (std::size_t b = sizeof(Stamp); b < nzc_size; ++b) nzc[b] = static_cast<std::byte>(rng());
      Stamp st{kData, static_cast<std::uint32_t>(me), static_cast<std::uint32_t>(w), static_cast<std::uint32_t>(i), 0,
               sum(nzc.data() + sizeof st, nzc_size - sizeof st), {}};
      Parcel p;
      for (int z = 0; z < nzc_count; ++z) {
        const std::size_t zs = rng() % 4 == 0 ? 0 : rng() % 65536;
        keep.emplace_back(zs);
        for (auto& b : keep.back()) b = static_cast<std::byte>(rng());
        st.zc_sum[z] = sum(keep.back().data(), zs);
        p.zc.push_back({keep.back().data(), zs});
      }
      std::memcpy(nzc.data(), &st, sizeof st);
      p.nzc = {nzc.data(), nzc_size};
      std::atomic<int>* flag = &on_sent[static_cast<std::size_t>(w * per_thread + i)];
      t->send(dest, std::move(p), [flag] { flag->fetch_add(1); });
      sent_to[static_cast<std::size_t>(dest)].fetch_add(1);
      t->background_work();
    }
    // The last worker to finish tells every rank how many parcels it will get from here.
    if (counts_sent_by.fetch_add(1) + 1 == threads) {
      static std::vector<Stamp> stamps;
      stamps.resize(static_cast<std::size_t>(n));
      for (int d = 0; d < n; ++d) {
        stamps[static_cast<std::size_t>(d)] = Stamp{kCount, static_cast<std::uint32_t>(me), 0, 0,
                                                    static_cast<std::uint64_t>(sent_to[static_cast<std::size_t>(d)].load()), 0, {}};
        Parcel p;
        p.nzc = {reinterpret_cast<std::byte*>(&stamps[static_cast<std::size_t>(d)]), sizeof(Stamp)};
        t->send(d, std::move(p), [&] { count_on_sent.fetch_add(1); });
      }
      all_sent = true;
    }
    // This worker's chunks (in `keep`) must outlive their sends: wait for its own on_sent too.
    auto mine_sent = [&] {
      for (int i = 0; i < per_thread; ++i) {
        if (on_sent[static_cast<std::size_t>(w * per_thread + i)].load() == 0) return false;
      }
      return true;
    };
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(200);
    Idle idle;
    while (!(all_sent && checker.counts_received.load() == n && checker.data_received.load() >= checker.expected.load() &&
             count_on_sent.load() == n && mine_sent())) {
      idle(t->background_work());
      if (std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "rank %d: timeout: %ld of %ld parcels, %ld of %d counts\n", me,
                     checker.data_received.load(), checker.expected.load(), checker.counts_received.load(), n);
        std::_Exit(3);
      }
    }
  };
  std::vector<std::thread> pool;
  for (int w = 0; w < threads; ++w) pool.emplace_back(worker, w);
  for (auto& th : pool) th.join();
  // Every local on_sent must have run before the count check.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  auto all_on_sent = [&] {
    for (auto& f : on_sent) if (f.load() == 0) return false;
    return true;
  };
  Idle idle;
  while (!all_on_sent() && std::chrono::steady_clock::now() < deadline) idle(t->background_work());
  t->barrier();

  check(checker.errors.load() == 0, std::to_string(checker.errors.load()) + " corrupt parcels");
  check(checker.duplicates.load() == 0, std::to_string(checker.duplicates.load()) + " duplicates");
  check(checker.data_received.load() == checker.expected.load(),
        "received " + std::to_string(checker.data_received.load()) + " of " + std::to_string(checker.expected.load()));
  long bad_on_sent = 0;
  for (auto& f : on_sent) bad_on_sent += f.load() != 1;
  check(bad_on_sent == 0, std::to_string(bad_on_sent) + " parcels whose on_sent did not run exactly once");
  check(t->parcels_sent() == static_cast<std::uint64_t>(threads * per_thread + n), "parcels_sent() is wrong");
  if (failures == 0) {
    std::printf("rank %d (%s): %d threads, %d parcels sent, %ld received, all intact, on_sent once each\n", me,
                t->name().c_str(), threads, threads * per_thread, checker.data_received.load());
  }
  t.reset();
  return failures == 0 ? 0 : 1;
}
