// Hazard holds (net/hazard.hpp): a retired object is never in use, slots return with threads.
#include "net/hazard.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "test_scale.hpp"

namespace {

using ferry::net::HazardHold;
using ferry::net::retire_wait;

constexpr std::uint64_t kAlive = 0xA11FE, kDead = 0xDEAD;

struct Object {
  std::atomic<std::uint64_t> state{kAlive};
};

// Readers hold whatever the shared pointer names and check, twice with a pause between, that
// it is alive; the retirer keeps replacing the object, waits with retire_wait, then marks the
// old one dead and frees it (under ASan a read after that is a reported use after free).
TEST(Hazard, ARetiredObjectIsNeverHeld) {
  std::atomic<Object*> shared{new Object};
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> seen_dead{0}, holds{0};
  ferry::test::Gate gate;
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t) {
    readers.emplace_back([&] {
      gate.wait();
      std::uint64_t mine = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        const HazardHold<Object> h(shared);
        if (h.get() == nullptr) continue;
        if (h.get()->state.load(std::memory_order_relaxed) != kAlive) seen_dead.fetch_add(1);
        for (int i = 0; i < 16; ++i) std::atomic_signal_fence(std::memory_order_seq_cst);
        if (h.get()->state.load(std::memory_order_relaxed) != kAlive) seen_dead.fetch_add(1);
        if ((++mine & 63) == 0) holds.fetch_add(64, std::memory_order_relaxed);
      }
    });
  }
  gate.open();
  // At least `rounds` replacements, and on until the readers (which on two cores may start
  // late) have held objects `want` times, or 20 s have passed.
  const std::size_t rounds = ferry::test::scaled(20000, 500);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  const std::uint64_t want = ferry::test::scaled(4096, 256);
  for (std::size_t i = 0; i < rounds || (holds.load(std::memory_order_relaxed) < want && std::chrono::steady_clock::now() < deadline); ++i) {
    Object* old = shared.exchange((i & 1) != 0 ? nullptr : new Object, std::memory_order_seq_cst);
    if (old == nullptr) continue;
    retire_wait(old);
    old->state.store(kDead, std::memory_order_relaxed);
    delete old;
  }
  stop.store(true);
  for (std::thread& t : readers) t.join();
  delete shared.exchange(nullptr);
  EXPECT_EQ(seen_dead.load(), 0u);
  EXPECT_GT(holds.load(), 0u) << "the readers never held anything: the test tested nothing";
}

// A thread's slot is given back when it ends and reused by the next thread.
TEST(Hazard, FinishedThreadsGiveTheirSlotsBack) {
  std::atomic<Object*> shared{new Object};
  auto hold_once = [&] {
    const HazardHold<Object> h(shared);
    EXPECT_NE(h.get(), nullptr);
  };
  std::thread(hold_once).join();
  const std::size_t before = ferry::net::hazard_detail::slot_count();
  for (int i = 0; i < 50; ++i) std::thread(hold_once).join();
  EXPECT_EQ(ferry::net::hazard_detail::slot_count(), before);
  delete shared.exchange(nullptr);
}

// A hold that is not asked to protect is a plain load and leaves no mark.
TEST(Hazard, AnUnprotectedHoldIsAPlainLoad) {
  Object o;
  std::atomic<Object*> shared{&o};
  {
    const HazardHold<Object> h(shared, false);
    EXPECT_EQ(h.get(), &o);
    shared.store(nullptr);
    retire_wait(&o);  // returns at once: nothing holds o
  }
  const HazardHold<Object> none(shared);
  EXPECT_EQ(none.get(), nullptr);
}

}  // namespace
