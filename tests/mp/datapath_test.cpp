// Every operation, every size from 0 bytes to 5 MiB (64 MiB in the large runs,
// FERRY_TEST_LARGE), data verified, on a ring of ranks: each rank sends to its right neighbour
// and receives from its left.
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "ferry/tools.hpp"
#include "mp_common.hpp"

using namespace mp;

namespace {

// The shm backend's large-data path ("cma" or "copy (...)"), as ferry-info reports it.
std::string shm_large_data() {
  for (const ferry::BackendReport& b : ferry::describe_backends()) {
    if (b.name != "shm") continue;
    for (const auto& [label, value] : b.facts)
      if (label == "large data") return value;
  }
  return "";
}

// Waits for the local completion of a post that returned `posted`.
void finish(ferry::Device& dev, const ferry::Status& s, ferry::Synchronizer& sync) {
  if (s.is_posted()) {
    ASSERT_TRUE(wait_until(dev, [&] { return sync.test(); })) << "local completion never came";
    EXPECT_TRUE(sync.results()[0].ok()) << sync.results()[0].error_string();
  }
  sync.reset();
}

ferry::Completion pop_one(ferry::Device& dev, ferry::CompletionQueue& cq) {
  std::optional<ferry::Completion> c;
  EXPECT_TRUE(wait_until(dev, [&] { return (c = cq.pop()).has_value(); })) << "nothing arrived";
  return c ? std::move(*c) : ferry::Completion{};
}

}  // namespace

// The row-at-a-time fill and check (mp_common.hpp) against the byte-wise definition.
TEST(Pattern, RowsAgreeWithTheByteDefinitionAndFindTheFirstWrongByte) {
  for (const std::size_t n : {0, 1, 255, 256, 257, 4095, 4096, 4097, 8192, 3 * 4096 + 300}) {
    std::vector<unsigned char> v(n);
    fill(v, 3);
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(v[i], pattern(3, n, i)) << "n " << n << ", byte " << i;
    EXPECT_EQ(first_mismatch(v.data(), n, 3, n), -1);
    if (n == 0) continue;
    // A prefix checked against the whole message's pattern (as a truncated receive is).
    EXPECT_EQ(first_mismatch(v.data(), n - 1, 3, n), -1);
    for (const std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
      v[at] ^= 0x40;
      EXPECT_EQ(first_mismatch(v.data(), n, 3, n), static_cast<long long>(at)) << "n " << n;
      EXPECT_EQ(first_mismatch(v.data(), n, 4, n), 0) << "another sender's pattern";
      v[at] ^= 0x40;
    }
  }
}

TEST(ActiveMessage, EverySizeArrivesIntactInTheTargetQueue) {
  ferry::Device& dev = rt().device();
  ferry::CompletionQueue inbox;
  ferry::Exposure ex = rt().expose(inbox, 10);
  rt().barrier();
  ferry::Synchronizer sync(1);
  const auto all = sizes();
  for (std::size_t k = 0; k < all.size(); ++k) {
    const std::size_t size = all[k];
    std::vector<unsigned char> out(size);
    fill(out, rt().rank());
    const ferry::Status s = post_retry(dev, [&] {
      return dev.post_am({.rank = right(), .buffer = out.data(), .size = size, .target = {10},
                          .tag = static_cast<ferry::Tag>(k), .local = &sync});
    });
    ferry::Completion c = pop_one(dev, inbox);
    finish(dev, s, sync);
    EXPECT_EQ(c.op, ferry::OpKind::remote_am);
    EXPECT_EQ(c.rank, left());
    EXPECT_EQ(c.tag, k);
    ASSERT_EQ(c.size, size);
    ASSERT_EQ(c.buffer.size(), size);
    EXPECT_EQ(first_mismatch(c.buffer.data(), size, left(), size), -1) << "size " << size;
    rt().barrier();
  }
}

// Every size to the rank itself, two threads posting at once, each one's messages in order:
// a transport may treat messages to its own process apart (UCX's goes around UCX).
TEST(ActiveMessage, EverySizeToItsOwnRankArrivesIntactAndInOrder) {
  MP_SKIP_IF_THREADS_SHARE_A_DEVICE();
  ferry::Device& dev = rt().device();
  ferry::CompletionQueue inbox;
  ferry::Exposure ex = rt().expose(inbox, 15);
  const auto all = sizes();
  const int me = rt().rank();
  std::vector<std::vector<unsigned char>> out(2 * all.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i].resize(all[i % all.size()]);
    fill(out[i], me);
  }
  auto post_all = [&](std::size_t thread) {
    for (std::size_t k = 0; k < all.size(); ++k) {
      std::vector<unsigned char>& buf = out[thread * all.size() + k];
      (void)post_retry(dev, [&] {
        return dev.post_am({.rank = me, .buffer = buf.data(), .size = buf.size(), .target = {15},
                            .tag = static_cast<ferry::Tag>(thread << 16 | k)});
      });
    }
  };
  // No local completions are awaited: `out` outlives every read of it (the last message is in
  // before the barrier).
  std::thread other(post_all, 1);
  post_all(0);
  std::size_t next[2] = {0, 0};
  std::size_t got = 0;
  const bool all_in = wait_until(dev, [&] {
    while (auto c = inbox.pop()) {
      ++got;
      const std::size_t thread = c->tag >> 16, k = c->tag & 0xFFFF;
      EXPECT_EQ(c->rank, me);
      if (thread > 1) continue;
      EXPECT_EQ(k, next[thread]) << "thread " << thread << "'s messages out of order";
      next[thread] = k + 1;
      if (k >= all.size()) continue;
      EXPECT_EQ(c->size, all[k]);
      EXPECT_EQ(first_mismatch(c->buffer.data(), c->buffer.size(), me, all[k]), -1) << "size " << all[k];
    }
    return got == out.size();
  });
  other.join();
  EXPECT_TRUE(all_in) << got << " of " << out.size() << " arrived";
  rt().barrier();
}

