// coll_test.cpp — teams and collectives against a serial reference: every collective, every
// type and operation, sizes from 0 bytes to 16 MiB, teams of every size up to the job's (the
// first k ranks), split and host teams, many collectives in flight from several threads on
// several teams, and the argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include "mp_common.hpp"

namespace mp {
namespace {

using ferry::DataType;
using ferry::ReduceOp;
using ferry::Team;

ferry::Team& world() {
  static Team w = Team::world(rt());
  return w;
}

// Waits for a post's end: done, or posted and then signalled. Returns the completion's error.
int finish(Team& team, ferry::Status st, ferry::Synchronizer& sync) {
  if (st.is_done()) return 0;
  if (st.is_failed()) return ferry::peer_failed_error;
  EXPECT_TRUE(st.is_posted());
  EXPECT_TRUE(wait_until(rt().device(0), [&] { return sync.test(); })) << "a collective on a team of " << team.size() << " never ended";
  if (!sync.test()) return -1;
  EXPECT_EQ(sync.results()[0].op, ferry::OpKind::coll);
  return sync.results()[0].error;
}

// The teams every test runs on: the first k ranks for every k (this rank in those it is in).
std::vector<Team>& prefix_teams() {
  static std::vector<Team> teams = [] {
    std::vector<Team> t;
    for (int k = 1; k <= rt().size(); ++k) {
      if (rt().rank() >= k) continue;
      std::vector<int> first(static_cast<std::size_t>(k));
      for (int i = 0; i < k; ++i) first[static_cast<std::size_t>(i)] = i;
      t.push_back(world().subset(first));
    }
    return t;
  }();
  return teams;
}

// Element j of member i's contribution: small values, so sums and products of floats are exact;
// signed types go negative.
template <class T>
T value(int i, std::size_t j) {
  const long v = static_cast<long>((static_cast<std::size_t>(i) * 7 + j * 3) % 5);
  if constexpr (std::is_signed_v<T> || std::is_floating_point_v<T>) return static_cast<T>(v - 1);
  return static_cast<T>(v);
}

template <class T>
T apply(ReduceOp op, T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    switch (op) {
      case ReduceOp::sum: return static_cast<T>(static_cast<std::uint64_t>(static_cast<U>(a)) + static_cast<U>(b));
      case ReduceOp::prod: return static_cast<T>(static_cast<std::uint64_t>(static_cast<U>(a)) * static_cast<U>(b));
      case ReduceOp::band: return static_cast<T>(a & b);
      case ReduceOp::bor: return static_cast<T>(a | b);
      case ReduceOp::bxor: return static_cast<T>(a ^ b);
      default: break;
    }
  } else {
    if (op == ReduceOp::sum) return a + b;
    if (op == ReduceOp::prod) return a * b;
  }
  switch (op) {
    case ReduceOp::min: return a < b ? a : b;
    case ReduceOp::max: return a < b ? b : a;
    case ReduceOp::land: return static_cast<T>(a != 0 && b != 0);
    case ReduceOp::lor: return static_cast<T>(a != 0 || b != 0);
    default: return a;
  }
}

// The reduction of members [0, upto) at element j.
template <class T>
T reference(ReduceOp op, int upto, std::size_t j) {
  T acc = value<T>(0, j);
  for (int i = 1; i < upto; ++i) acc = apply(op, acc, value<T>(i, j));
  return acc;
}

template <class T>
constexpr DataType type_of() {
  if constexpr (std::is_same_v<T, std::int8_t>) return DataType::i8;
  if constexpr (std::is_same_v<T, std::uint8_t>) return DataType::u8;
  if constexpr (std::is_same_v<T, std::int16_t>) return DataType::i16;
  if constexpr (std::is_same_v<T, std::uint16_t>) return DataType::u16;
  if constexpr (std::is_same_v<T, std::int32_t>) return DataType::i32;
  if constexpr (std::is_same_v<T, std::uint32_t>) return DataType::u32;
  if constexpr (std::is_same_v<T, std::int64_t>) return DataType::i64;
  if constexpr (std::is_same_v<T, std::uint64_t>) return DataType::u64;
  if constexpr (std::is_same_v<T, float>) return DataType::f32;
  return DataType::f64;
}

template <class T>
void allreduce_every_op(Team& team) {
  constexpr std::size_t count = 7;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::band, ReduceOp::bor,
                      ReduceOp::bxor, ReduceOp::land, ReduceOp::lor}) {
    if (std::is_floating_point_v<T> && (op == ReduceOp::band || op == ReduceOp::bor || op == ReduceOp::bxor)) continue;
    std::vector<T> send(count), recv(count);
    for (std::size_t j = 0; j < count; ++j) send[j] = value<T>(team.rank(), j);
    ferry::Synchronizer sync;
    ASSERT_EQ(finish(team, team.post_allreduce({.send = send.data(), .recv = recv.data(), .count = count, .type = type_of<T>(),
                                                .op = op, .local = &sync}),
                     sync),
              0);
    for (std::size_t j = 0; j < count; ++j) {
      ASSERT_EQ(recv[j], reference<T>(op, team.size(), j))
          << "type " << ferry::to_string(type_of<T>()) << " op " << ferry::to_string(op) << " element " << j << " team of "
          << team.size();
    }
  }
}

