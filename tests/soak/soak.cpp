// ferry-soak — random operations of every kind between every pair of ranks, every byte checked,
// each message delivered exactly once.
//
// Each rank runs --threads threads; together they perform --ops random operations, each to a
// random peer:
//  - am:   an active message to the peer's inbox of the sending thread's number;
//  - send: a tagged send, taken by the wildcard receives (any_source, any_tag) every thread
//          keeps posted;
//  - put:  a put with notification into the sending thread's own slot of the peer's region,
//          then a get of the same bytes back, compared with what was put.
// A message's size (0 B to --max-size, mostly small), tag and bytes all derive from (sender,
// thread, kind, target, sequence number), so the receiver recomputes and checks each one and
// marks its sequence number seen: a second arrival is a duplicate. At the end every rank tells
// each peer how many of each kind it sent; the rank passes when exactly those arrived, none
// twice, none corrupt and no operation failed. Prints one JSON object per rank on stdout
// (--json FILE also writes it there): operations, bytes, errors, lost, duplicates.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

enum Kind : unsigned { kAm = 0, kSend = 1, kPut = 2, kKinds = 3 };
const char* const kKindNames[kKinds] = {"am", "send", "put"};

constexpr std::uint16_t kNotifyBox = 1;  // put notifications
constexpr std::uint16_t kCountBox = 2;   // the final counts
constexpr std::uint16_t kFirstInbox = 3; // inbox of thread t: kFirstInbox + t
constexpr int kRecvsPerThread = 4;       // wildcard receives each thread keeps posted
constexpr int kWindow = 32;              // operations a thread may have in flight
constexpr std::size_t kWindowBytes = 131072;  // the largest message that goes through the window
constexpr double kDrainSeconds = 120;    // after the last post, the time every message gets

int g_rank = -1;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "rank %d: FAIL: %s\n", g_rank, what.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::uint64_t message_key(int src, int thread, unsigned kind, int dst, std::uint32_t seq) {
  return mix(mix((static_cast<std::uint64_t>(src) << 32) | static_cast<std::uint32_t>(dst)) ^
             (static_cast<std::uint64_t>(thread) << 40) ^ (static_cast<std::uint64_t>(kind) << 56) ^ seq);
}

// Mostly small: 70% up to 256 B, 20% up to 16 KiB, 9% up to 128 KiB, 1% up to max.
std::size_t message_size(std::uint64_t key, std::size_t max) {
  const std::uint64_t roll = key % 1000, r = key >> 10;
  std::size_t size;
  if (roll < 700) size = r % 257;
  else if (roll < 900) size = 257 + r % (16384 - 256);
  else if (roll < 990) size = 16385 + r % (131072 - 16384);
  else size = 131073 + r % (max > 131073 ? max - 131072 : 1);
  return size < max ? size : max;
}

void fill(unsigned char* p, std::size_t n, std::uint64_t key) {
  std::size_t i = 0;
  for (std::uint64_t w = 0; i + 8 <= n; i += 8, ++w) {
    const std::uint64_t v = mix(key ^ w);
    std::memcpy(p + i, &v, 8);
  }
  if (i < n) {
    const std::uint64_t v = mix(key ^ (i / 8));
    std::memcpy(p + i, &v, n - i);
  }
}

bool intact(const unsigned char* p, std::size_t n, std::uint64_t key) {
  std::size_t i = 0;
  for (std::uint64_t w = 0; i + 8 <= n; i += 8, ++w) {
    const std::uint64_t v = mix(key ^ w);
    if (std::memcmp(p + i, &v, 8) != 0) return false;
  }
  if (i < n) {
    const std::uint64_t v = mix(key ^ (i / 8));
    if (std::memcmp(p + i, &v, n - i) != 0) return false;
  }
  return true;
}

ferry::Tag message_tag(int thread, std::uint32_t seq) { return (static_cast<ferry::Tag>(thread) << 24) | (seq & 0xFFFFFF); }