// Messages to the rank itself, posted without progress until the device refuses one: the
// refusal is `retry` (no room in a queue to itself, no send credit or buffer left), never an
// error or a loss; once progress runs, every message posted before it arrives, intact and in
// order, and the device takes new ones. Each rank prints where its first round was refused and
// why, which `mp_ucx_sm_2_own_rank_ring_full` checks: with more send credits than UCX's ring to
// the rank itself holds (1024), the ring is what refuses. 1 KiB is past UCX's inject size, so
// there each message waits in that ring holding its packet.
TEST(ActiveMessage, ToItsOwnRankWithoutProgressRunsOutAsRetryAndLosesNothing) {
  if (another_thread_progresses()) GTEST_SKIP() << "another thread progresses the device, so posts need not run out";
  ferry::Device& dev = rt().device();
  ferry::CompletionQueue inbox;
  ferry::Exposure ex = rt().expose(inbox, 16);
  const int me = rt().rank();
  constexpr std::size_t kSize = 1024;
  constexpr int kLimit = 1 << 16;  // far past every transport's and the packet pool's capacity
  std::vector<unsigned char> out(kSize);
  fill(out, me);
  // Tags count on across rounds; each round's messages must arrive in the order posted.
  std::uint32_t tag = 0, next = 0;
  auto receive_up_to = [&](std::uint32_t end) {
    return wait_until(dev, [&] {
      while (auto c = inbox.pop()) {
        EXPECT_EQ(c->rank, me);
        EXPECT_EQ(c->tag, next) << "out of order";
        EXPECT_EQ(c->size, kSize);
        EXPECT_EQ(first_mismatch(c->buffer.data(), c->buffer.size(), me, kSize), -1) << "message " << c->tag;
        next = c->tag + 1;
      }
      return next >= end;
    });
  };
  auto post = [&] {
    return dev.post_am({.rank = me, .buffer = out.data(), .size = kSize, .target = {16}, .tag = tag});
  };
  // One message with progress first: a transport may need progress before its first message
  // to this rank (libfabric's providers do).
  ASSERT_TRUE(post_retry(dev, post).is_done());
  ++tag;
  ASSERT_TRUE(receive_up_to(tag)) << "the first message never arrived";
  for (int round = 0; round < 2; ++round) {
    int posted = 0;
    bool refused = false;
    for (; posted < kLimit; ++posted, ++tag) {
      const ferry::Status s = post();
      if (s.is_retry()) {
        if (round == 0) std::printf("rank %d: refused after %d: %s\n", me, posted, ferry::to_string(s.reason));
        refused = true;
        break;
      }
      // A 1 KiB message goes eagerly: its bytes are copied in the call.
      ASSERT_TRUE(s.is_done()) << "post " << posted << ": " << ferry::to_string(s.kind);
    }
    EXPECT_TRUE(refused) << "round " << round << ": " << posted << " posts to this rank without progress, none refused";
    EXPECT_TRUE(receive_up_to(tag)) << "round " << round << ": " << next << " of " << tag << " arrived";
    ASSERT_EQ(next, tag) << "round " << round << ": more arrived than were posted";
    // Taken again after progress.
    ASSERT_TRUE(post_retry(dev, post).is_done());
    ++tag;
    ASSERT_TRUE(receive_up_to(tag)) << "round " << round << ": a message after the refusal never arrived";
  }
  std::fflush(stdout);
  rt().barrier();
}