TEST(Coll, WorldTeamKnowsItsShape) {
  EXPECT_EQ(world().size(), rt().size());
  EXPECT_EQ(world().rank(), rt().rank());
  for (int i = 0; i < rt().size(); ++i) {
    EXPECT_EQ(world().world_rank(i), i);
    EXPECT_EQ(world().index_of(i), i);
  }
  EXPECT_EQ(world().index_of(rt().size()), -1);
  rt().barrier();
}

TEST(Coll, BarrierOnEveryTeam) {
  for (Team& t : prefix_teams()) {
    for (int rep = 0; rep < 3; ++rep) {
      ferry::Synchronizer sync;
      ASSERT_EQ(finish(t, t.post_barrier({.local = &sync}), sync), 0);
    }
  }
  rt().barrier();
}

TEST(Coll, AllreduceEveryTypeAndOperation) {
  for (Team& t : prefix_teams()) {
    allreduce_every_op<std::int8_t>(t);
    allreduce_every_op<std::uint8_t>(t);
    allreduce_every_op<std::int16_t>(t);
    allreduce_every_op<std::uint16_t>(t);
    allreduce_every_op<std::int32_t>(t);
    allreduce_every_op<std::uint32_t>(t);
    allreduce_every_op<std::int64_t>(t);
    allreduce_every_op<std::uint64_t>(t);
    allreduce_every_op<float>(t);
    allreduce_every_op<double>(t);
  }
  rt().barrier();
}

// Sizes in elements of i64: 0, 1, 7, 4 KiB, 1 MiB (and 16 MiB on the world).
std::vector<std::size_t> counts_for(const Team& t) {
  std::vector<std::size_t> c{0, 1, 7, 512, 131072};
  if (t.size() == rt().size()) c.push_back(2097152);
  return c;
}

TEST(Coll, AllreduceReduceAndScanEverySize) {
  for (Team& t : prefix_teams()) {
    for (std::size_t count : counts_for(t)) {
      std::vector<std::int64_t> send(count), recv(count, -7);
      for (std::size_t j = 0; j < count; ++j) send[j] = value<std::int64_t>(t.rank(), j);
      ferry::Synchronizer a;
      ASSERT_EQ(finish(t, t.post_allreduce({.send = send.data(), .recv = recv.data(), .count = count, .type = DataType::i64,
                                            .op = ReduceOp::sum, .local = &a}),
                       a),
                0);
      for (std::size_t j = 0; j < count; ++j) ASSERT_EQ(recv[j], reference<std::int64_t>(ReduceOp::sum, t.size(), j)) << j;
      for (int root = 0; root < t.size(); root += std::max(1, t.size() / 3)) {
        std::vector<std::int64_t> out(count, -7);
        ferry::Synchronizer r;
        ASSERT_EQ(finish(t, t.post_reduce({.send = send.data(), .recv = out.data(), .count = count, .type = DataType::i64,
                                           .op = ReduceOp::max, .root = root, .local = &r}),
                         r),
                  0);
        if (t.rank() == root) {
          for (std::size_t j = 0; j < count; ++j) ASSERT_EQ(out[j], reference<std::int64_t>(ReduceOp::max, t.size(), j)) << j;
        }
      }
      std::vector<std::int64_t> scan(count, -7);
      ferry::Synchronizer s;
      ASSERT_EQ(finish(t, t.post_scan({.send = send.data(), .recv = scan.data(), .count = count, .type = DataType::i64,
                                       .op = ReduceOp::sum, .local = &s}),
                       s),
                0);
      for (std::size_t j = 0; j < count; ++j) ASSERT_EQ(scan[j], reference<std::int64_t>(ReduceOp::sum, t.rank() + 1, j)) << j;
    }
  }
  rt().barrier();
}

