// The ferry parcelport: header by active message into a completion queue, follow-ups by tagged
// send/recv (or one iovec active message), all completions through the same queue.
//
// Paths
//  - small parcel (no zero-copy chunk, nzc fits in the header): send() is one post_am; on the
//    receiver, one pop from the completion queue and handle_parcel with the nzc pointing into
//    ferry's packet (no copy, no allocation). No lock anywhere.
//  - parcel with follow-ups: one state record per parcel (heap) on each side; follow-ups are
//    posted all at once on the parcel's tag — ferry's matching is non-overtaking per (source,
//    tag), so they are received in order — and completions arrive through the same queue.
//  - back-pressure: a post that returns retry goes onto a deferred list (mutex, slow path)
//    that background_work drains with try_lock; send() never blocks.
#include "parcel/ferry_parcelport.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>

#include "ferry/error.hpp"
#include "ferry/ferry.hpp"

namespace ferry::parcel::detail {

namespace {

constexpr std::uint16_t kHeaderTarget = 1;

// What travels in front of every header: then zc_count sizes (u64), then the nzc if piggybacked.
struct WireHeader {
  std::uint32_t tag;       // follow-up tag; 0 when there are none
  std::uint32_t nzc_size;
  std::uint16_t zc_count;
  std::uint8_t piggyback;  // the nzc bytes follow the size table
  std::uint8_t device;     // the device the follow-ups use
  std::uint32_t reserved;
};
static_assert(sizeof(WireHeader) == 16);

void release_malloc(void*, void* data) noexcept { std::free(data); }

// Per-parcel state, the context of every follow-up completion of that parcel.
struct State {
  bool is_send;
};

struct SendState : State {
  std::atomic<std::size_t> remaining;
  SentCallback on_sent;
};

struct RecvState : State {
  int source;
  ferry::Tag tag;
  int device;
  bool awaiting_nzc;  // the nzc arrives as a follow-up; zc receives are posted after it
  std::vector<std::size_t> sizes;
  Parcel parcel;
  std::atomic<std::size_t> remaining;
};

class FerryTransport final : public Transport {
 public:
  FerryTransport(const TransportOptions& options, Upcalls& upcalls)
      : upcalls_(upcalls),
        rt_(RuntimeOptions{.devices = options.devices}),
        iovec_(options.iovec),
        tags_(static_cast<std::size_t>(rt_.device_count())) {
    exposure_ = rt_.expose(cq_, kHeaderTarget);
    max_header_ = rt_.device(0).eager_limit();
    if (options.max_header != 0 && options.max_header < max_header_) max_header_ = options.max_header;
    if (max_header_ < sizeof(WireHeader) + 8) {
      throw Error("TransportOptions::max_header=" + std::to_string(options.max_header) + " is too small");
    }
    for (auto& t : tags_) t.store(1, std::memory_order_relaxed);
    rt_.barrier();  // every locality listens before anyone sends
  }

  ~FerryTransport() override { rt_.finalize(); }

  int locality() const noexcept override { return rt_.rank(); }
  int size() const noexcept override { return rt_.size(); }
  std::string name() const override { return iovec_ ? "ferry(iovec)" : "ferry"; }
  std::uint64_t parcels_sent() const noexcept override { return sent_.load(std::memory_order_relaxed); }
  std::uint64_t parcels_delivered() const noexcept override { return delivered_.load(std::memory_order_relaxed); }