// A stream of rendezvous active messages that the application consumes as they come: where
// the transport reads synchronously (ferry's shm with cross-memory attach), progress starts
// one read per call, before its poll, so the application has returned the last receive block
// when the next read takes one, and the stream runs through a block that stays in cache.
// (Starting every arrived RTS at once took up to 16 blocks in turn.)
TEST(ActiveMessage, AConsumedStreamOfLargeMessagesReusesItsReceiveBlock) {
  if (rt().transport() != "shm") GTEST_SKIP() << "reads are synchronous only on ferry's shm, not " << rt().transport();
  const char* copy = std::getenv("FERRY_SHM_COPY");
  if ((copy != nullptr && std::string(copy) == "copy") || shm_large_data().rfind("cma", 0) != 0) {
    GTEST_SKIP() << "ferry's shm reads through its queues here, asynchronously";
  }
  if (another_thread_progresses()) {
    GTEST_SKIP() << "another thread progresses the device, so this one does not consume as it comes";
  }
  ferry::Device& dev = rt().device();
  ferry::CompletionQueue inbox;
  ferry::Exposure ex = rt().expose(inbox, 13);
  ferry::CompletionQueue ready;
  ferry::Exposure ex_ready = rt().expose(ready, 14);
  rt().barrier();
  constexpr std::size_t kSize = 512u << 10;  // past every transport's fragments: a rendezvous
  constexpr int kCount = 48;
  std::vector<unsigned char> out(kSize);
  fill(out, rt().rank());
  ferry::Synchronizer sent(kCount);
  std::vector<const void*> blocks;
  int received = 0;
  // Every progress call is followed by draining the inbox, also between retried posts.
  auto drain = [&] {
    while (auto c = inbox.pop()) {
      EXPECT_TRUE(c->ok()) << c->error_string();
      EXPECT_EQ(c->size, kSize);
      if (c->buffer.size() == kSize) {
        EXPECT_EQ(first_mismatch(c->buffer.data(), kSize, left(), kSize), -1) << "message " << received;
        if (std::find(blocks.begin(), blocks.end(), c->buffer.data()) == blocks.end()) blocks.push_back(c->buffer.data());
      }
      ++received;  // its block goes back to the cache here
    }
  };
  // A rank sends only once its receiver has left the barrier, whose progress calls do not
  // drain the inbox: each rank tells its left neighbour it is ready.
  const unsigned char go = 1;
  const ferry::Status said = post_retry(dev, [&] { return dev.post_am({.rank = left(), .buffer = &go, .size = 1, .target = {14}}); });
  ASSERT_FALSE(said.is_retry());
  ASSERT_TRUE(wait_until(dev, [&] {
    drain();
    return ready.pop().has_value();
  })) << "rank " << right() << " never said it was ready";
  for (int i = 0; i < kCount; ++i) {
    ferry::Status s;
    while ((s = dev.post_am({.rank = right(), .buffer = out.data(), .size = kSize, .target = {13},
                             .tag = static_cast<ferry::Tag>(i), .local = &sent}))
               .is_retry()) {
      dev.progress();
      drain();
    }
    ASSERT_TRUE(s.is_posted()) << "a " << kSize << "-byte active message goes by rendezvous";
  }
  ASSERT_TRUE(wait_until(dev, [&] {
    drain();
    return received == kCount && sent.test();
  })) << received << " of " << kCount << " arrived";
  // Read by the receiver, one read per progress call: the block comes back before the next
  // read takes one. Pushed by the sender (FERRY_RDV_READ=push), up to 2 MiB of reads are in
  // flight at once, 4 blocks of 512 KiB, and one more comes back while the next is taken.
  const std::size_t most = rt().options().settings.rdv_read == ferry::RdvRead::push ? ((std::size_t{2} << 20) / kSize + 1) : 2;
  EXPECT_LE(blocks.size(), most) << "the stream took a new receive block for many of its messages";
  rt().barrier();
}

TEST(ActiveMessage, IovecDeliversTheEagerPartAndEveryZeroCopyPart) {
  ferry::Device& dev = rt().device();
  ferry::CompletionQueue inbox;
  ferry::Exposure ex = rt().expose(inbox, 12);
  rt().barrier();
  ferry::Synchronizer sync(1);
  for (std::size_t size : sizes()) {
    const std::size_t eager = size % 200;
    std::vector<unsigned char> head(eager), a(size), b(size / 2 + 1), empty;
    fill(head, rt().rank());
    fill(a, rt().rank());
    fill(b, rt().rank());
    const ferry::Status s = post_retry(dev, [&] {
      return dev.post_am_iovec({.rank = right(), .eager = {head.data(), eager},
                                .parts = {{a.data(), a.size()}, {empty.data(), 0}, {b.data(), b.size()}},
                                .target = {12}, .tag = 5, .local = &sync});
    });
    ASSERT_TRUE(s.is_posted());
    ferry::Completion c = pop_one(dev, inbox);
    finish(dev, s, sync);
    EXPECT_EQ(c.rank, left());
    EXPECT_EQ(c.tag, 5u);
    EXPECT_EQ(c.size, eager + a.size() + b.size());
    ASSERT_EQ(c.buffer.size(), eager);
    EXPECT_EQ(first_mismatch(c.buffer.data(), eager, left(), eager), -1);
    ASSERT_EQ(c.parts.size(), 3u);
    ASSERT_EQ(c.parts[0].size(), a.size());
    EXPECT_EQ(first_mismatch(c.parts[0].data(), a.size(), left(), a.size()), -1) << "size " << size;
    EXPECT_EQ(c.parts[1].size(), 0u);
    ASSERT_EQ(c.parts[2].size(), b.size());
    EXPECT_EQ(first_mismatch(c.parts[2].data(), b.size(), left(), b.size()), -1);
    rt().barrier();
  }
}

