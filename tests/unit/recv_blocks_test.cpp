// The receive-block cache: reuse within a class, the limits, alignment, and many threads.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "core/recv_blocks.hpp"
#include "test_scale.hpp"

namespace rb = ferry::detail::recv_blocks;

namespace {

// Every test starts and ends with an empty cache and the default limit.
class RecvBlocks : public testing::Test {
 protected:
  // No block on 2 MiB pages unless a test asks (a Runtime made by another test sets its own).
  void SetUp() override {
    rb::set_huge_from(0);
    rb::set_limit(0);
    rb::set_limit(kDefault);
  }
  void TearDown() override {
    rb::set_huge_from(0);
    rb::set_limit(0);
    rb::set_limit(kDefault);
  }
  static constexpr std::size_t kDefault = std::size_t{256} << 20;
};

bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 64 == 0; }

}  // namespace

TEST_F(RecvBlocks, AGivenBlockServesTheNextTakeOfItsClass) {
  void* a = rb::take(1 << 20);
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(aligned(a));
  std::memset(a, 0xAB, 1 << 20);  // the whole requested size is usable
  rb::give(a);
  EXPECT_EQ(rb::cached_bytes(), std::size_t{1} << 20);
  void* b = rb::take((1 << 19) + 1);  // same power-of-two class
  EXPECT_EQ(b, a);
  EXPECT_EQ(rb::cached_bytes(), 0u);
  void* c = rb::take(1 << 20);  // the class is empty now: a new block
  EXPECT_NE(c, b);
  rb::give(b);
  rb::give(c);
  EXPECT_EQ(rb::cached_bytes(), std::size_t{2} << 20);
}

TEST_F(RecvBlocks, AnOffsetBlockStartsThatFarPastALineAndComesBackWhole) {
  // The offset is taken mod 64; the whole size stays usable at every offset, and a given
  // block serves the next take of its class at another offset.
  void* a = rb::take(std::size_t{1} << 20, 64 + 48);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % 64, 48u);
  std::memset(a, 0xCD, std::size_t{1} << 20);
  rb::give(a);
  EXPECT_EQ(rb::cached_bytes(), std::size_t{1} << 20);
  void* b = rb::take(std::size_t{1} << 20, 16);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b) % 64, 16u);
  EXPECT_EQ(static_cast<unsigned char*>(b) + 32, a) << "the same block, 32 bytes earlier";
  std::memset(b, 0xEF, std::size_t{1} << 20);
  rb::give(b);
  void* c = rb::take(std::size_t{1} << 20);
  EXPECT_TRUE(aligned(c));
  EXPECT_EQ(static_cast<unsigned char*>(c) + 48, a);
  rb::give(c);
}

TEST_F(RecvBlocks, EachClassKeepsAtMostItsSlotsAndTheLimitHolds) {
  std::vector<void*> blocks;
  for (std::size_t i = 0; i < rb::kSlots + 3; ++i) blocks.push_back(rb::take(64 << 10));
  for (void* b : blocks) rb::give(b);
  EXPECT_EQ(rb::cached_bytes(), rb::kSlots * (64 << 10));
  rb::set_limit(std::size_t{3} << 16);
  EXPECT_EQ(rb::cached_bytes(), std::size_t{3} << 16) << "a lower limit frees kept blocks down to it";
  rb::set_limit(0);
  EXPECT_EQ(rb::cached_bytes(), 0u) << "a zero limit hands every kept block back";
  rb::set_limit(100 << 10);
  void* x = rb::take(64 << 10);
  void* y = rb::take(64 << 10);
  rb::give(x);
  rb::give(y);  // 128 KiB would pass the 100 KiB limit: freed
  EXPECT_EQ(rb::cached_bytes(), std::size_t{64} << 10);
}