TEST(Coll, AllreduceInPlaceAndUserReduction) {
  Team& t = world();
  std::vector<double> v(9);
  for (std::size_t j = 0; j < v.size(); ++j) v[j] = value<double>(t.rank(), j);
  // A user reduction: element-wise sum of squares' roots would not be exact; use a*b+a+b
  // over small integers, associative and commutative: (1+a)(1+b)-1.
  const ferry::ReduceFn fn = [](void* inout, const void* in, std::size_t count, void* user) {
    auto* a = static_cast<double*>(inout);
    const auto* b = static_cast<const double*>(in);
    for (std::size_t i = 0; i < count; ++i) a[i] = a[i] * b[i] + a[i] + b[i];
    ++*static_cast<int*>(user);
  };
  int calls = 0;
  ferry::Synchronizer sync;
  ASSERT_EQ(finish(t, t.post_allreduce({.send = v.data(), .recv = v.data(), .count = v.size(), .type = DataType::f64,
                                        .op = ReduceOp::user, .fn = fn, .fn_arg = &calls, .local = &sync}),
                   sync),
            0);
  for (std::size_t j = 0; j < v.size(); ++j) {
    double expect = 1;
    for (int i = 0; i < t.size(); ++i) expect *= 1 + value<double>(i, j);
    ASSERT_EQ(v[j], expect - 1) << j;
  }
  // Some member ran the callback (not each: an allreduce of 3 has one that only hands its data on).
  std::int64_t mine = calls, all = 0;
  t.allreduce(&mine, &all, 1, DataType::i64, ReduceOp::sum);
  if (t.size() > 1) {
    EXPECT_GT(all, 0);
  }
  rt().barrier();
}

TEST(Coll, ReduceScatterEverySize) {
  for (Team& t : prefix_teams()) {
    for (std::size_t block : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4096}}) {
      const std::size_t n = static_cast<std::size_t>(t.size());
      std::vector<std::uint32_t> send(block * n), recv(block, 99);
      for (std::size_t j = 0; j < send.size(); ++j) send[j] = value<std::uint32_t>(t.rank(), j);
      ferry::Synchronizer sync;
      ASSERT_EQ(finish(t, t.post_reduce_scatter({.send = send.data(), .recv = recv.data(), .count = block,
                                                 .type = DataType::u32, .op = ReduceOp::sum, .local = &sync}),
                       sync),
                0);
      for (std::size_t j = 0; j < block; ++j) {
        ASSERT_EQ(recv[j], reference<std::uint32_t>(ReduceOp::sum, t.size(), static_cast<std::size_t>(t.rank()) * block + j));
      }
    }
  }
  rt().barrier();
}

std::vector<std::size_t> byte_sizes(const Team& t) {
  std::vector<std::size_t> s{0, 1, 7, 4096, 1 << 20};
  if (t.size() == rt().size()) s.push_back(16 << 20);
  return s;
}

TEST(Coll, BroadcastFromEveryRoot) {
  for (Team& t : prefix_teams()) {
    for (std::size_t size : byte_sizes(t)) {
      for (int root = 0; root < t.size(); ++root) {
        if (size >= (1 << 20) && root > 1) break;
        std::vector<unsigned char> buf(size);
        if (t.rank() == root) {
          fill(buf.data(), size, root);
        } else {
          if (size != 0) std::memset(buf.data(), 0xEE, size);
        }
        ferry::Synchronizer sync;
        ASSERT_EQ(finish(t, t.post_broadcast({.buffer = buf.data(), .size = size, .root = root, .local = &sync}), sync), 0);
        std::vector<unsigned char> want(size);
        fill(want.data(), size, root);
        ASSERT_TRUE(want == buf) << size << " bytes from root " << root << " on a team of " << t.size();
      }
    }
  }
  rt().barrier();
}

