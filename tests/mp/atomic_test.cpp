// atomic_test.cpp — remote atomics (Device::post_atomic): every operation and type against a
// serial reference, on a peer's memory and on this rank's own; every thread of every rank
// fetch-adding one counter beside its owner's own CPU atomics (the total and the set of
// fetched values exact); a compare-swap spin lock whose critical section is a read and a
// separate write (mutual exclusion, or updates are lost); a region deregistered under a peer;
// and the argument checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "mp_common.hpp"

namespace mp {
namespace {

using ferry::AtomicOp;
using ferry::DataType;
using ferry::RemoteKey;
using ferry::Team;

Team& team() {
  static Team w = Team::world(rt());
  return w;
}

// Every rank's key for its region, by rank.
std::vector<RemoteKey> exchange(const ferry::MemoryRegion& region) {
  const RemoteKey mine = region.remote_key();
  std::vector<RemoteKey> all(static_cast<std::size_t>(rt().size()));
  ferry::Synchronizer sync;
  const ferry::Status st = team().post_allgather({.send = &mine, .size = sizeof mine, .recv = all.data(), .local = &sync});
  if (st.is_posted()) {
    EXPECT_TRUE(wait_until(rt().device(0), [&] { return sync.test(); }));
  }
  return all;
}

// Memory for atomics: n zeroed 64-bit words, registered (the application's memory) or
// allocated by ferry (Device::allocate_memory: peers on this host map it and go direct).
struct Words {
  Words(std::size_t n, bool allocated)
      : storage(allocated ? 0 : n, 0),
        region(allocated ? rt().device(0).allocate_memory(n * 8) : rt().device(0).register_memory(storage.data(), n * 8)),
        data(static_cast<std::uint64_t*>(region.data())),
        keys(exchange(region)) {}
  std::vector<std::uint64_t> storage;
  ferry::MemoryRegion region;
  std::uint64_t* data;
  std::vector<RemoteKey> keys;
};

const char* kind(bool allocated) { return allocated ? "allocated" : "registered"; }

// Posts `a` (retrying), waits for its end; the completion's error (0 for done).
int run(ferry::AtomicArgs a) {
  ferry::Synchronizer sync;
  a.local = &sync;
  ferry::Device& dev = rt().device(0);
  const ferry::Status st = post_retry(dev, [&] { return dev.post_atomic(a); });
  if (st.is_done()) return 0;
  if (st.is_failed()) return ferry::peer_failed_error;
  EXPECT_TRUE(st.is_posted());
  EXPECT_TRUE(wait_until(dev, [&] { return sync.test(); })) << "an atomic on rank " << a.rank << " never ended";
  if (!sync.test()) return -1;
  const ferry::Completion& c = sync.results()[0];
  EXPECT_EQ(c.op, ferry::OpKind::atomic);
  EXPECT_EQ(c.rank, a.rank);
  EXPECT_EQ(c.size, ferry::size_of(a.type));
  return c.error;
}

// One operation on word `slot` of `owner`'s region, its fetched value (0-extended).
std::uint64_t op(const Words& w, int owner, std::size_t slot, AtomicOp o, DataType t, std::uint64_t operand,
                 std::uint64_t compare = 0, std::size_t byte = 0) {
  std::uint64_t result = 0xDEADBEEFDEADBEEFull;
  const int error = run({.rank = owner, .remote = w.keys[static_cast<std::size_t>(owner)], .offset = slot * 8 + byte, .op = o,
                         .type = t, .operand = operand, .compare = compare, .result = o == AtomicOp::add ? nullptr : &result});
  EXPECT_EQ(error, 0) << ferry::to_string(o) << " " << ferry::to_string(t);
  if (ferry::size_of(t) == 4) result &= 0xFFFFFFFFull;
  return result;
}

// The serial reference of one integer type of width W: each operation's fetched value and
// the location's value after.
template <class T>
void integer_sequence(const Words& w, int owner, std::size_t slot, DataType t) {
  using U = std::make_unsigned_t<T>;
  const auto bits = [](T v) { return static_cast<std::uint64_t>(static_cast<U>(v)); };
  U ref = static_cast<U>(op(w, owner, slot, AtomicOp::swap, t, bits(static_cast<T>(-5))));
  (void)ref;
  ref = static_cast<U>(static_cast<T>(-5));
  const auto expect = [&](AtomicOp o, T operand, U after, T compare = 0) {
    const std::uint64_t got = op(w, owner, slot, o, t, bits(operand), bits(compare));
    if (o != AtomicOp::add) {
      EXPECT_EQ(got, static_cast<std::uint64_t>(ref)) << ferry::to_string(o) << " " << ferry::to_string(t);
    }
    ref = after;
  };
  expect(AtomicOp::fetch_add, 12, static_cast<U>(ref + U(12)));                // -5 + 12 = 7
  expect(AtomicOp::add, -9, static_cast<U>(ref - U(9)));                         // -2
  expect(AtomicOp::fetch_add, 0, ref);
  expect(AtomicOp::compare_swap, 100, ref, 3);                                    // -2 != 3: no swap
  expect(AtomicOp::compare_swap, 100, U(100), static_cast<T>(ref));               // swapped
  expect(AtomicOp::fetch_or, 0x0F, static_cast<U>(ref | U(0x0F)));               // 111
  expect(AtomicOp::fetch_and, 0x3C, static_cast<U>(ref & U(0x3C)));              // 44
  expect(AtomicOp::fetch_xor, 0x55, static_cast<U>(ref ^ U(0x55)));              // 121
  const T big = std::numeric_limits<T>::max();
  expect(AtomicOp::swap, big, static_cast<U>(big));
  expect(AtomicOp::fetch_add, 1, static_cast<U>(static_cast<U>(big) + U(1)));   // wraps
  expect(AtomicOp::fetch_add, 0, ref);
}

// Every rank works on the word of its own rank in each target's region: the next rank's and
// its own (a post to this rank's memory is done at once).
TEST(Atomic, EveryOperationAndTypeAgainstAReference) {
  for (const bool allocated : {false, true}) {
  SCOPED_TRACE(kind(allocated));
  const int n = rt().size();
  const int me = rt().rank();
  Words w(static_cast<std::size_t>(n) * 8, allocated);
  rt().barrier();
  for (const int owner : {(me + 1) % n, me}) {
    const std::size_t base = static_cast<std::size_t>(me) * 8;
    integer_sequence<std::int64_t>(w, owner, base + 0, DataType::i64);
    integer_sequence<std::uint64_t>(w, owner, base + 1, DataType::u64);
    integer_sequence<std::int32_t>(w, owner, base + 2, DataType::i32);
    integer_sequence<std::uint32_t>(w, owner, base + 3, DataType::u32);
    // A 32-bit location in the upper half of a word leaves the lower half alone.
    op(w, owner, base + 4, AtomicOp::swap, DataType::u64, 0x1111111122222222ull);
    EXPECT_EQ(op(w, owner, base + 4, AtomicOp::fetch_add, DataType::u32, 1, 0, 4), 0x11111111u);
    EXPECT_EQ(op(w, owner, base + 4, AtomicOp::fetch_add, DataType::u64, 0), 0x1111111222222222ull);
    // Doubles: exact sums of halves and quarters.
    op(w, owner, base + 5, AtomicOp::fetch_add, DataType::f64, 0);  // the word is 0.0
    EXPECT_EQ(std::bit_cast<double>(op(w, owner, base + 5, AtomicOp::fetch_add, DataType::f64, std::bit_cast<std::uint64_t>(1.5))), 0.0);
    op(w, owner, base + 5, AtomicOp::add, DataType::f64, std::bit_cast<std::uint64_t>(-0.25));
    EXPECT_EQ(std::bit_cast<double>(op(w, owner, base + 5, AtomicOp::fetch_add, DataType::f64, 0)), 1.25);
  }
  rt().barrier();
  // The owner sees what the reference says, in its own memory.
  const int from = (me + n - 1) % n;
  if (from != me) {
    const std::size_t base = static_cast<std::size_t>(from) * 8;
    EXPECT_EQ(w.data[base + 1], static_cast<std::uint64_t>(std::numeric_limits<std::uint64_t>::max()) + 1);
    EXPECT_EQ(std::bit_cast<double>(w.data[base + 5]), 1.25);
  }
  rt().barrier();
  }
}

// Every thread of every rank fetch-adds rank 0's counter, each with several in flight, while
// a thread of rank 0 fetch-adds it with its own CPU atomics: the total is exact, and the
// fetched values are exactly 0 .. total-1, each once.
TEST(Atomic, EveryThreadOfEveryRankFetchAddsOneCounter) {
  MP_SKIP_IF_THREADS_SHARE_A_DEVICE();
  for (const bool allocated : {false, true}) {
  SCOPED_TRACE(kind(allocated));
  constexpr int kThreads = 3;
  constexpr int kEach = 300;
  constexpr int kWindow = 8;
  const int n = rt().size();
  const int me = rt().rank();
  Words w(1, allocated);
  rt().barrier();
  ferry::Device& dev = rt().device(0);
  std::vector<std::uint64_t> fetched(static_cast<std::size_t>(kThreads + 1) * kEach, ~0ull);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ferry::CompletionQueue cq;
      int posted = 0, ended = 0;
      Idle idle;
      while (ended < kEach) {
        while (posted < kEach && posted - ended < kWindow) {
          const ferry::Status st = dev.post_atomic({.rank = 0, .remote = w.keys[0], .op = AtomicOp::fetch_add, .type = DataType::u64,
                                                    .operand = 1, .result = &fetched[static_cast<std::size_t>(t * kEach + posted)],
                                                    .local = &cq});
          if (st.is_retry()) break;
          if (st.is_done()) ++ended;
          else if (!st.is_posted()) errors.fetch_add(1);
          ++posted;
        }
        bool any = false;
        while (auto c = cq.pop()) {
          if (c->error != 0 || c->op != ferry::OpKind::atomic) errors.fetch_add(1);
          ++ended;
          any = true;
        }
        idle(dev.progress() || any);
      }
    });
  }
  int mine = kThreads * kEach;
  if (me == 0) {
    threads.emplace_back([&] {
      std::atomic_ref<std::uint64_t> counter(w.data[0]);
      for (int i = 0; i < kEach; ++i) {
        fetched[static_cast<std::size_t>(kThreads * kEach + i)] = counter.fetch_add(1);
        if (i % 16 == 0) std::this_thread::yield();
      }
    });
    mine += kEach;
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  fetched.resize(static_cast<std::size_t>(mine));
  // Every rank's values to every rank.
  std::vector<std::size_t> counts(static_cast<std::size_t>(n), kThreads * kEach * 8), offsets(static_cast<std::size_t>(n));
  counts[0] += kEach * 8;
  std::size_t total = 0;
  for (int r = 0; r < n; ++r) {
    offsets[static_cast<std::size_t>(r)] = total;
    total += counts[static_cast<std::size_t>(r)];
  }
  std::vector<std::uint64_t> all(total / 8);
  ferry::Synchronizer sync;
  const ferry::Status st = team().post_allgatherv({.send = fetched.data(), .recv = all.data(), .counts = counts, .offsets = offsets, .local = &sync});
  if (st.is_posted()) {
    ASSERT_TRUE(wait_until(dev, [&] { return sync.test(); }));
  }
  std::sort(all.begin(), all.end());
  for (std::size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(all[i], i) << "the fetched values are not 0.." << all.size() - 1 << " each once";
  }
  rt().barrier();
  if (me == 0) {
    EXPECT_EQ(w.data[0], all.size());
  }
  rt().barrier();
  }
}

