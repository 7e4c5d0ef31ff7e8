// ferry_parcelport_recv.cpp — the parcel receive path: the pre-posted header receives of
// header=sendrecv, the dispatch of every completion (handle), a header checked and decoded, the
// follow-up receives (nzc, then the zero-copy chunks the layer above allocates), and delivery;
// finish_one counts one follow-up of either side.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/log.hpp"
#include "ferry/error.hpp"
#include "parcel/ferry_parcelport_impl.hpp"
#include "parcel/header.hpp"

namespace ferry::parcel::detail {

namespace {

void release_malloc(void*, void* data) noexcept { std::free(data); }

}  // namespace

// header=sendrecv: posts hs's receive (armed, with completion=sync).
Status FerryParcelport::post_header_recv(HeaderSlot* hs) {
  CompletionObject* local = &cq_of(hs->device);
  if (sync_) {
    hs->slot.arm();
    local = &hs->slot.sync;
  }
  const Status s = devs_[static_cast<std::size_t>(hs->device)]->post_recv(
      {.rank = any_source, .buffer = hs->buffer.data(), .size = hs->buffer.size(), .tag = kHeaderTag, .local = local,
       .context = static_cast<State*>(hs)});
  if (sync_ && !s.is_posted()) hs->slot.disarm();
  return s;
}

// Posts hs again; a header that was already waiting is taken and processed on the way.
// False when the device asked for a retry.
bool FerryParcelport::try_repost_header(HeaderSlot* hs) {
  for (;;) {
    const Status s = post_header_recv(hs);
    if (s.is_posted()) return true;
    if (s.is_retry()) return false;
    on_header(s.rank, copy_header(hs, s.size), {});
  }
}

void FerryParcelport::repost_header(HeaderSlot* hs) {
  if (!try_repost_header(hs)) defer([this, hs] { return try_repost_header(hs); });
}

// The header's bytes in a buffer of their own, so the slot can receive the next one at once.
Buffer FerryParcelport::copy_header(const HeaderSlot* hs, std::size_t size) {
  void* p = std::malloc(size != 0 ? size : 1);
  if (p == nullptr) throw Error("parcel receive: cannot allocate a " + std::to_string(size) + "-byte header");
  std::memcpy(p, hs->buffer.data(), std::min(size, hs->buffer.size()));
  return Buffer(p, size, &release_malloc, nullptr);
}

void FerryParcelport::on_header_recv(HeaderSlot* hs, Completion&& c) {
  if (!c.ok()) {
    FERRY_LOG_AT(error, rank(), -1, "parcelport: a header receive failed: %s", c.error_string().c_str());
    repost_header(hs);
    return;
  }
  Buffer b = copy_header(hs, c.size);
  repost_header(hs);
  on_header(c.rank, std::move(b), {});
}

void FerryParcelport::handle(Completion&& c) {
  if (c.op == OpKind::remote_am) {
    // A header (or an iovec parcel) that failed with its sender holds nothing to decode: the
    // failure reaches the application once, through the peer_failed upcall.
    if (!c.ok()) {
      if (c.error != peer_failed_error)
        FERRY_LOG_AT(error, rank(), -1, "parcelport: a message from rank %d failed: %s", c.rank, c.error_string().c_str());
      return;
    }
    on_header(c.rank, std::move(c.buffer), std::move(c.parts));
    return;
  }
  auto* st = static_cast<State*>(c.context);
  if (st->kind == StateKind::header) {
    on_header_recv(static_cast<HeaderSlot*>(st), std::move(c));
    return;
  }
  if (!c.ok()) {
    if (c.error != peer_failed_error) {  // a failed peer is reported once, by peer_failed
      FERRY_LOG_AT(error, rank(), -1, "parcelport: a follow-up %s with rank %d failed: %s", to_string(c.op), c.rank,
                   c.error_string().c_str());
    }
    set_error(st, c.error);
  }
  finish_one(st, Status::make_done());
}

void FerryParcelport::set_error(State* st, int error) noexcept {
  std::atomic<int>& e = st->kind == StateKind::send ? static_cast<SendState*>(st)->error : static_cast<RecvState*>(st)->error;
  int none = 0;
  e.compare_exchange_strong(none, error, std::memory_order_relaxed);
}

// One follow-up of `st` finished (a failed post finishes it with the peer's failure).
void FerryParcelport::finish_one(State* st, const Status& s) {
  if (s.is_failed()) set_error(st, peer_failed_error);
  if (st->kind == StateKind::send) {
    finish_send(static_cast<SendState*>(st));
  } else {
    finish_recv(static_cast<RecvState*>(st));
  }
}

void FerryParcelport::finish_recv(RecvState* r) {
  if (r->awaiting_nzc) {
    r->awaiting_nzc = false;
    if (r->error.load(std::memory_order_relaxed) != 0) {
      deliver(r);  // as failed: no zero-copy chunks are asked for
      return;
    }
    start_zc(r);
    return;
  }
  if (r->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) deliver(r);
}

// A header from `source`, in `header` (which the parcel may keep as its nzc storage); with
// iovec, `parts` holds the follow-ups that came with it.
void FerryParcelport::on_header(int source, Buffer header, std::vector<Buffer> parts) {
  const auto* base = static_cast<const std::byte*>(header.data());
  detail::HeaderView v;
  // Without iovec, follow-ups are received on the header's tag, which next_tag never makes
  // the header tag itself (such a receive could take the sender's next header) or past it.
  if (!detail::check_header(base, header.size(), parts.size(), v) || (parts.empty() && v.h.tag >= kHeaderTag)) {
    malformed_.fetch_add(1, std::memory_order_relaxed);
    FERRY_LOG_AT(warn, rank(), -1, "parcelport: dropped a malformed %zu-byte header from rank %d (%zu parts)",
                 header.size(), source, parts.size());
    return;
  }
  const ParcelHeader& h = v.h;
  const std::byte* at = v.nzc;
  std::vector<std::size_t> sizes(h.zc_count);
  for (std::size_t i = 0; i < sizes.size(); ++i) sizes[i] = detail::zc_size(v, i);
  if (!parts.empty()) {  // iovec: everything is here
    Parcel p;
    std::size_t k = 0;
    if (h.piggyback) {
      p.nzc = {const_cast<std::byte*>(at), h.nzc_size};
      p.nzc_storage = std::move(header);
    } else {
      p.nzc = {static_cast<std::byte*>(parts[0].data()), parts[0].size()};
      p.nzc_storage = std::move(parts[0]);
      k = 1;
    }
    for (; k < parts.size(); ++k) {
      p.zc.push_back({static_cast<std::byte*>(parts[k].data()), parts[k].size()});
      p.zc_storage.push_back(std::move(parts[k]));
    }
    delivered_.fetch_add(1, std::memory_order_relaxed);
    upcalls_.handle_parcel(source, std::move(p));
    return;
  }
  if (h.piggyback && h.zc_count == 0) {  // the common small parcel: hand over ferry's buffer
    Parcel p;
    p.nzc = {const_cast<std::byte*>(at), h.nzc_size};
    p.nzc_storage = std::move(header);
    delivered_.fetch_add(1, std::memory_order_relaxed);
    upcalls_.handle_parcel(source, std::move(p));
    return;
  }
  auto* r = new RecvState{};
  r->kind = StateKind::recv;
  r->source = source;
  r->tag = h.tag;
  r->device = h.device % rt_.device_count();
  r->sizes = std::move(sizes);
  if (h.piggyback) {
    // This parcel waits for its follow-ups, perhaps for long: it must not hold ferry's packet
    // meanwhile. Thousands of such parcels would drain the pool, and then the device could
    // neither repost receives nor send, so the follow-ups that free them could never arrive.
    // The nzc is small (it fit in the header): copy it out and let the packet go now.
    void* nzc = std::malloc(h.nzc_size != 0 ? h.nzc_size : 1);
    if (nzc == nullptr) throw Error("parcel receive: cannot allocate " + std::to_string(h.nzc_size) + " bytes");
    if (h.nzc_size != 0) std::memcpy(nzc, at, h.nzc_size);
    header.reset();
    r->parcel.nzc = {static_cast<std::byte*>(nzc), h.nzc_size};
    r->parcel.nzc_storage = Buffer(nzc, h.nzc_size, &release_malloc, nullptr);
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

void FerryParcelport::start_zc(RecvState* r) {
  if (r->sizes.empty()) {
    deliver(r);
    return;
  }
  // Nothing else refers to r yet: if the upcall throws or breaks its contract, the parcel is
  // dropped with it.
  std::unique_ptr<RecvState> dropped(r);
  r->parcel.zc = upcalls_.allocate_zc_chunks(r->source, r->parcel.nzc, r->sizes);
  if (r->parcel.zc.size() != r->sizes.size()) {
    throw Error("allocate_zc_chunks returned " + std::to_string(r->parcel.zc.size()) + " chunks for " +
                std::to_string(r->sizes.size()));
  }
  dropped.release();
  r->remaining.store(r->sizes.size(), std::memory_order_relaxed);
  for (std::size_t i = 0; i < r->sizes.size(); ++i) r->parcel.zc[i].size = r->sizes[i];
  post_recvs(r, r->parcel.zc);
}

void FerryParcelport::post_recvs(RecvState* r, std::vector<Chunk> into) {
  const int d = r->device;
  Device& dev = *devs_[static_cast<std::size_t>(d)];
  post_in_order(d, std::move(into), r, [this, &dev, d, r](const Chunk& c) {
    return post_op(d, [&](CompletionObject* local) {
      return dev.post_recv({.rank = r->source, .buffer = c.data, .size = c.size, .tag = r->tag, .local = local,
                            .context = static_cast<State*>(r)});
    });
  });
}

void FerryParcelport::deliver(RecvState* r) {
  const int source = r->source;
  const int error = r->error.load(std::memory_order_relaxed);
  Parcel p = std::move(r->parcel);
  delete r;
  if (error != 0) {
    upcalls_.receive_failed(source, std::move(p), error);
    return;
  }
  delivered_.fetch_add(1, std::memory_order_relaxed);
  upcalls_.handle_parcel(source, std::move(p));
}

}  // namespace ferry::parcel::detail