TEST(Coll, GatherAllgatherAndAlltoall) {
  for (Team& t : prefix_teams()) {
    const auto n = static_cast<std::size_t>(t.size());
    for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4096}, std::size_t{1} << 20}) {
      if (size >= (1u << 20) && n > 4) continue;
      std::vector<unsigned char> mine(size), all(size * n, 0xEE), want(size * n);
      fill(mine.data(), size, t.rank());
      for (std::size_t i = 0; i < n; ++i) fill(want.data() + i * size, size, static_cast<int>(i));
      ferry::Synchronizer g;
      ASSERT_EQ(finish(t, t.post_allgather({.send = mine.data(), .size = size, .recv = all.data(), .local = &g}), g), 0);
      ASSERT_TRUE(all == want) << "allgather of " << size << " bytes on a team of " << n;
      const int root = static_cast<int>(n) - 1;
      std::vector<unsigned char> at_root(size * n, 0xEE);
      ferry::Synchronizer r;
      ASSERT_EQ(finish(t, t.post_gather({.send = mine.data(), .size = size, .recv = at_root.data(), .root = root, .local = &r}), r),
                0);
      if (t.rank() == root) {
        ASSERT_TRUE(at_root == want) << "gather of " << size << " bytes";
      }
      // Alltoall: block j from member i is the pattern of (i * n + j).
      std::vector<unsigned char> out(size * n), in(size * n, 0xEE), expect(size * n);
      for (std::size_t j = 0; j < n; ++j) {
        fill(out.data() + j * size, size, static_cast<int>(static_cast<std::size_t>(t.rank()) * n + j));
        fill(expect.data() + j * size, size, static_cast<int>(j * n + static_cast<std::size_t>(t.rank())));
      }
      ferry::Synchronizer a;
      ASSERT_EQ(finish(t, t.post_alltoall({.send = out.data(), .recv = in.data(), .size = size, .local = &a}), a), 0);
      ASSERT_TRUE(in == expect) << "alltoall of " << size << " bytes per member on a team of " << n;
    }
  }
  rt().barrier();
}

TEST(Coll, VectorFormsWithSizesThatDifferPerMember) {
  Team& t = world();
  const auto n = static_cast<std::size_t>(t.size());
  const auto me = static_cast<std::size_t>(t.rank());
  // Member i contributes 3*i + 1 bytes; to member j, member i sends i + 2*j bytes.
  std::vector<std::size_t> counts(n), offsets(n);
  std::size_t total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    counts[i] = 3 * i + 1;
    offsets[i] = total;
    total += counts[i] + 5;  // gaps between blocks stay untouched
  }
  std::vector<unsigned char> mine(counts[me]), all(total, 0xEE), want(total, 0xEE);
  fill(mine.data(), mine.size(), t.rank());
  for (std::size_t i = 0; i < n; ++i) fill(want.data() + offsets[i], counts[i], static_cast<int>(i));
  ferry::Synchronizer g;
  ASSERT_EQ(finish(t, t.post_allgatherv({.send = mine.data(), .recv = all.data(), .counts = counts, .offsets = offsets, .local = &g}), g),
            0);
  ASSERT_TRUE(all == want);

  std::vector<std::size_t> sc(n), so(n), rc(n), ro(n);
  std::size_t st = 0, rt_total = 0;
  for (std::size_t j = 0; j < n; ++j) {
    sc[j] = me + 2 * j;
    so[j] = st;
    st += sc[j];
    rc[j] = j + 2 * me;
    ro[j] = rt_total;
    rt_total += rc[j];
  }
  std::vector<unsigned char> out(st), in(rt_total, 0xEE), expect(rt_total);
  for (std::size_t j = 0; j < n; ++j) {
    fill(out.data() + so[j], sc[j], static_cast<int>(me * n + j));
    fill(expect.data() + ro[j], rc[j], static_cast<int>(j * n + me));
  }
  ferry::Synchronizer a;
  ASSERT_EQ(finish(t, t.post_alltoallv({.send = out.data(), .send_counts = sc, .send_offsets = so, .recv = in.data(),
                                        .recv_counts = rc, .recv_offsets = ro, .local = &a}),
                   a),
            0);
  ASSERT_TRUE(in == expect);
  rt().barrier();
}