namespace {

enum class Wild { none, any_source, any_tag, both };

void send_recv_all_sizes(Wild wild, bool recv_first) {
  ferry::Device& dev = rt().device();
  ferry::Synchronizer send_sync(1), recv_sync(1);
  const auto all = sizes();
  for (std::size_t k = 0; k < all.size(); ++k) {
    const std::size_t size = all[k];
    const ferry::Tag tag = static_cast<ferry::Tag>(1000 + k);
    std::vector<unsigned char> out(size), in(size + 3, 0xEE);
    fill(out, rt().rank());
    const bool any_src = wild == Wild::any_source || wild == Wild::both;
    const bool any_tag = wild == Wild::any_tag || wild == Wild::both;
    auto post_recv = [&] {
      return post_retry(dev, [&] {
        return dev.post_recv({.rank = any_src ? ferry::any_source : left(), .buffer = in.data(), .size = in.size(),
                              .tag = any_tag ? ferry::any_tag : tag, .local = &recv_sync});
      });
    };
    ferry::Status r{};
    if (recv_first) r = post_recv();
    rt().barrier();  // with recv_first, the receive is posted before the message arrives
    const ferry::Status s = post_retry(
        dev, [&] { return dev.post_send({.rank = right(), .buffer = out.data(), .size = size, .tag = tag, .local = &send_sync}); });
    if (!recv_first) {
      // The left neighbour posted its message before entering this barrier, whose first step
      // this rank receives from it, over the same device and transport, in order: so the
      // message has arrived, and waits as unexpected, once the barrier is done. An eager one
      // then completes the receive at once (a rendezvous one starts its read).
      rt().barrier();
      r = post_recv();
      // (Under offload every post goes to the offload thread: none completes in the call.)
      if (size <= dev.eager_limit() && rt().options().value("lock_model") != "offload") {
        EXPECT_TRUE(r.is_done()) << "size " << size << ": the message had not arrived before its receive";
      }
    }
    int got_rank;
    ferry::Tag got_tag;
    std::size_t got_size;
    if (r.is_done()) {
      got_rank = r.rank;
      got_tag = r.tag;
      got_size = r.size;
    } else {
      ASSERT_TRUE(wait_until(dev, [&] { return recv_sync.test(); })) << "receive of " << size << " bytes never completed";
      const ferry::Completion& c = recv_sync.results()[0];
      ASSERT_TRUE(c.ok()) << c.error_string();
      got_rank = c.rank;
      got_tag = c.tag;
      got_size = c.size;
      recv_sync.reset();
    }
    finish(dev, s, send_sync);
    EXPECT_EQ(got_rank, left());
    EXPECT_EQ(got_tag, tag);
    ASSERT_EQ(got_size, size);
    EXPECT_EQ(first_mismatch(in.data(), size, left(), size), -1) << "size " << size;
    EXPECT_EQ(in[size], 0xEE) << "wrote past the message";
    rt().barrier();
  }
}

}  // namespace

TEST(SendRecv, ExactMatchReceivePostedFirst) { send_recv_all_sizes(Wild::none, true); }
TEST(SendRecv, ExactMatchMessageArrivesFirst) { send_recv_all_sizes(Wild::none, false); }
TEST(SendRecv, AnySource) { send_recv_all_sizes(Wild::any_source, true); }
TEST(SendRecv, AnyTagMessageArrivesFirst) { send_recv_all_sizes(Wild::any_tag, false); }
TEST(SendRecv, AnySourceAnyTag) { send_recv_all_sizes(Wild::both, true); }

TEST(SendRecv, MessagesFromOnePeerWithOneTagAreMatchedInOrder) {
  ferry::Device& dev = rt().device();
  constexpr int n = 64;
  std::vector<std::uint32_t> in(n, 0xFFFFFFFF);
  ferry::Synchronizer recvs(n);
  for (int i = 0; i < n; ++i) {
    (void)post_retry(dev, [&] {
      return dev.post_recv({.rank = left(), .buffer = &in[i], .size = 4, .tag = 7, .local = &recvs});
    });
  }
  rt().barrier();
  // Each send has its own buffer: under a deferring lock model (offload, lockq) a send reads
  // its buffer when it is performed, not when it is posted.
  std::vector<std::uint32_t> out(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    out[i] = i;
    (void)post_retry(dev, [&] { return dev.post_send({.rank = right(), .buffer = &out[i], .size = 4, .tag = 7}); });
  }
  ASSERT_TRUE(wait_until(dev, [&] { return recvs.test(); }));
  for (std::uint32_t i = 0; i < n; ++i) EXPECT_EQ(in[i], i);
  rt().barrier();
}

TEST(SendRecv, ALargerMessageThanTheBufferIsReportedAsTruncated) {
  ferry::Device& dev = rt().device();
  for (std::size_t size : {std::size_t{100}, std::size_t{1} << 20}) {
    std::vector<unsigned char> out(size), in(size / 2);
    fill(out, rt().rank());
    ferry::Synchronizer rs(1), ss(1);
    const ferry::Status r = post_retry(
        dev, [&] { return dev.post_recv({.rank = left(), .buffer = in.data(), .size = in.size(), .tag = 3, .local = &rs}); });
    ASSERT_TRUE(r.is_posted());
    rt().barrier();
    const ferry::Status s = post_retry(
        dev, [&] { return dev.post_send({.rank = right(), .buffer = out.data(), .size = size, .tag = 3, .local = &ss}); });
    ASSERT_TRUE(wait_until(dev, [&] { return rs.test(); }));
    EXPECT_EQ(rs.results()[0].error, -EMSGSIZE) << rs.results()[0].error_string();
    EXPECT_EQ(rs.results()[0].size, in.size());
    EXPECT_EQ(first_mismatch(in.data(), in.size(), left(), size), -1) << "size " << size;
    finish(dev, s, ss);
    rt().barrier();
  }
}