TEST_F(RecvBlocks, TinyAndHugeSizesWork) {
  void* small = rb::take(1);
  ASSERT_NE(small, nullptr);
  EXPECT_TRUE(aligned(small));
  rb::give(small);
  EXPECT_EQ(rb::cached_bytes(), std::size_t{4} << 10) << "the smallest class is 4 KiB";
  rb::give(nullptr);  // a no-op
  // Past the largest class (1 GiB) a block is exact-sized and never kept. Only its first and
  // last pages are touched, so this costs no real memory.
  const std::size_t huge = (std::size_t{1} << 30) + 4096;
  auto* h = static_cast<unsigned char*>(rb::take(huge));
  ASSERT_NE(h, nullptr);
  h[0] = 1;
  h[huge - 1] = 2;
  const std::size_t before = rb::cached_bytes();
  rb::give(h);
  EXPECT_EQ(rb::cached_bytes(), before);
  // Sizes no process can hold (a hostile peer's) fail without reaching the allocator, which
  // under a sanitizer would stop the process.
  EXPECT_EQ(rb::take(std::size_t{1} << 47), nullptr);
  EXPECT_EQ(rb::take(std::size_t{1} << 60, 17), nullptr);
  EXPECT_EQ(rb::take(SIZE_MAX), nullptr);
}

// From the huge-page size on (FERRY_RECV_HUGE), a block is a mapping of its own: its payload
// starts on a 2 MiB boundary (plus the offset), the whole size is usable, it is counted at
// what it holds (at least one 2 MiB page and the page before it), kept and reused like any
// other, and unmapped when the cache lets it go. Smaller classes are untouched.
TEST_F(RecvBlocks, BlocksFromTheHugeSizeOnStartOnA2MiBBoundary) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  rb::set_huge_from(kMiB);
  void* small = rb::take(512 << 10);
  ASSERT_NE(small, nullptr);
  EXPECT_FALSE(rb::huge(small));
  void* a = rb::take(kMiB, 48);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % (2 * kMiB), 48u) << "the payload starts 48 bytes past 2 MiB";
  std::memset(a, 0x5A, kMiB);
  void* b = rb::take(3 * kMiB);  // a 4 MiB class: two whole huge pages and a small one
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b) % (2 * kMiB), 0u);
  std::memset(b, 0xA5, 3 * kMiB);
  // madvise may be refused where the kernel has no transparent huge pages; the layout holds.
  if (!rb::huge(a)) std::printf("note: MADV_HUGEPAGE refused here; blocks keep the 2 MiB layout\n");
  rb::give(a);
  EXPECT_EQ(rb::cached_bytes(), 2 * kMiB + 4096) << "a 1 MiB block on a huge page holds 2 MiB and a page";
  void* again = rb::take(kMiB);
  EXPECT_EQ(static_cast<unsigned char*>(again) + 48, a) << "the same block, at offset 0 this time";
  EXPECT_EQ(static_cast<unsigned char*>(again)[100], 0x5A) << "kept, not remapped";
  rb::give(again);
  rb::give(b);
  rb::give(small);
  EXPECT_EQ(rb::cached_bytes(), (2 * kMiB + 4096) + (4 * kMiB + 8192) + (512 << 10));
  rb::set_limit(0);  // unmaps the huge blocks, frees the small one
  EXPECT_EQ(rb::cached_bytes(), 0u);
}

TEST_F(RecvBlocks, ThreadsTakeAndGiveConcurrentlyWithoutSharingABlock) {
  const int threads = 4;
  const std::size_t rounds = ferry::test::scaled(20000);
  std::vector<std::thread> pool;
  std::vector<int> failures(threads, 0);
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([t, rounds, &failures] {
      for (std::size_t i = 0; i < rounds; ++i) {
        const std::size_t size = std::size_t{4096} << ((i + static_cast<std::size_t>(t)) % 4);
        auto* b = static_cast<unsigned char*>(rb::take(size));
        if (b == nullptr) {
          ++failures[t];
          continue;
        }
        // A block held by two threads at once would see the other's marks.
        std::memset(b, t + 1, 64);
        std::memset(b + size - 64, t + 1, 64);
        std::this_thread::yield();
        if (b[0] != t + 1 || b[63] != t + 1 || b[size - 1] != t + 1) ++failures[t];
        rb::give(b);
      }
    });
  }
  for (auto& th : pool) th.join();
  for (int t = 0; t < threads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  EXPECT_LE(rb::cached_bytes(), 4 * rb::kSlots * (std::size_t{32} << 10));
}