TEST(Coll, SplitByColourAndKeyAndTheHostTeam) {
  Team& w = world();
  // Two colours by parity, ordered by descending job rank.
  Team half = w.split(w.rank() % 2, -w.rank());
  ASSERT_TRUE(half);
  const int expect_size = (rt().size() + (w.rank() % 2 == 0 ? 1 : 0)) / 2;
  EXPECT_EQ(half.size(), expect_size);
  for (int i = 0; i + 1 < half.size(); ++i) EXPECT_GT(half.world_rank(i), half.world_rank(i + 1));
  std::int64_t one = 1, n = 0;
  half.allreduce(&one, &n, 1, DataType::i64, ReduceOp::sum);
  EXPECT_EQ(n, half.size());
  // A negative colour makes no team.
  Team none = w.split(w.rank() == 0 ? -1 : 0, 0);
  EXPECT_EQ(static_cast<bool>(none), w.rank() != 0);
  if (none) {
    EXPECT_EQ(none.size(), rt().size() - 1);
  }
  Team host = w.host();
  ASSERT_TRUE(host);
  EXPECT_GE(host.size(), 1);
  EXPECT_EQ(host.world_rank(host.rank()), rt().rank());
  std::int64_t members = 0;
  host.allreduce(&one, &members, 1, DataType::i64, ReduceOp::sum);
  EXPECT_EQ(members, host.size());
  host.barrier();
  rt().barrier();
}

TEST(Coll, ManyInFlightFromSeveralThreadsOnSeveralTeams) {
  MP_SKIP_IF_THREADS_SHARE_A_DEVICE();
  Team& w = world();
  constexpr int kThreads = 3;
  constexpr int kInFlight = 16;
  std::vector<Team> teams;
  for (int i = 0; i < kThreads; ++i) teams.push_back(w.split(0, i == 1 ? -w.rank() : w.rank()));
  std::vector<std::thread> threads;
  std::vector<int> bad(kThreads, 0);
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      Team& t = teams[static_cast<std::size_t>(th)];
      for (int rep = 0; rep < 5; ++rep) {
        std::vector<std::int64_t> send(kInFlight), recv(kInFlight, -1);
        ferry::Synchronizer sync(kInFlight);
        int done = 0;
        for (int k = 0; k < kInFlight; ++k) {
          send[static_cast<std::size_t>(k)] = t.rank() * 100 + k + th;
          const ferry::Status st = t.post_allreduce({.send = &send[static_cast<std::size_t>(k)], .recv = &recv[static_cast<std::size_t>(k)],
                                                     .count = 1, .type = DataType::i64, .op = ReduceOp::sum, .local = &sync});
          if (st.is_done()) ++done;
          if (st.is_failed()) ++bad[static_cast<std::size_t>(th)];
        }
        if (!wait_until(rt().device(0), [&] { return sync.count() + static_cast<std::size_t>(done) >= kInFlight; })) {
          ++bad[static_cast<std::size_t>(th)];
          return;
        }
        const std::int64_t n = t.size();
        for (int k = 0; k < kInFlight; ++k) {
          if (recv[static_cast<std::size_t>(k)] != 100 * n * (n - 1) / 2 + n * (k + th)) ++bad[static_cast<std::size_t>(th)];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int th = 0; th < kThreads; ++th) EXPECT_EQ(bad[static_cast<std::size_t>(th)], 0) << "thread " << th;
  rt().barrier();
}

// With several devices (FERRY_DEVICES), the whole job on each, collectives on all at once.
TEST(Coll, EveryDeviceHasItsWorldTeam) {
  const int devices = rt().device_count();
  std::vector<Team> worlds;
  for (int d = 0; d < devices; ++d) worlds.push_back(Team::world(rt(), d));
  std::vector<std::int64_t> sums(static_cast<std::size_t>(devices), 0);
  std::vector<std::int64_t> mine(static_cast<std::size_t>(devices));
  std::vector<std::unique_ptr<ferry::Synchronizer>> syncs;
  for (int d = 0; d < devices; ++d) {
    mine[static_cast<std::size_t>(d)] = rt().rank() + 10 * d;
    syncs.push_back(std::make_unique<ferry::Synchronizer>());
    const ferry::Status st = worlds[static_cast<std::size_t>(d)].post_allreduce(
        {.send = &mine[static_cast<std::size_t>(d)], .recv = &sums[static_cast<std::size_t>(d)], .count = 1,
         .type = DataType::i64, .op = ReduceOp::sum, .local = syncs.back().get()});
    ASSERT_FALSE(st.is_failed());
    if (st.is_done()) syncs.back()->signal(ferry::Completion{});
  }
  for (int d = 0; d < devices; ++d) {
    ferry::Synchronizer& s = *syncs[static_cast<std::size_t>(d)];
    ASSERT_TRUE(wait_until(rt().device(d), [&] { return s.test(); })) << "device " << d;
    const std::int64_t n = rt().size();
    EXPECT_EQ(sums[static_cast<std::size_t>(d)], n * (n - 1) / 2 + 10 * d * n) << "device " << d;
  }
  EXPECT_THROW((void)Team::world(rt(), devices), ferry::Error);
  rt().barrier();
}

// Past 2 GiB (FERRY_TEST_LARGE, the mp_*_beyond_2GiB jobs): a broadcast of a pattern and an
// allreduce (u8 sum) of 2 GiB + 4 KiB + 7 bytes on the world team.
TEST(Large, BroadcastAndAllreduceBeyondTwoGiB) {
  if (std::getenv("FERRY_TEST_LARGE") == nullptr) GTEST_SKIP() << "set FERRY_TEST_LARGE=1 to move > 2 GiB";
  Team& w = world();
  const std::size_t size = (std::size_t{1} << 31) + 4096 + 7;
  {
    std::vector<unsigned char> buf(size);
    if (w.rank() == 0) fill(buf.data(), size, 0);
    ferry::Synchronizer sync;
    ASSERT_EQ(finish(w, w.post_broadcast({.buffer = buf.data(), .size = size, .root = 0, .local = &sync}), sync), 0);
    EXPECT_EQ(first_mismatch(buf.data(), size, 0, size), -1) << "the broadcast's data";
  }
  {
    std::vector<unsigned char> send(size, static_cast<unsigned char>(w.rank() + 1)), recv(size);
    ferry::Synchronizer sync;
    ASSERT_EQ(finish(w, w.post_allreduce({.send = send.data(), .recv = recv.data(), .count = size, .type = DataType::u8,
                                          .op = ReduceOp::sum, .local = &sync}),
                     sync),
              0);
    const auto want = static_cast<unsigned char>(w.size() * (w.size() + 1) / 2);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < size; ++i) bad += recv[i] != want;
    EXPECT_EQ(bad, 0u) << "bytes of the allreduce's result differ from " << int(want);
  }
  rt().barrier();
}