namespace {

struct Regions {
  std::vector<unsigned char> local;  // what this rank exposes
  ferry::MemoryRegion mr;
  std::vector<ferry::RemoteKey> keys;
};

std::unique_ptr<Regions> make_regions(const std::string& name) {
  auto r = std::make_unique<Regions>();
  r->local.assign(largest_size() + 64, 0);
  r->mr = rt().device().register_memory(r->local.data(), r->local.size());
  r->keys = allgather<ferry::RemoteKey>("mp.rkey." + name, r->mr.remote_key());
  return r;
}

void put_all_sizes(bool notify) {
  ferry::Device& dev = rt().device();
  auto regions = make_regions(notify ? "putn" : "put");
  ferry::CompletionQueue notes;
  ferry::Exposure ex = rt().expose(notes, 11);
  rt().barrier();
  ferry::Synchronizer sync(1);
  const auto all = sizes();
  for (std::size_t k = 0; k < all.size(); ++k) {
    const std::size_t size = all[k];
    const std::size_t offset = k % 2 == 0 ? 0 : 64;  // odd steps write at an offset
    std::vector<unsigned char> out(size);
    fill(out, rt().rank());
    const ferry::Status s = post_retry(dev, [&] {
      return dev.post_put({.rank = right(), .buffer = out.data(), .size = size,
                           .remote = regions->keys[static_cast<std::size_t>(right())], .offset = offset,
                           .local = &sync, .notify = notify, .notify_target = {11},
                           .notify_tag = static_cast<ferry::Tag>(k)});
    });
    finish(dev, s, sync);
    if (notify) {
      ferry::Completion c = pop_one(dev, notes);
      EXPECT_EQ(c.op, ferry::OpKind::remote_put);
      EXPECT_EQ(c.rank, left());
      EXPECT_EQ(c.tag, k);
      // The notification promises the data: it is checked now, before any barrier.
      EXPECT_EQ(first_mismatch(regions->local.data() + offset, size, left(), size), -1)
          << "size " << size << ": the notification came before the data";
    }
    rt().barrier();  // every put has completed at its origin
    EXPECT_EQ(first_mismatch(regions->local.data() + offset, size, left(), size), -1) << "size " << size;
    rt().barrier();
  }
}

}  // namespace

TEST(Put, EverySizeLandsInTheRemoteRegion) { put_all_sizes(false); }
TEST(Put, WithNotificationTheTargetIsToldAfterTheData) { put_all_sizes(true); }

TEST(Get, EverySizeIsReadFromTheRemoteRegion) {
  ferry::Device& dev = rt().device();
  auto regions = make_regions("get");
  ferry::Synchronizer sync(1);
  for (std::size_t size : sizes()) {
    fill(regions->local.data(), size, rt().rank());
    rt().barrier();
    std::vector<unsigned char> in(size + 1, 0xEE);
    const ferry::Status s = post_retry(dev, [&] {
      return dev.post_get({.rank = right(), .buffer = in.data(), .size = size,
                           .remote = regions->keys[static_cast<std::size_t>(right())], .local = &sync});
    });
    finish(dev, s, sync);
    EXPECT_EQ(first_mismatch(in.data(), size, right(), size), -1) << "size " << size;
    EXPECT_EQ(in[size], 0xEE);
    rt().barrier();
  }
}

// Over UCX within one host, RMA does not go over active messages wherever the host lets one rank
// read another's memory, which the test finds out for itself (process_vm_readv of a word each
// rank publishes): it goes by cross-memory attach (or by UCX's own RMA lane, where UCX has one).
// Otherwise a host whose Yama ptrace_scope forbids it would leave the ucx_sm runs testing RMA
// over active messages without a word: such a host skips, saying why.
TEST(Rma, OverUcxWithinAHostGoesByCrossMemoryAttachOrAnRmaLane) {
  if (rt().transport() != "ucx") GTEST_SKIP() << "UCX alone, not " << rt().transport();
  const char* copy = std::getenv("FERRY_SHM_COPY");
  if (copy != nullptr && std::string(copy) == "copy") GTEST_SKIP() << "FERRY_SHM_COPY=copy turns the path off";
  struct Word {
    std::int64_t pid;
    std::uint64_t address;
    std::uint64_t value;
  };
  static std::uint64_t word;
  word = 0x9e3779b97f4a7c15ull ^ static_cast<std::uint64_t>(::getpid());
  const std::vector<Word> all =
      allgather<Word>("cma_word", Word{::getpid(), reinterpret_cast<std::uintptr_t>(&word), word});
  int checked = 0;
  std::string unreadable;
  for (int r = 0; r < rt().size(); ++r) {
    if (r == rt().rank()) continue;
    const Word& w = all[static_cast<std::size_t>(r)];
    std::uint64_t got = 0;
    iovec local{&got, sizeof got};
    iovec remote{reinterpret_cast<void*>(w.address), sizeof got};
    const ssize_t n = ::process_vm_readv(static_cast<pid_t>(w.pid), &local, 1, &remote, 1, 0);
    if (n != static_cast<ssize_t>(sizeof got) || got != w.value) {
      unreadable += " rank " + std::to_string(r) + " (" + (n < 0 ? std::strerror(errno) : "a wrong word") + ")";
      continue;
    }
    ++checked;
    // Cross-memory attach where UCX has no RMA lane to the peer; UCX's own RMA where it has one.
    const std::string how = rt().transport_of(r);
    EXPECT_EQ(how.find("RMA: over active messages"), std::string::npos) << "rank " << r << ": " << how;
  }
  rt().barrier();
  if (checked == 0) GTEST_SKIP() << "this rank may read no peer's memory here:" << unreadable;
}