  void send(int dest, Parcel&& parcel, SentCallback on_sent) override {
    if (dest < 0 || dest >= size()) {
      throw Error("parcel send: destination=" + std::to_string(dest) + " is out of range; there are " +
                  std::to_string(size()) + " localities");
    }
    const int dev_index = thread_index() % rt_.device_count();
    Device& dev = rt_.device(dev_index);
    const std::size_t table = sizeof(WireHeader) + parcel.zc.size() * sizeof(std::uint64_t);
    if (table > max_header_ || parcel.zc.size() > 0xFFFF) {
      throw Error("parcel send: " + std::to_string(parcel.zc.size()) + " zero-copy chunks need a " +
                  std::to_string(table) + "-byte header; the limit is " + std::to_string(max_header_));
    }
    // In iovec mode the header shares its packet with the rendezvous descriptor of every part.
    const std::size_t room = iovec_ ? std::min(max_header_, dev.iovec_eager_limit(parcel.zc.size() + 1)) : max_header_;
    if (table > room) {
      throw Error("parcel send: " + std::to_string(parcel.zc.size()) + " zero-copy chunks need a " +
                  std::to_string(table) + "-byte header; the limit is " + std::to_string(room));
    }
    const bool piggyback = table + parcel.nzc.size <= room;
    const bool follow_ups = !piggyback || !parcel.zc.empty();
    sent_.fetch_add(1, std::memory_order_relaxed);

    // The header is built in a per-thread buffer: no allocation after the first parcel.
    thread_local std::vector<std::byte> scratch;
    if (scratch.size() < max_header_) scratch.resize(max_header_);
    WireHeader h{};
    h.nzc_size = static_cast<std::uint32_t>(parcel.nzc.size);
    h.zc_count = static_cast<std::uint16_t>(parcel.zc.size());
    h.piggyback = piggyback ? 1 : 0;
    h.device = static_cast<std::uint8_t>(dev_index);
    if (follow_ups) h.tag = next_tag(dev_index);
    if (parcel.nzc.size > 0xFFFFFFFFu) throw Error("parcel send: nzc.size=" + std::to_string(parcel.nzc.size) + " exceeds 4 GiB");
    std::byte* at = scratch.data() + sizeof(WireHeader);
    for (const Chunk& c : parcel.zc) {
      const std::uint64_t s = c.size;
      std::memcpy(at, &s, sizeof s);
      at += sizeof s;
    }
    if (piggyback && parcel.nzc.size != 0) {
      std::memcpy(at, parcel.nzc.data, parcel.nzc.size);
      at += parcel.nzc.size;
    }
    std::memcpy(scratch.data(), &h, sizeof h);
    const std::size_t header_size = static_cast<std::size_t>(at - scratch.data());

    if (!follow_ups) {
      post_header(dev, dest, scratch.data(), header_size);
      if (on_sent) on_sent();
      return;
    }
    auto* st = new SendState{};
    st->is_send = true;
    st->on_sent = std::move(on_sent);
    if (iovec_) {
      // One call: header as the eager part, then the nzc (if not piggybacked) and every zc chunk.
      AmIovecArgs args;
      args.rank = dest;
      args.eager = {scratch.data(), header_size};
      if (!piggyback) args.parts.push_back({parcel.nzc.data, parcel.nzc.size});
      for (const Chunk& c : parcel.zc) args.parts.push_back({c.data, c.size});
      args.target = {kHeaderTarget};
      args.local = &cq_;
      args.context = static_cast<State*>(st);
      st->remaining.store(1, std::memory_order_relaxed);
      // The header bytes live in `scratch`: a deferred post needs its own copy.
      post_deferrable(dev, [this, &dev, args, copy = std::vector<std::byte>(scratch.data(), scratch.data() + header_size)]() mutable {
        args.eager = {copy.data(), copy.size()};
        return dev.post_am_iovec(args);
      }, st);
      return;
    }
    std::vector<Chunk> chunks;
    chunks.reserve(parcel.zc.size() + 1);
    if (!piggyback) chunks.push_back(parcel.nzc);
    chunks.insert(chunks.end(), parcel.zc.begin(), parcel.zc.end());
    st->remaining.store(chunks.size(), std::memory_order_relaxed);
    post_header(dev, dest, scratch.data(), header_size);
    const ferry::Tag tag = h.tag;
    post_in_order(dev, std::move(chunks), st, [this, &dev, dest, tag, st](const Chunk& c) {
      return dev.post_send({.rank = dest, .buffer = c.data, .size = c.size, .tag = tag, .local = &cq_,
                            .context = static_cast<State*>(st)});
    });
  }

  bool background_work() override {
    const int n = rt_.device_count();
    const int mine = thread_index() % n;
    bool any = rt_.device(mine).progress();
    if (n > 1 && !any) {
      // Keep the other devices moving too: a worker-to-device map can leave one unpolled.
      const int other = (mine + 1 + static_cast<int>(rr_.fetch_add(1, std::memory_order_relaxed) % (n - 1))) % n;
      any = rt_.device(other).progress();
    }
    any |= run_deferred();
    for (int i = 0; i < 8; ++i) {
      auto c = cq_.pop();
      if (!c) break;
      any = true;
      handle(std::move(*c));
    }
    return any;
  }

  void barrier() override { rt_.barrier(); }

 private:
  ferry::Tag next_tag(int dev) {
    // Relaxed: a tag only has to differ from the tags of this device's other parcels in flight.
    ferry::Tag t = tags_[static_cast<std::size_t>(dev)].fetch_add(1, std::memory_order_relaxed) & ferry::max_tag;
    if (t == 0) t = tags_[static_cast<std::size_t>(dev)].fetch_add(1, std::memory_order_relaxed) & ferry::max_tag;
    return t;
  }