struct Settings {
  long ops = 100000;
  int threads = 8;
  std::size_t max_size = 1 << 20;
  std::uint64_t seed = 1;
  std::string json_path;
};

// What arrived at this rank, by (source rank, source thread, kind): the sequence numbers seen.
class Ledger {
 public:
  Ledger(int ranks, int threads) : threads_(threads), seen_(static_cast<std::size_t>(ranks * threads * kKinds)) {}

  // Records `seq` of the stream; false if it had arrived before.
  bool record(int src, int thread, unsigned kind, std::uint32_t seq) {
    std::lock_guard<std::mutex> g(mutex_);
    std::vector<bool>& s = seen_[index(src, thread, kind)];
    if (s.size() <= seq) s.resize(seq + 1, false);
    if (s[seq]) return false;
    s[seq] = true;
    ++arrived_[kind];
    return true;
  }
  // Of the first `sent` sequence numbers of the stream, how many never arrived; and how many
  // arrived beyond them (sent by no one).
  long missing(int src, int thread, unsigned kind, std::uint32_t sent, long& extra) {
    std::lock_guard<std::mutex> g(mutex_);
    const std::vector<bool>& s = seen_[index(src, thread, kind)];
    long miss = 0;
    for (std::uint32_t q = 0; q < sent; ++q)
      if (q >= s.size() || !s[q]) ++miss;
    for (std::size_t q = sent; q < s.size(); ++q)
      if (s[q]) ++extra;
    return miss;
  }
  long arrived(unsigned kind) {
    std::lock_guard<std::mutex> g(mutex_);
    return arrived_[kind];
  }

 private:
  std::size_t index(int src, int thread, unsigned kind) const {
    return (static_cast<std::size_t>(src) * static_cast<std::size_t>(threads_) + static_cast<std::size_t>(thread)) * kKinds + kind;
  }
  int threads_;
  std::mutex mutex_;
  std::vector<std::vector<bool>> seen_;
  long arrived_[kKinds] = {};
};

struct Totals {
  std::atomic<long> ops{0}, bytes{0}, errors{0}, corrupt{0}, duplicates{0}, retries{0};
  std::atomic<long> by_kind[kKinds] = {};
};

class Soak {
 public:
  Soak(ferry::Runtime& rt, const Settings& s)
      : rt_(rt), dev_(rt.device()), s_(s), me_(rt.rank()), n_(rt.size()), ledger_(n_, s.threads),
        sent_(static_cast<std::size_t>(n_ * s.threads * kKinds)) {
    for (auto& c : sent_) c.store(0, std::memory_order_relaxed);
    slot_bytes_ = s_.max_size > 0 ? s_.max_size : 1;
    region_.resize(static_cast<std::size_t>(n_ * s_.threads) * slot_bytes_);
    region_mr_ = dev_.register_memory(region_.data(), region_.size());
    const ferry::RemoteKey mine = region_mr_.remote_key();
    rt_.kv_put("soak.key", std::string(reinterpret_cast<const char*>(&mine), sizeof mine));
    inboxes_.reserve(static_cast<std::size_t>(s_.threads));
    for (int t = 0; t < s_.threads; ++t) {
      inboxes_.push_back(std::make_unique<ferry::CompletionQueue>());
      exposures_.push_back(rt_.expose(*inboxes_.back(), static_cast<std::uint16_t>(kFirstInbox + t)));
    }
    exposures_.push_back(rt_.expose(notify_box_, kNotifyBox));
    exposures_.push_back(rt_.expose(count_box_, kCountBox));
    rt_.kv_fence();
    keys_.resize(static_cast<std::size_t>(n_));
    for (int r = 0; r < n_; ++r) {
      const std::string k = rt_.kv_get(r, "soak.key");
      if (k.size() != sizeof(ferry::RemoteKey)) die("rank " + std::to_string(r) + "'s region key has " + std::to_string(k.size()) + " bytes");
      std::memcpy(&keys_[static_cast<std::size_t>(r)], k.data(), sizeof(ferry::RemoteKey));
    }
  }