TEST(Handler, RunsForEachIncomingMessage) {
  ferry::Device& dev = rt().device();
  std::atomic<int> seen{0};
  std::atomic<int> wrong{0};
  ferry::Handler h([&](ferry::Completion&& c) {
    if (c.rank != left() || c.size != 8) wrong.fetch_add(1);
    seen.fetch_add(1);
  });
  ferry::Exposure ex = rt().expose(h, 13);
  rt().barrier();
  std::uint64_t v = 42;
  for (int i = 0; i < 100; ++i) {
    (void)post_retry(dev, [&] { return dev.post_am({.rank = right(), .buffer = &v, .size = 8, .target = {13}}); });
  }
  EXPECT_TRUE(wait_until(dev, [&] { return seen.load() == 100; }));
  EXPECT_EQ(wrong.load(), 0);
  rt().barrier();
}

// Counts how an object is signalled: one message at a time (signal) or in runs (signal_batch).
class SignalProbe final : public ferry::CompletionObject {
 public:
  SignalProbe(bool batches, int from) noexcept : batches_(batches), from_(from) {}
  void signal(ferry::Completion&& c) noexcept override {
    take(c);
    singles_.fetch_add(1);
  }
  void signal_batch(ferry::Completion* completions, std::size_t count) noexcept override {
    for (std::size_t i = 0; i < count; ++i) take(completions[i]);
    runs_.fetch_add(1);
  }
  bool batches() const noexcept override { return batches_; }
  int messages() const noexcept { return messages_.load(); }
  int singles() const noexcept { return singles_.load(); }
  int runs() const noexcept { return runs_.load(); }
  int wrong() const noexcept { return wrong_.load(); }

 private:
  void take(const ferry::Completion& c) noexcept {
    if (!c.ok() || c.rank != from_ || c.size != 8) wrong_.fetch_add(1);
    messages_.fetch_add(1);
  }
  const bool batches_;
  const int from_;
  std::atomic<int> messages_{0}, singles_{0}, runs_{0}, wrong_{0};
};

// Whether an object batches is asked once, when it is exposed. Over UCX alone (not lockless)
// a message for one that does not is signalled by itself from inside UCX's callback, never in
// a run; one that batches always gets its messages in runs. Every other path hands both runs.
// One message per link at a time (a barrier after each), so a run staged for the second object
// never holds up the first's, and a small FERRY_PREPOST never runs out of posted receives
// (a message that waits for one goes through the poll).
TEST(Handler, AnObjectThatDoesNotBatchIsSignalledOneMessageAtATime) {
  constexpr int kEach = 30;
  ferry::Device& dev = rt().device();
  SignalProbe single(false, left());
  SignalProbe runs(true, left());
  ferry::Exposure ex1 = rt().expose(single, 14);
  ferry::Exposure ex2 = rt().expose(runs, 15);
  rt().barrier();
  const std::uint64_t v = 7;
  for (std::uint16_t target : {std::uint16_t{14}, std::uint16_t{15}}) {
    SignalProbe& probe = target == 14 ? single : runs;
    for (int i = 0; i < kEach; ++i) {
      (void)post_retry(dev, [&] { return dev.post_am({.rank = right(), .buffer = &v, .size = 8, .target = {target}}); });
      EXPECT_TRUE(wait_until(dev, [&] { return probe.messages() == i + 1; }))
          << "target " << target << ": " << probe.messages() << " of " << i + 1;
      rt().barrier();
    }
  }
  EXPECT_EQ(single.wrong(), 0);
  EXPECT_EQ(runs.wrong(), 0);
  EXPECT_EQ(runs.singles(), 0);
  EXPECT_GT(runs.runs(), 0);
  const bool ucx_only = rt().transport() == "ucx";
  const bool lockless = rt().options().settings.lock_model == ferry::LockModel::lockless;
  if (ucx_only && !lockless) {
    EXPECT_EQ(single.singles(), kEach);
    EXPECT_EQ(single.runs(), 0);
  } else if (rt().transport().find("ucx") == std::string::npos || lockless) {
    EXPECT_EQ(single.singles(), 0);
    EXPECT_GT(single.runs(), 0);
  }
  rt().barrier();
}

