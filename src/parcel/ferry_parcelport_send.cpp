// ferry_parcelport_send.cpp — the parcel send path: the header built in a per-thread buffer and
// posted (active message or header send), the follow-ups posted in order on the parcel's tag (or
// as one iovec active message), posts a retry defers, and a send's completion (finish_send).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ferry/error.hpp"
#include "parcel/check_parcel.hpp"
#include "parcel/ferry_parcelport_impl.hpp"
#include "parcel/header.hpp"

namespace ferry::parcel::detail {

void FerryParcelport::send(int dest, Parcel&& parcel, SentCallback on_sent) {
  if (dest < 0 || dest >= size()) {
    throw Error("parcel send: destination=" + std::to_string(dest) + " is out of range; the job has " +
                std::to_string(size()) + " ranks (0.." + std::to_string(size() - 1) + ")");
  }
  check_parcel_chunks("parcel send", parcel);
  const int dev_index = thread_index() % rt_.device_count();
  Device& dev = *devs_[static_cast<std::size_t>(dev_index)];
  const std::size_t table = sizeof(ParcelHeader) + parcel.zc.size() * sizeof(std::uint64_t);
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
  ParcelHeader h{};
  h.nzc_size = static_cast<std::uint32_t>(parcel.nzc.size);
  h.zc_count = static_cast<std::uint16_t>(parcel.zc.size());
  h.piggyback = piggyback ? 1 : 0;
  h.device = static_cast<std::uint8_t>(dev_index);
  if (follow_ups) h.tag = next_tag(dev_index);
  if (parcel.nzc.size > 0xFFFFFFFFu) throw Error("parcel send: nzc.size=" + std::to_string(parcel.nzc.size) + " exceeds 4 GiB");
  std::byte* at = scratch.data() + sizeof(ParcelHeader);
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
    post_header(dev, dest, scratch.data(), header_size, true);
    if (on_sent) on_sent();
    return;
  }
  auto* st = new SendState{};
  st->kind = StateKind::send;
  st->on_sent = std::move(on_sent);
  st->dest = dest;
  if (iovec_) {
    // One call: header as the eager part, then the nzc (if not piggybacked) and every zc chunk.
    AmIovecArgs args;
    args.rank = dest;
    args.eager = {scratch.data(), header_size};
    if (!piggyback) args.parts.push_back({parcel.nzc.data, parcel.nzc.size});
    for (const Chunk& c : parcel.zc) args.parts.push_back({c.data, c.size});
    args.target = {header_target(dev_index)};
    args.context = static_cast<State*>(st);
    st->remaining.store(1, std::memory_order_relaxed);
    // The header bytes live in `scratch`: a deferred post needs its own copy.
    post_deferrable(dev_index, [this, &dev, dev_index, args, copy = std::vector<std::byte>(scratch.data(), scratch.data() + header_size)]() mutable {
      args.eager = {copy.data(), copy.size()};
      return post_op(dev_index, [&](CompletionObject* local) {
        args.local = local;
        return dev.post_am_iovec(args);
      });
    }, st);
    return;
  }
  std::vector<Chunk> chunks;
  chunks.reserve(parcel.zc.size() + 1);
  if (!piggyback) chunks.push_back(parcel.nzc);
  chunks.insert(chunks.end(), parcel.zc.begin(), parcel.zc.end());
  st->remaining.store(chunks.size(), std::memory_order_relaxed);
  post_header(dev, dest, scratch.data(), header_size, false);
  const ferry::Tag tag = h.tag;
  post_in_order(dev_index, std::move(chunks), st, [this, &dev, dev_index, dest, tag, st](const Chunk& c) {
    return post_op(dev_index, [&](CompletionObject* local) {
      return dev.post_send({.rank = dest, .buffer = c.data, .size = c.size, .tag = tag, .local = local,
                            .context = static_cast<State*>(st)});
    });
  });
}

ferry::Tag FerryParcelport::next_tag(int dev) {
  // Relaxed: a tag only has to differ from the tags of this device's other parcels in flight.
  // Never 0 (no follow-ups) and never the header tag.
  for (;;) {
    const ferry::Tag t = tags_[static_cast<std::size_t>(dev)].fetch_add(1, std::memory_order_relaxed) & ferry::max_tag;
    if (t != 0 && t != kHeaderTag) return t;
  }
}

Status FerryParcelport::post_header_once(Device& dev, int dest, const std::byte* data, std::size_t size) {
  if (sendrecv_) return dev.post_send({.rank = dest, .buffer = data, .size = size, .tag = kHeaderTag});
  return dev.post_am({.rank = dest, .buffer = data, .size = size, .target = {header_target(dev.index())}});
}

// `report`: a header-only parcel, whose failure the header reports (send_failed); a parcel
// with follow-ups reports it once, through them (they go to the same failed rank).
void FerryParcelport::post_header(Device& dev, int dest, const std::byte* data, std::size_t size, bool report) {
  for (int attempt = 0; attempt < 64; ++attempt) {
    const Status s = post_header_once(dev, dest, data, size);
    if (s.is_failed() && report) upcalls_.send_failed(dest, peer_failed_error);
    if (!s.is_retry()) return;  // eager: done
    dev.progress();
  }
  std::vector<std::byte> copy(data, data + size);
  defer([this, &dev, dest, report, copy = std::move(copy)] {
    const Status s = post_header_once(dev, dest, copy.data(), copy.size());
    if (s.is_failed() && report) upcalls_.send_failed(dest, peer_failed_error);
    return !s.is_retry();
  });
}

// Posts chunks in order with post_one; at the first retry the rest become one deferred step,
// so a parcel's follow-ups (and their receives) are never posted out of order — ferry
// matches them by (source, tag) in posting order.
void FerryParcelport::post_in_order(int d, std::vector<Chunk> chunks, State* st,
                                    std::function<Status(const Chunk&)> post_one) {
  std::size_t i = 0;
  for (; i < chunks.size(); ++i) {
    const Status s = post_one(chunks[i]);
    if (s.is_retry()) break;
    if (s.is_done() || s.is_failed()) finish_one(st, s);
  }
  if (i == chunks.size()) return;
  progress_device(d);
  defer([this, chunks = std::move(chunks), i, st, post_one = std::move(post_one)]() mutable {
    for (; i < chunks.size(); ++i) {
      const Status s = post_one(chunks[i]);
      if (s.is_retry()) return false;
      if (s.is_done() || s.is_failed()) finish_one(st, s);
    }
    return true;
  });
}

// Posts now or later; a `done` result counts as an immediate completion of `st`.
template <class Post>
void FerryParcelport::post_deferrable(int d, Post post, State* st) {
  const Status s = post();
  if (!s.is_retry()) {
    if (s.is_done() || s.is_failed()) finish_one(st, s);
    return;
  }
  progress_device(d);
  defer([this, post = std::move(post), st]() mutable {
    const Status s2 = post();
    if (s2.is_retry()) return false;
    if (s2.is_done() || s2.is_failed()) finish_one(st, s2);
    return true;
  });
}

// acq_rel: the last finisher must see every other finisher's effects before it frees or
// delivers.
void FerryParcelport::finish_send(SendState* s) {
  if (s->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    if (const int e = s->error.load(std::memory_order_relaxed); e != 0) upcalls_.send_failed(s->dest, e);
    if (s->on_sent) s->on_sent();
    delete s;
  }
}

}  // namespace ferry::parcel::detail