  json run() {
    rt_.barrier();
    const auto start = Clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < s_.threads; ++t) pool.emplace_back([this, t] { worker(t); });
    // The workers post, then serve their inboxes until finish() has seen everything arrive.
    while (done_posting_.load(std::memory_order_acquire) < s_.threads) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const double post_seconds = seconds_since(start);
    finish();
    finished_.store(true, std::memory_order_release);
    for (auto& th : pool) th.join();
    rt_.barrier();  // no rank leaves while another still waits for its messages
    const double seconds = seconds_since(start);
    return report(post_seconds, seconds);
  }

 private:
  struct RecvSlot {
    std::vector<unsigned char> buffer;
  };

  static double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

  std::atomic<long>& sent_count(int dst, int thread, unsigned kind) {
    return sent_[(static_cast<std::size_t>(dst) * static_cast<std::size_t>(s_.threads) + static_cast<std::size_t>(thread)) * kKinds + kind];
  }

  void check_message(unsigned kind, int src, ferry::Tag tag, const unsigned char* data, std::size_t size) {
    const int thread = static_cast<int>(tag >> 24);
    const std::uint32_t seq = tag & 0xFFFFFF;
    if (src < 0 || src >= n_ || thread >= s_.threads) {
      ++totals_.corrupt;
      die(std::string(kKindNames[kind]) + " with source " + std::to_string(src) + " and tag " + std::to_string(tag) + " names no stream");
    }
    const std::uint64_t key = message_key(src, thread, kind, me_, seq);
    const std::size_t expect = message_size(key, s_.max_size);
    if (size != expect || !intact(data, size, key)) {
      ++totals_.corrupt;
      die(std::string(kKindNames[kind]) + " " + std::to_string(seq) + " of rank " + std::to_string(src) + " thread " +
          std::to_string(thread) + ": " + std::to_string(size) + " bytes, expected " + std::to_string(expect) +
          (size == expect ? ", bytes differ" : ""));
    }
    if (!ledger_.record(src, thread, kind, seq)) {
      ++totals_.duplicates;
      die(std::string(kKindNames[kind]) + " " + std::to_string(seq) + " of rank " + std::to_string(src) + " thread " +
          std::to_string(thread) + " arrived twice");
    }
  }

  void error(const ferry::Completion& c, const char* what) {
    ++totals_.errors;
    die(std::string(what) + " failed: " + c.error_string() + " (rank " + std::to_string(c.rank) + ")");
  }

  void post_recv(int t, RecvSlot& slot) {
    for (;;) {
      const ferry::Status s = dev_.post_recv({.rank = ferry::any_source, .buffer = slot.buffer.data(), .size = slot.buffer.size(),
                                              .tag = ferry::any_tag, .local = &recv_queues_[static_cast<std::size_t>(t)], .context = &slot});
      if (s.is_retry()) {
        ++totals_.retries;
        dev_.progress();
        continue;
      }
      if (s.is_done()) {  // an unexpected message matched at once
        check_message(kSend, s.rank, s.tag, slot.buffer.data(), s.size);
        continue;
      }
      if (!s.is_posted()) die(std::string("post_recv: ") + ferry::to_string(s.kind));
      return;
    }
  }

  // Takes in whatever arrived for thread `t`: its inbox, its receives, and (shared) put
  // notifications and final counts.
  void serve(int t) {
    dev_.progress();
    while (auto c = inboxes_[static_cast<std::size_t>(t)]->pop()) {
      if (!c->ok()) error(*c, "an active message");
      check_message(kAm, c->rank, c->tag, static_cast<const unsigned char*>(c->buffer.data()), c->buffer.size());
    }
    while (auto c = recv_queues_[static_cast<std::size_t>(t)].pop()) {
      if (!c->ok()) error(*c, "a wildcard receive");
      auto* slot = static_cast<RecvSlot*>(c->context);
      check_message(kSend, c->rank, c->tag, slot->buffer.data(), c->size);
      post_recv(t, *slot);
    }
    while (auto c = notify_box_.pop()) {
      if (!c->ok()) error(*c, "a put notification");
      const int thread = static_cast<int>(c->tag >> 12);
      if (c->rank < 0 || c->rank >= n_ || thread >= s_.threads) die("a put notification names no stream: tag " + std::to_string(c->tag));
      // Notifications of one thread's puts may overtake each other; their count is checked.
      std::lock_guard<std::mutex> g(notify_mutex_);
      notified_[static_cast<std::size_t>(c->rank * s_.threads + thread)] += 1;
    }
  }

  // Waits for one completion on `local` (thread t serving its inbox meanwhile); the window
  // slot it names (context: slot + 1) is free again.
  void await(int t, ferry::CompletionQueue& local, long& in_flight, const char* what) {
    const auto start = Clock::now();
    for (;;) {
      if (auto c = local.pop()) {
        if (!c->ok()) error(*c, what);
        --in_flight;
        if (c->context != nullptr) free_slots_[static_cast<std::size_t>(t)].push_back(reinterpret_cast<std::intptr_t>(c->context) - 1);
        return;
      }
      serve(t);
      if (seconds_since(start) > kDrainSeconds) die(std::string("a local completion of ") + what + " never came");
    }
  }

  void worker(int t) {
    std::mt19937_64 rng(mix(s_.seed ^ (static_cast<std::uint64_t>(me_) << 20) ^ static_cast<std::uint64_t>(t)));
    std::vector<RecvSlot> slots(kRecvsPerThread);
    for (auto& slot : slots) slot.buffer.resize(s_.max_size);
    for (auto& slot : slots) post_recv(t, slot);
    // Source buffers: one per window slot, so a message in flight keeps its bytes; a message
    // larger than kWindowBytes waits for the window to drain and uses `big`.
    std::vector<std::vector<unsigned char>> out(kWindow, std::vector<unsigned char>(std::min(s_.max_size, kWindowBytes)));
    std::vector<unsigned char> big(s_.max_size), back(s_.max_size);
    ferry::CompletionQueue local;
    long in_flight = 0;
    std::vector<std::uint32_t> seq(static_cast<std::size_t>(n_ * kKinds), 0);
    const long my_ops = s_.ops / s_.threads + (t < s_.ops % s_.threads ? 1 : 0);
    free_slots_[static_cast<std::size_t>(t)].clear();
    for (std::intptr_t k = kWindow - 1; k >= 0; --k) free_slots_[static_cast<std::size_t>(t)].push_back(k);
    for (long i = 0; i < my_ops; ++i) {
      const unsigned roll = static_cast<unsigned>(rng() % 100);
      const unsigned kind = roll < 40 ? kAm : roll < 75 ? kSend : kPut;
      int dst = n_ == 1 ? 0 : static_cast<int>(rng() % static_cast<std::uint64_t>(n_ - 1));
      if (n_ > 1 && dst >= me_) ++dst;
      std::uint32_t& q = seq[static_cast<std::size_t>(dst * kKinds + static_cast<int>(kind))];
      if (q > 0xFFFFFF) die("more than 2^24 operations of one kind from one thread to one peer");
      const std::uint64_t key = message_key(me_, t, kind, dst, q);
      const std::size_t size = message_size(key, s_.max_size);
      // A message keeps its window slot until its local completion: wait for a free one (a
      // large message, or a put, for all of them: `big` and the region slot are single).
      std::vector<std::intptr_t>& free_slots = free_slots_[static_cast<std::size_t>(t)];
      const bool alone = size > kWindowBytes || kind == kPut;
      while (alone ? in_flight > 0 : free_slots.empty()) await(t, local, in_flight, kKindNames[kind]);
      std::intptr_t slot = -1;
      if (!alone) {
        slot = free_slots.back();
        free_slots.pop_back();
      }
      std::vector<unsigned char>& buf = alone ? big : out[static_cast<std::size_t>(slot)];
      void* const context = alone ? nullptr : reinterpret_cast<void*>(slot + 1);
      fill(buf.data(), size, key);
      if (kind == kPut) {
        const std::size_t offset = (static_cast<std::size_t>(me_) * static_cast<std::size_t>(s_.threads) + static_cast<std::size_t>(t)) * slot_bytes_;
        post_until_taken(t, [&] {
          return dev_.post_put({.rank = dst, .buffer = buf.data(), .size = size, .remote = keys_[static_cast<std::size_t>(dst)],
                                .offset = offset, .local = &local, .notify = true, .notify_target = {kNotifyBox},
                                .notify_tag = static_cast<ferry::Tag>((t << 12) | (q & 0xFFF))});
        }, in_flight);
        while (in_flight > 0) await(t, local, in_flight, "a put");
        std::memset(back.data(), 0xA5, size);
        post_until_taken(t, [&] {
          return dev_.post_get({.rank = dst, .buffer = back.data(), .size = size, .remote = keys_[static_cast<std::size_t>(dst)],
                                .offset = offset, .local = &local});
        }, in_flight);
        while (in_flight > 0) await(t, local, in_flight, "a get");
        if (!intact(back.data(), size, key)) {
          ++totals_.corrupt;
          die("put " + std::to_string(q) + " to rank " + std::to_string(dst) + ": the bytes read back differ");
        }
      } else {
        const ferry::Tag tag = message_tag(t, q);
        post_until_taken(t, [&] {
          if (kind == kAm) {
            return dev_.post_am({.rank = dst, .buffer = buf.data(), .size = size,
                                 .target = {static_cast<std::uint16_t>(kFirstInbox + t)}, .tag = tag, .local = &local,
                                 .context = context});
          }
          return dev_.post_send({.rank = dst, .buffer = buf.data(), .size = size, .tag = tag, .local = &local, .context = context});
        }, in_flight, slot);
      }
      ++q;
      sent_count(dst, t, kind).fetch_add(1, std::memory_order_relaxed);
      ++totals_.ops;
      ++totals_.by_kind[kind];
      totals_.bytes += static_cast<long>(size);
      if ((i & 7) == 0) serve(t);
    }
    while (in_flight > 0) await(t, local, in_flight, "an operation");
    done_posting_.fetch_add(1, std::memory_order_release);  // its sent_ counts are final
    // Keep serving until the whole job has arrived (finish() ends it).
    while (!finished_.load(std::memory_order_acquire)) serve(t);
    // Receives still posted complete at finalize; their buffers must outlive the runtime's
    // teardown, so they stay with the Soak.
    std::lock_guard<std::mutex> g(leftover_mutex_);
    leftover_slots_.push_back(std::move(slots));
  }

  // Posts until the post is taken; `slot` (a window slot, or -1) is free again at once when
  // the operation was done at once.
  template <class Post>
  void post_until_taken(int t, Post post, long& in_flight, std::intptr_t slot = -1) {
    const auto start = Clock::now();
    for (;;) {
      const ferry::Status s = post();
      if (s.is_posted()) {
        ++in_flight;
        return;
      }
      if (s.is_done()) {
        if (slot >= 0) free_slots_[static_cast<std::size_t>(t)].push_back(slot);
        return;
      }
      if (s.is_failed()) die("a post failed naming rank " + std::to_string(s.rank));
      ++totals_.retries;
      serve(t);
      if (seconds_since(start) > kDrainSeconds) die("a post was refused (retry) for " + std::to_string(kDrainSeconds) + " s");
    }
  }

  // Every rank tells every peer what it sent; then everything is served until what arrived
  // matches, or the drain time runs out (whatever is missing then is lost).
  void finish() {
    for (int dst = 0; dst < n_; ++dst) {
      std::vector<std::uint32_t> counts(static_cast<std::size_t>(s_.threads * kKinds));
      for (int t = 0; t < s_.threads; ++t)
        for (unsigned k = 0; k < kKinds; ++k)
          counts[static_cast<std::size_t>(t * kKinds + static_cast<int>(k))] = static_cast<std::uint32_t>(sent_count(dst, t, k).load());
      for (;;) {
        const ferry::Status s = dev_.post_am({.rank = dst, .buffer = counts.data(), .size = counts.size() * sizeof(std::uint32_t),
                                              .target = {kCountBox}, .local = &count_sends_});
        if (s.is_retry()) {
          dev_.progress();
          continue;
        }
        if (s.is_posted()) ++count_sends_posted_;
        else if (!s.is_done()) die(std::string("sending the counts: ") + ferry::to_string(s.kind));
        break;
      }
    }
    std::vector<std::vector<std::uint32_t>> expected(static_cast<std::size_t>(n_));
    int reported = 0;
    const auto start = Clock::now();
    auto complete = [&] {
      if (reported < n_) return false;
      for (int src = 0; src < n_; ++src) {
        for (int t = 0; t < s_.threads; ++t) {
          long extra = 0;
          if (ledger_.missing(src, t, kAm, expected[static_cast<std::size_t>(src)][static_cast<std::size_t>(t * kKinds + kAm)], extra) != 0) return false;
          if (ledger_.missing(src, t, kSend, expected[static_cast<std::size_t>(src)][static_cast<std::size_t>(t * kKinds + kSend)], extra) != 0) return false;
          std::lock_guard<std::mutex> g(notify_mutex_);
          if (notified_[static_cast<std::size_t>(src * s_.threads + t)] < expected[static_cast<std::size_t>(src)][static_cast<std::size_t>(t * kKinds + kPut)]) return false;
        }
      }
      return true;
    };
    for (;;) {
      dev_.progress();
      while (auto c = count_box_.pop()) {
        if (!c->ok()) error(*c, "the counts");
        if (c->rank < 0 || c->rank >= n_ || c->buffer.size() != static_cast<std::size_t>(s_.threads * kKinds) * sizeof(std::uint32_t))
          die("counts from rank " + std::to_string(c->rank) + " have " + std::to_string(c->buffer.size()) + " bytes");
        auto& e = expected[static_cast<std::size_t>(c->rank)];
        e.resize(static_cast<std::size_t>(s_.threads * kKinds));
        std::memcpy(e.data(), c->buffer.data(), c->buffer.size());
        ++reported;
      }
      while (auto c = count_sends_.pop()) {
        if (!c->ok()) error(*c, "sending the counts");
        --count_sends_posted_;
      }
      if (count_sends_posted_ == 0 && complete()) break;
      if (seconds_since(start) > kDrainSeconds) break;
      std::this_thread::yield();
    }
    // Tally: lost (sent, never arrived), extra (arrived, never sent), notifications.
    for (int src = 0; src < n_ && reported == n_; ++src) {
      for (int t = 0; t < s_.threads; ++t) {
        const auto& e = expected[static_cast<std::size_t>(src)];
        long extra = 0;
        lost_ += ledger_.missing(src, t, kAm, e[static_cast<std::size_t>(t * kKinds + kAm)], extra);
        lost_ += ledger_.missing(src, t, kSend, e[static_cast<std::size_t>(t * kKinds + kSend)], extra);
        extra_ += extra;
        const long notes = notified_[static_cast<std::size_t>(src * s_.threads + t)];
        const long puts = e[static_cast<std::size_t>(t * kKinds + kPut)];
        if (notes < puts) lost_ += puts - notes;
        if (notes > puts) totals_.duplicates += notes - puts;
      }
    }
    if (reported < n_) lost_counts_ = n_ - reported;
  }

  json report(double post_seconds, double seconds) {
    json j;
    j["rank"] = me_;
    j["ranks"] = n_;
    j["threads"] = s_.threads;
    j["lock_model"] = rt_.options().value("lock_model");
    j["transport"] = rt_.transport();
    j["max_size"] = s_.max_size;
    j["seed"] = s_.seed;
    j["operations"] = totals_.ops.load();
    for (unsigned k = 0; k < kKinds; ++k) j["operations_" + std::string(kKindNames[k])] = totals_.by_kind[k].load();
    j["bytes"] = totals_.bytes.load();
    j["arrived_am"] = ledger_.arrived(kAm);
    j["arrived_send"] = ledger_.arrived(kSend);
    j["errors"] = totals_.errors.load();
    j["corrupt"] = totals_.corrupt.load();
    j["duplicates"] = totals_.duplicates.load();
    j["lost"] = lost_;
    j["unannounced"] = extra_;
    j["ranks_without_counts"] = lost_counts_;
    j["retries"] = totals_.retries.load();
    j["post_seconds"] = post_seconds;
    j["seconds"] = seconds;
    j["ok"] = totals_.errors == 0 && totals_.corrupt == 0 && totals_.duplicates == 0 && lost_ == 0 && extra_ == 0 && lost_counts_ == 0;
    return j;
  }

  ferry::Runtime& rt_;
  ferry::Device& dev_;
  Settings s_;
  int me_, n_;
  Ledger ledger_;
  std::vector<std::atomic<long>> sent_;  // by (dst, thread, kind); relaxed: read after the threads joined
  std::size_t slot_bytes_ = 1;
  std::vector<unsigned char> region_;
  ferry::MemoryRegion region_mr_;
  std::vector<ferry::RemoteKey> keys_;
  std::vector<std::unique_ptr<ferry::CompletionQueue>> inboxes_;
  std::vector<ferry::CompletionQueue> recv_queues_ = std::vector<ferry::CompletionQueue>(static_cast<std::size_t>(s_.threads));
  ferry::CompletionQueue notify_box_, count_box_, count_sends_;
  std::vector<ferry::Exposure> exposures_;
  std::mutex notify_mutex_;
  std::vector<long> notified_ = std::vector<long>(static_cast<std::size_t>(n_ * s_.threads), 0);
  long count_sends_posted_ = 0;
  long lost_ = 0, extra_ = 0, lost_counts_ = 0;
  Totals totals_;
  // By thread: its free window slots (only that thread touches its own).
  std::vector<std::vector<std::intptr_t>> free_slots_ = std::vector<std::vector<std::intptr_t>>(static_cast<std::size_t>(s_.threads));
  std::atomic<int> done_posting_{0};  // workers whose posts all completed
  std::atomic<bool> finished_{false};
  std::mutex leftover_mutex_;
  std::vector<std::vector<RecvSlot>> leftover_slots_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ferry-soak: random operations of every kind, every byte checked, exactly once"};
  Settings s;
  app.add_option("--ops", s.ops, "operations per rank, over all its threads")->check(CLI::Range(1L, 1L << 40));
  app.add_option("--threads", s.threads, "threads per rank (a put notification's tag holds 4 bits of it)")->check(CLI::Range(1, 16));
  app.add_option("--max-size", s.max_size, "largest message, put or get in bytes")->check(CLI::Range(std::size_t{1}, std::size_t{1} << 26));
  app.add_option("--seed", s.seed, "seed of every rank's random choices");
  app.add_option("--json", s.json_path, "also write this rank's JSON object to this file");
  CLI11_PARSE(app, argc, argv);
  json j;
  {
    ferry::Runtime rt;
    g_rank = rt.rank();
    if (rt.size() < 2) die("needs at least 2 ranks");
    Soak soak(rt, s);
    j = soak.run();
    rt.finalize();
  }
  const std::string line = j.dump();
  std::printf("%s\n", line.c_str());
  if (!s.json_path.empty()) std::ofstream(s.json_path) << line << "\n";
  return j["ok"].get<bool>() ? 0 : 1;
}