// Counts local completions and remembers whether any failed (any thread signals).
class SendCounter final : public ferry::CompletionObject {
 public:
  void signal(ferry::Completion&& c) noexcept override {
    if (!c.ok()) failed_.store(true);
    count_.fetch_add(1);
  }
  long count() const noexcept { return count_.load(); }
  bool failed() const noexcept { return failed_.load(); }

 private:
  std::atomic<long> count_{0};
  std::atomic<bool> failed_{false};
};

// A handler that answers from inside itself, as active-message code does. Over UCX the
// handler runs inside UCX's receive callback (the transport delivers inline) and its answer is
// posted from there, under every lock model: every size class (inline, eager, fragments,
// rendezvous) comes back whole, and the small ones in the order asked.
TEST(Handler, AnswersPostedFromInsideTheHandlerArrive) {
  ferry::Device& dev = rt().device();
  const std::vector<std::size_t> sz = {0, 8, 4080, 8192, 16385, 65536};
  constexpr int kEach = 25;
  const int total = kEach * static_cast<int>(sz.size());
  std::vector<std::vector<unsigned char>> mine;  // this rank's message of each size
  for (std::size_t size : sz) {
    mine.emplace_back(std::max<std::size_t>(size, 1));
    fill(mine.back().data(), size, rt().rank());
  }
  SendCounter sent;
  std::atomic<long> posted{0};
  std::atomic<int> asked{0}, answered{0}, bad{0};
  // Answers the handler could not post (retry), posted by the main loop in order; while any is
  // owed, or one is being posted (`draining`), later answers queue behind them.
  std::mutex owed_lock;
  std::deque<std::pair<int, ferry::Tag>> owed;
  bool draining = false;
  std::vector<int> next_small(2, 0);            // the handler's own (one poll at a time)
  std::vector<char> seen(static_cast<std::size_t>(total), 0);
  // A message of size sz[tag / kEach] to `to`, tagged `tag`, to `target`.
  auto post = [&](int to, ferry::Tag tag, std::uint16_t target) {
    const std::size_t k = tag / kEach;
    const ferry::Status s = dev.post_am(
        {.rank = to, .buffer = mine[k].data(), .size = sz[k], .target = {target}, .tag = tag, .local = &sent});
    if (s.is_posted()) posted.fetch_add(1);
    if (!s.is_retry() && !s.is_posted() && !s.is_done()) bad.fetch_add(1);
    return s;
  };
  auto well_formed = [&](const ferry::Completion& c, int from) {
    const std::size_t k = c.tag / kEach;
    return c.ok() && c.rank == from && c.tag < static_cast<ferry::Tag>(total) && c.size == sz[k] &&
           c.buffer.size() == sz[k] && first_mismatch(c.buffer.data(), c.size, from, c.size) < 0;
  };
  ferry::Handler asks([&](ferry::Completion&& c) {
    if (!well_formed(c, left())) {
      bad.fetch_add(1);
    } else {
      std::lock_guard<std::mutex> g(owed_lock);
      if (draining || !owed.empty() || post(c.rank, c.tag, 26).is_retry()) owed.emplace_back(c.rank, c.tag);
    }
    asked.fetch_add(1);
  });
  ferry::Handler answers([&](ferry::Completion&& c) {
    if (!well_formed(c, right())) {
      bad.fetch_add(1);
    } else {
      const std::size_t k = c.tag / kEach;
      if (k < 2 && static_cast<int>(c.tag % kEach) != next_small[k]++) bad.fetch_add(1);
      if (seen[c.tag]++ != 0) bad.fetch_add(1);
    }
    answered.fetch_add(1);
  });
  ferry::Exposure ex1 = rt().expose(asks, 25);
  ferry::Exposure ex2 = rt().expose(answers, 26);
  rt().barrier();
  for (int t = 0; t < total; ++t) (void)post_retry(dev, [&] { return post(right(), static_cast<ferry::Tag>(t), 25); });
  EXPECT_TRUE(wait_until(dev, [&] {
    std::unique_lock<std::mutex> g(owed_lock);
    while (!owed.empty()) {
      const auto [to, tag] = owed.front();
      draining = true;
      g.unlock();  // not held across the post: a combining lock model may run other threads' calls in it
      const bool retry = post(to, tag, 26).is_retry();
      g.lock();
      draining = false;
      if (retry) return false;
      owed.pop_front();
    }
    return asked.load() == total && answered.load() == total && sent.count() == posted.load();
  })) << "asked " << asked.load() << ", answered " << answered.load() << " of " << total;
  EXPECT_EQ(bad.load(), 0);
  EXPECT_FALSE(sent.failed());
  // Over UCX alone the questions reached the handler inside UCX's callback, except under
  // lockless, where they go through the poll; over every other transport, through the poll.
  const bool ucx_only = rt().transport() == "ucx";
  const bool lockless = rt().options().settings.lock_model == ferry::LockModel::lockless;
  if (ucx_only && !lockless) {
    EXPECT_GT(dev.stats().delivered_inline, 0u);
  } else if (rt().transport().find("ucx") == std::string::npos || lockless) {
    EXPECT_EQ(dev.stats().delivered_inline, 0u);
  }
  rt().barrier();
}