  void post_header(Device& dev, int dest, const std::byte* data, std::size_t size) {
    const AmArgs args{.rank = dest, .buffer = data, .size = size, .target = {kHeaderTarget}};
    for (int attempt = 0; attempt < 64; ++attempt) {
      const Status s = dev.post_am(args);
      if (!s.is_retry()) return;  // eager: done
      dev.progress();
    }
    std::vector<std::byte> copy(data, data + size);
    defer([&dev, dest, copy = std::move(copy)] {
      return !dev.post_am({.rank = dest, .buffer = copy.data(), .size = copy.size(), .target = {kHeaderTarget}}).is_retry();
    });
  }

  // Posts chunks in order with post_one; at the first retry the rest become one deferred step,
  // so a parcel's follow-ups (and their receives) are never posted out of order — ferry
  // matches them by (source, tag) in posting order.
  void post_in_order(Device& dev, std::vector<Chunk> chunks, State* st, std::function<Status(const Chunk&)> post_one) {
    std::size_t i = 0;
    for (; i < chunks.size(); ++i) {
      const Status s = post_one(chunks[i]);
      if (s.is_retry()) break;
      if (s.is_done()) finish_one(st, s);
    }
    if (i == chunks.size()) return;
    dev.progress();
    defer([this, chunks = std::move(chunks), i, st, post_one = std::move(post_one)]() mutable {
      for (; i < chunks.size(); ++i) {
        const Status s = post_one(chunks[i]);
        if (s.is_retry()) return false;
        if (s.is_done()) finish_one(st, s);
      }
      return true;
    });
  }

  // Posts now or later; a `done` result counts as an immediate completion of `st`.
  template <class Post>
  void post_deferrable(Device& dev, Post post, State* st) {
    const Status s = post();
    if (!s.is_retry()) {
      if (s.is_done()) finish_one(st, s);
      return;
    }
    dev.progress();
    defer([this, post = std::move(post), st]() mutable {
      const Status s2 = post();
      if (s2.is_retry()) return false;
      if (s2.is_done()) finish_one(st, s2);
      return true;
    });
  }

  void defer(std::function<bool()> step) {
    std::lock_guard<std::mutex> g(deferred_mutex_);
    deferred_.push_back(std::move(step));
    deferred_count_.store(deferred_.size(), std::memory_order_relaxed);
  }

  bool run_deferred() {
    // Relaxed: a stale zero only postpones the work to a later call.
    if (deferred_count_.load(std::memory_order_relaxed) == 0) return false;
    std::unique_lock<std::mutex> g(deferred_mutex_, std::try_to_lock);
    if (!g.owns_lock() || deferred_.empty()) return false;
    // Keep order: stop at the first step that still cannot go (follow-ups of one parcel in order).
    bool any = false;
    while (!deferred_.empty()) {
      if (!deferred_.front()()) break;
      deferred_.pop_front();
      any = true;
    }
    deferred_count_.store(deferred_.size(), std::memory_order_relaxed);
    return any;
  }

  void handle(Completion&& c) {
    if (c.op == OpKind::remote_am) {
      on_header(std::move(c));
      return;
    }
    auto* st = static_cast<State*>(c.context);
    if (!c.ok()) {
      std::fprintf(stderr, "ferry parcelport: locality %d: a follow-up %s with locality %d failed: %s\n", locality(),
                   to_string(c.op), c.rank, c.error_string().c_str());
    }
    finish_one(st, Status::make_done());
  }

  // One follow-up of `st` finished.
  void finish_one(State* st, const Status&) {
    if (st->is_send) {
      finish_send(static_cast<SendState*>(st));
    } else {
      finish_recv(static_cast<RecvState*>(st));
    }
  }

  // acq_rel: the last finisher must see every other finisher's effects before it frees or
  // delivers.
  void finish_send(SendState* s) {
    if (s->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      if (s->on_sent) s->on_sent();
      delete s;
    }
  }

  [[gnu::noinline]] void finish_recv(RecvState* r) {
    if (r->awaiting_nzc) {
      r->awaiting_nzc = false;
      start_zc(r);
      return;
    }
    if (r->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) deliver(r);
  }