TEST(Coll, BadArgumentsAreNamed) {
  Team& w = world();
  ferry::Synchronizer sync;
  std::int64_t x = 0;
  const auto message = [](auto&& call) {
    try {
      call();
    } catch (const ferry::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([&] { (void)w.post_broadcast({.buffer = &x, .size = 8, .root = w.size(), .local = &sync}); }),
            "ferry: post_broadcast: root=" + std::to_string(w.size()) + " is out of range; the team has " + std::to_string(w.size()) +
                " members");
  EXPECT_EQ(message([&] { (void)w.post_barrier({}); }), "ferry: post_barrier: local=null; a collective signals its end there");
  EXPECT_EQ(message([&] {
              (void)w.post_allreduce({.send = &x, .recv = &x, .count = 1, .type = DataType::f64, .op = ReduceOp::bxor, .local = &sync});
            }),
            "ferry: post_allreduce: op=bxor is not defined for type=f64");
  EXPECT_EQ(message([&] { (void)w.post_allreduce({.send = nullptr, .recv = &x, .count = 1, .local = &sync}); }),
            "ferry: post_allreduce: send=null with 8 bytes");
  EXPECT_EQ(message([&] { (void)w.subset({0, 0}); }), "ferry: Team::subset: index=0 is listed twice");
  EXPECT_EQ(message([&] { (void)Team().post_barrier({.local = &sync}); }),
            "ferry: post_barrier: on an empty Team (a split with a negative colour makes none)");
  EXPECT_EQ(sync.count(), 0u);
  rt().barrier();
}

}  // namespace
}  // namespace mp