// A barrier called from inside a Handler, that is inside device 0's progress, through which
// the barrier's own steps arrive, is an error naming the call, not a wait that never ends
// (every rank's handler calls it, so without the check every rank would wait there forever);
// the runtime goes on working after it.
TEST(Handler, BarrierFromInsideAHandlerIsAnErrorNotAHang) {
  ferry::Device& dev = rt().device();
  std::atomic<int> ran{0};
  std::mutex what_lock;
  std::string what;
  ferry::Handler h([&](ferry::Completion&&) {
    try {
      rt().barrier();
    } catch (const ferry::Error& e) {
      std::lock_guard<std::mutex> g(what_lock);
      what = e.what();
    }
    ran.fetch_add(1);
  });
  ferry::Exposure ex = rt().expose(h, 27);
  rt().barrier();
  std::uint64_t v = 1;
  (void)post_retry(dev, [&] { return dev.post_am({.rank = right(), .buffer = &v, .size = 8, .target = {27}}); });
  EXPECT_TRUE(wait_until(dev, [&] { return ran.load() == 1; }));
  {
    std::lock_guard<std::mutex> g(what_lock);
    EXPECT_NE(what.find("barrier: called from inside device 0's progress"), std::string::npos) << what;
  }
  rt().barrier();
}

TEST(RemoteTarget, MessagesSentBeforeTheTargetIsExposedWaitForIt) {
  ferry::Device& dev = rt().device();
  std::uint64_t v = 7;
  (void)post_retry(dev, [&] { return dev.post_am({.rank = right(), .buffer = &v, .size = 8, .target = {14}}); });
  rt().barrier();  // the message has had every chance to arrive before anyone exposes 14
  ferry::CompletionQueue late;
  ferry::Exposure ex = rt().expose(late, 14);
  ferry::Completion c = pop_one(dev, late);
  EXPECT_EQ(c.rank, left());
  ASSERT_EQ(c.size, 8u);
  std::uint64_t got;
  std::memcpy(&got, c.buffer.data(), 8);
  EXPECT_EQ(got, 7u);
  rt().barrier();
}

namespace {

// A mapping of its own, advised onto 2 MiB pages where the host grants them (transparent huge
// pages "always" or "madvise"): 2 GiB in 4 KiB pages is half a million page faults and, over
// cross-memory attach, as many pages pinned one at a time. What the test checks, sizes and
// offsets past 32 bits, does not depend on the pages.
class LargeBuffer {
 public:
  explicit LargeBuffer(std::size_t size) : size_(size) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      error_ = errno;
      return;
    }
    (void)::madvise(p, size, MADV_HUGEPAGE);  // a hint: refused, the pages stay 4 KiB
    data_ = static_cast<unsigned char*>(p);
  }
  LargeBuffer(const LargeBuffer&) = delete;
  LargeBuffer& operator=(const LargeBuffer&) = delete;
  ~LargeBuffer() {
    if (data_ != nullptr) ::munmap(data_, size_);
  }
  unsigned char* get() const { return data_; }
  int error() const { return error_; }

 private:
  unsigned char* data_ = nullptr;
  std::size_t size_;
  int error_ = 0;
};

}  // namespace

TEST(Large, SendRecvBeyondTwoGiB) {
  if (std::getenv("FERRY_TEST_LARGE") == nullptr) GTEST_SKIP() << "set FERRY_TEST_LARGE=1 to move > 2 GiB";
  ferry::Device& dev = rt().device();
  const std::size_t size = (std::size_t{1} << 31) + 4096 + 7;
  // Ranks 0 and 1 map their buffers first and agree that both could: a rank that could not
  // fails here with its reason, and neither waits for a transfer that will not come.
  std::optional<LargeBuffer> buf;
  if (rt().rank() < 2) buf.emplace(size);
  const int map_error = buf && buf->get() == nullptr ? buf->error() : 0;
  const std::vector<int> errors = allgather<int>("mp.large.map_error", map_error);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(errors[static_cast<std::size_t>(r)], 0)
        << "rank " << r << ": mmap of " << size << " bytes: " << std::strerror(errors[static_cast<std::size_t>(r)]);
  }
  if (rt().rank() == 0) {
    fill(buf->get(), size, 0);
    ferry::Synchronizer ss(1);
    const ferry::Status s =
        post_retry(dev, [&] { return dev.post_send({.rank = 1, .buffer = buf->get(), .size = size, .tag = 9, .local = &ss}); });
    finish(dev, s, ss);
  } else if (rt().rank() == 1) {
    ferry::Synchronizer rs(1);
    (void)post_retry(dev, [&] { return dev.post_recv({.rank = 0, .buffer = buf->get(), .size = size, .tag = 9, .local = &rs}); });
    ASSERT_TRUE(wait_until(dev, [&] { return rs.test(); }, 600));
    ASSERT_TRUE(rs.results()[0].ok()) << rs.results()[0].error_string();
    EXPECT_EQ(rs.results()[0].size, size);
    EXPECT_EQ(first_mismatch(buf->get(), size, 0, size), -1);
  }
  rt().barrier();
}