  void on_header(Completion&& c) {
    const auto* base = static_cast<const std::byte*>(c.buffer.data());
    WireHeader h;
    if (c.buffer.size() < sizeof h) {
      std::fprintf(stderr, "ferry parcelport: locality %d: dropped a %zu-byte header from locality %d\n", locality(),
                   c.buffer.size(), c.rank);
      return;
    }
    std::memcpy(&h, base, sizeof h);
    const std::byte* at = base + sizeof h;
    std::vector<std::size_t> sizes(h.zc_count);
    for (auto& s : sizes) {
      std::uint64_t v;
      std::memcpy(&v, at, sizeof v);
      s = v;
      at += sizeof v;
    }
    if (!c.parts.empty()) {  // iovec: everything is here
      Parcel p;
      std::size_t k = 0;
      if (h.piggyback) {
        p.nzc = {const_cast<std::byte*>(at), h.nzc_size};
        p.nzc_storage = std::move(c.buffer);
      } else {
        p.nzc = {static_cast<std::byte*>(c.parts[0].data()), c.parts[0].size()};
        p.nzc_storage = std::move(c.parts[0]);
        k = 1;
      }
      for (; k < c.parts.size(); ++k) {
        p.zc.push_back({static_cast<std::byte*>(c.parts[k].data()), c.parts[k].size()});
        p.zc_storage.push_back(std::move(c.parts[k]));
      }
      delivered_.fetch_add(1, std::memory_order_relaxed);
      upcalls_.handle_parcel(c.rank, std::move(p));
      return;
    }
    if (h.piggyback && h.zc_count == 0) {  // the common small parcel: hand over ferry's buffer
      Parcel p;
      p.nzc = {const_cast<std::byte*>(at), h.nzc_size};
      p.nzc_storage = std::move(c.buffer);
      delivered_.fetch_add(1, std::memory_order_relaxed);
      upcalls_.handle_parcel(c.rank, std::move(p));
      return;
    }
    auto* r = new RecvState{};
    r->is_send = false;
    r->source = c.rank;
    r->tag = h.tag;
    r->device = h.device % rt_.device_count();
    r->sizes = std::move(sizes);
    if (h.piggyback) {
      r->parcel.nzc = {const_cast<std::byte*>(at), h.nzc_size};
      r->parcel.nzc_storage = std::move(c.buffer);
      r->awaiting_nzc = false;
      start_zc(r);
      return;
    }
    void* nzc = std::malloc(h.nzc_size != 0 ? h.nzc_size : 1);
    if (nzc == nullptr) throw Error("parcel receive: cannot allocate " + std::to_string(h.nzc_size) + " bytes");
    r->parcel.nzc = {static_cast<std::byte*>(nzc), h.nzc_size};
    r->parcel.nzc_storage = Buffer(nzc, h.nzc_size, &release_malloc, nullptr);
    r->awaiting_nzc = true;
    post_recvs(r, {r->parcel.nzc});
  }

  void start_zc(RecvState* r) {
    if (r->sizes.empty()) {
      deliver(r);
      return;
    }
    r->parcel.zc = upcalls_.allocate_zc_chunks(r->source, r->parcel.nzc, r->sizes);
    if (r->parcel.zc.size() != r->sizes.size()) {
      throw Error("allocate_zc_chunks returned " + std::to_string(r->parcel.zc.size()) + " chunks for " +
                  std::to_string(r->sizes.size()));
    }
    r->remaining.store(r->sizes.size(), std::memory_order_relaxed);
    for (std::size_t i = 0; i < r->sizes.size(); ++i) r->parcel.zc[i].size = r->sizes[i];
    post_recvs(r, r->parcel.zc);
  }

  void post_recvs(RecvState* r, std::vector<Chunk> into) {
    Device& dev = rt_.device(r->device);
    post_in_order(dev, std::move(into), r, [this, &dev, r](const Chunk& c) {
      return dev.post_recv({.rank = r->source, .buffer = c.data, .size = c.size, .tag = r->tag, .local = &cq_,
                            .context = static_cast<State*>(r)});
    });
  }

  void deliver(RecvState* r) {
    const int source = r->source;
    Parcel p = std::move(r->parcel);
    delete r;
    delivered_.fetch_add(1, std::memory_order_relaxed);
    upcalls_.handle_parcel(source, std::move(p));
  }

  Upcalls& upcalls_;
  Runtime rt_;
  bool iovec_;
  std::size_t max_header_ = 0;
  CompletionQueue cq_;
  Exposure exposure_;
  std::vector<std::atomic<std::uint32_t>> tags_;
  std::atomic<std::uint32_t> rr_{0};
  // Counters for termination detection. Relaxed: read only as sums, after quiescence.
  std::atomic<std::uint64_t> sent_{0};
  std::atomic<std::uint64_t> delivered_{0};
  std::mutex deferred_mutex_;
  std::deque<std::function<bool()>> deferred_;
  std::atomic<std::size_t> deferred_count_{0};
};

}  // namespace

std::unique_ptr<Transport> make_ferry_transport(const TransportOptions& options, Upcalls& upcalls) {
  return std::make_unique<FerryTransport>(options, upcalls);
}

}  // namespace ferry::parcel::detail