// A spin lock on rank 0 by compare-swap, taken by two threads of every rank and by a thread of
// rank 0 through its own CPU atomics. The critical section reads a count and writes it back
// one more, in two separate operations: were two holders ever inside at once, an increment
// would be lost.
TEST(Atomic, CompareSwapSpinLockExcludes) {
  MP_SKIP_IF_THREADS_SHARE_A_DEVICE();
  for (const bool allocated : {false, true}) {
  SCOPED_TRACE(kind(allocated));
  constexpr int kThreads = 2;
  constexpr int kEach = 40;
  const int me = rt().rank();
  Words w(2, allocated);  // [0] the lock (0: free, else its holder's id), [1] the count
  rt().barrier();
  ferry::Device& dev = rt().device(0);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::uint64_t id = static_cast<std::uint64_t>(me * kThreads + t + 1);
      for (int i = 0; i < kEach; ++i) {
        Idle idle;
        while (op(w, 0, 0, AtomicOp::compare_swap, DataType::u64, id, 0) != 0) idle(dev.progress());
        const std::uint64_t count = op(w, 0, 1, AtomicOp::fetch_add, DataType::u64, 0);
        op(w, 0, 1, AtomicOp::swap, DataType::u64, count + 1);
        if (op(w, 0, 0, AtomicOp::swap, DataType::u64, 0) != id) errors.fetch_add(1);  // the lock was not ours
      }
    });
  }
  if (me == 0) {
    threads.emplace_back([&] {
      const std::uint64_t id = 1000;
      std::atomic_ref<std::uint64_t> lock(w.data[0]), count(w.data[1]);
      for (int i = 0; i < kEach; ++i) {
        std::uint64_t expected = 0;
        while (!lock.compare_exchange_weak(expected, id)) {
          expected = 0;
          std::this_thread::yield();
        }
        const std::uint64_t c = count.load();
        std::this_thread::yield();  // a window for a second holder, were there one
        count.store(c + 1);
        if (lock.exchange(0) != id) errors.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  rt().barrier();
  if (me == 0) {
    EXPECT_EQ(w.data[1], static_cast<std::uint64_t>(rt().size() * kThreads * kEach + kEach));
    EXPECT_EQ(w.data[0], 0u);
  }
  rt().barrier();
  }
}

// An atomic on a region its owner deregistered meanwhile ends with -EFAULT (the owner checks
// every request against its regions), never touching the memory.
TEST(Atomic, DeregisteredRegionIsRefused) {
  const int n = rt().size();
  if (n < 2) GTEST_SKIP() << "needs a peer";
  const int me = rt().rank();
  auto w = std::make_unique<Words>(1, false);
  const RemoteKey of_1 = w->keys[1];
  w->region = ferry::MemoryRegion();  // every rank deregisters its region
  rt().barrier();
  if (me == 0) {
    std::uint64_t result = 7;
    EXPECT_EQ(run({.rank = 1, .remote = of_1, .op = AtomicOp::fetch_add, .type = DataType::u64, .operand = 1, .result = &result}), -EFAULT);
    EXPECT_EQ(result, 7u);
  }
  rt().barrier();
  EXPECT_EQ(w->storage[0], 0u);
  rt().barrier();
}

// An allocated region of a rank on this host is mapped: its atomics are done in the post.
// One on another host's goes by message (posted), the hybrid job's case.
TEST(Atomic, AllocatedRegionOnThisHostIsDoneAtOnce) {
  Words w(1, true);
  const Team host = team().host();
  ferry::Device& dev = rt().device(0);
  for (int r = 0; r < rt().size(); ++r) {
    std::uint64_t result = ~0ull;
    ferry::Synchronizer sync;
    const ferry::Status st = post_retry(dev, [&] {
      return dev.post_atomic({.rank = r, .remote = w.keys[static_cast<std::size_t>(r)], .op = AtomicOp::fetch_add, .type = DataType::u64,
                              .operand = 1, .result = &result, .local = &sync});
    });
    // A lock model that defers posts (offload always, lockq on contention) answers posted and
    // performs the atomic on its own thread: the same path, later.
    const ferry::LockModel model = rt().options().settings.lock_model;
    const bool defers = model == ferry::LockModel::offload || model == ferry::LockModel::lockq;
    if (host.index_of(r) >= 0) {
      if (!defers) {
        EXPECT_TRUE(st.is_done()) << "rank " << r << " shares this host: " << ferry::to_string(st.kind);
      }
    } else {
      EXPECT_TRUE(st.is_posted()) << "rank " << r << " is on another host: " << ferry::to_string(st.kind);
    }
    if (st.is_posted()) {
      ASSERT_TRUE(wait_until(dev, [&] { return sync.test(); }));
    }
    EXPECT_LT(result, static_cast<std::uint64_t>(rt().size()));
  }
  rt().barrier();
  EXPECT_EQ(w.data[0], static_cast<std::uint64_t>(rt().size()));
  rt().barrier();
}

TEST(Atomic, BadArgumentsAreNamed) {
  const int n = rt().size();
  const int peer = (rt().rank() + 1) % n;
  Words w(2, false);
  ferry::Device& dev = rt().device(0);
  const auto message = [&](ferry::AtomicArgs a) {
    try {
      (void)dev.post_atomic(a);
    } catch (const ferry::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const RemoteKey key = w.keys[static_cast<std::size_t>(peer)];
  const auto args = [&] { return ferry::AtomicArgs{.rank = peer, .remote = key, .op = AtomicOp::fetch_add, .type = DataType::u64}; };
  ferry::AtomicArgs a = args();
  a.op = static_cast<AtomicOp>(99);
  EXPECT_EQ(message(a), "ferry: post_atomic: op=99 is not an AtomicOp");
  a = args();
  a.type = DataType::i16;
  EXPECT_EQ(message(a), "ferry: post_atomic: type=i16 is not an atomic type (i32, u32, i64, u64, f64)");
  a = args();
  a.type = DataType::f64;
  a.op = AtomicOp::compare_swap;
  EXPECT_EQ(message(a), "ferry: post_atomic: op=compare_swap is not defined for type=f64 (it takes fetch_add and add)");
  a = args();
  a.offset = 4;
  EXPECT_EQ(message(a).rfind("ferry: post_atomic: offset=4 into the region at ", 0), 0u) << message(a);
  a = args();
  a.offset = 16;
  EXPECT_EQ(message(a), "ferry: post_atomic: offset=16 + size=8 is outside the remote region of 16 bytes");
  a = args();
  a.rank = rt().rank();
  if (n > 1) {
    EXPECT_EQ(message(a).rfind("ferry: post_atomic: remote key belongs to rank ", 0), 0u) << message(a);
  }
  a = args();
  a.remote = RemoteKey{};
  EXPECT_EQ(message(a), "ferry: post_atomic: remote key is empty (never set from a MemoryRegion)");
  a = args();
  a.rank = n;
  EXPECT_NE(message(a).find("post_atomic: rank=" + std::to_string(n)), std::string::npos) << message(a);
  rt().barrier();
}

}  // namespace
}  // namespace mp
