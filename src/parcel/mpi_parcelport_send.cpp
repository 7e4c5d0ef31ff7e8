// mpi_parcelport_send.cpp — the MPI parcelports' send path: the header built (size table, nzc
// piggybacked when it fits) and sent on the header tag, mpi_a's per-destination queues merged
// into one aggregate parcel, and a sender connection advanced one request at a time.
#include <mpi.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ferry/error.hpp"
#include "parcel/check_parcel.hpp"
#include "parcel/mpi_header.hpp"
#include "parcel/mpi_parcelport_impl.hpp"

namespace ferry::parcel::detail {

namespace {

// Chunks can exceed INT_MAX bytes; MPI-4's large-count calls take them whole.
int isend(const void* data, std::size_t size, int dest, int tag, MPI_Comm comm, MPI_Request* req) {
#if MPI_VERSION >= 4
  return MPI_Isend_c(data, static_cast<MPI_Count>(size), MPI_BYTE, dest, tag, comm, req);
#else
  if (size > static_cast<std::size_t>(INT_MAX)) {
    throw Error("chunk of " + std::to_string(size) + " bytes exceeds INT_MAX");
  }
  return MPI_Isend(data, static_cast<int>(size), MPI_BYTE, dest, tag, comm, req);
#endif
}

}  // namespace

void MpiParcelport::send(int destination, Parcel&& parcel, SentCallback on_sent) {
  if (destination < 0 || destination >= size_) {
    throw Error("MPI parcelport send: destination=" + std::to_string(destination) + " is out of range; the job has " +
                std::to_string(size_) + " ranks (0.." + std::to_string(size_ - 1) + ")");
  }
  const std::size_t table = sizeof(MpiParcelHeader) + 8 * parcel.zc.size();
  if (table > max_header_) {
    throw Error("send: the header needs " + std::to_string(table) + " bytes for " +
                std::to_string(parcel.zc.size()) + " zero-copy chunk sizes but max_header is " +
                std::to_string(max_header_));
  }
  check_parcel_chunks("MPI parcelport send", parcel);
  sent_.fetch_add(1, std::memory_order_relaxed);
  if (aggregate_) {
    enqueue(destination, std::move(parcel), std::move(on_sent));
    return;
  }
  std::vector<SentCallback> callbacks;
  callbacks.push_back(std::move(on_sent));
  start_send(my_device(), destination, parcel.nzc, std::move(parcel.zc), 0, std::move(callbacks), nullptr);
}

int MpiParcelport::next_tag() noexcept {
  // Tag 0 is the header's. Wrapping is safe as long as fewer than tag_ub parcels from one
  // rank are in flight at once, which HPX assumes as well.
  const std::uint64_t n = tag_counter_.fetch_add(1, std::memory_order_relaxed);
  return 1 + static_cast<int>(n % static_cast<std::uint64_t>(tag_ub_));
}

void MpiParcelport::start_send(Device& dev, int destination, Chunk nzc, std::vector<Chunk> zc, std::uint32_t flags,
                               std::vector<SentCallback> callbacks, std::unique_ptr<void, FreeDeleter> owned) {
  auto c = std::make_unique<SenderConnection>();
  c->device = &dev;
  c->destination = destination;
  c->tag = next_tag();
  c->nzc = nzc;
  c->zc = std::move(zc);
  c->on_sent = std::move(callbacks);
  c->owned_nzc = std::move(owned);

  const std::size_t table = sizeof(MpiParcelHeader) + 8 * c->zc.size();
  const bool piggyback = table + nzc.size <= max_header_;
  c->nzc_followup = !piggyback;
  c->header.resize(piggyback ? table + nzc.size : table);
  MpiParcelHeader h{kMpiSignature, c->tag, flags | (piggyback ? kFlagPiggyback : 0u),
               static_cast<std::uint32_t>(c->zc.size()), nzc.size};
  std::byte* out = c->header.data();
  std::memcpy(out, &h, sizeof h);
  for (std::size_t i = 0; i < c->zc.size(); ++i) {
    const std::uint64_t s = c->zc[i].size;
    std::memcpy(out + sizeof h + 8 * i, &s, 8);
  }
  if (piggyback && nzc.size != 0) std::memcpy(out + table, nzc.data, nzc.size);

  check(isend(c->header.data(), c->header.size(), destination, kHeaderTag, dev.comm, &c->request),
        "MPI_Isend(header)");
  std::lock_guard<Spinlock> lock(dev.senders_lock);
  dev.senders.push_back(std::move(c));
}

// --- mpi_a ---------------------------------------------------------------------------------

void MpiParcelport::enqueue(int destination, Parcel&& parcel, SentCallback&& on_sent) {
  Destination& d = *destinations_[static_cast<std::size_t>(destination)];
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    d.queue.push_back(Pending{std::move(parcel), std::move(on_sent)});
  }
  for (;;) {
    bool expected = false;
    if (!d.sending.compare_exchange_strong(expected, true, std::memory_order_acquire)) return;
    struct StepDown {
      Destination& d;
      ~StepDown() { d.sending.store(false, std::memory_order_release); }
    };
    {
      StepDown guard{d};
      std::vector<Pending> batch = take_batch(d);
      if (!batch.empty()) send_batch(destination, std::move(batch));
    }
    std::lock_guard<std::mutex> lock(d.mutex);
    if (d.queue.empty()) return;
  }
}

// Everything queued, except that the merged zc size table must still fit in the header; the
// rest waits for the next round.
std::vector<MpiParcelport::Pending> MpiParcelport::take_batch(Destination& d) {
  const std::size_t capacity = (max_header_ - sizeof(MpiParcelHeader)) / 8;
  std::vector<Pending> batch;
  std::size_t zc_total = 0;
  std::lock_guard<std::mutex> lock(d.mutex);
  while (!d.queue.empty()) {
    const std::size_t k = d.queue.front().parcel.zc.size();
    if (!batch.empty() && zc_total + k > capacity) break;
    zc_total += k;
    batch.push_back(std::move(d.queue.front()));
    d.queue.pop_front();
  }
  return batch;
}

void MpiParcelport::send_batch(int destination, std::vector<Pending> batch) {
  Device& dev = *devices_[0];
  std::vector<SentCallback> callbacks;
  callbacks.reserve(batch.size());
  if (batch.size() == 1) {
    // A lone parcel goes as it is: the index would be pure overhead.
    Pending& p = batch.front();
    callbacks.push_back(std::move(p.on_sent));
    start_send(dev, destination, p.parcel.nzc, std::move(p.parcel.zc), 0, std::move(callbacks), nullptr);
    return;
  }
  std::size_t nzc_total = aggregate_index_size(batch.size());
  std::size_t zc_total = 0;
  for (const Pending& p : batch) {
    nzc_total += p.parcel.nzc.size;
    zc_total += p.parcel.zc.size();
  }
  std::unique_ptr<void, FreeDeleter> merged(checked_malloc(nzc_total, "mpi_a aggregate"));
  auto* out = static_cast<std::byte*>(merged.get());
  const std::uint64_t count = batch.size();
  std::memcpy(out, &count, 8);
  std::size_t at = aggregate_index_size(batch.size());
  std::vector<Chunk> zc;
  zc.reserve(zc_total);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    Pending& p = batch[i];
    const std::uint64_t entry[2] = {p.parcel.nzc.size, p.parcel.zc.size()};
    std::memcpy(out + 8 + 16 * i, entry, 16);
    if (p.parcel.nzc.size != 0) std::memcpy(out + at, p.parcel.nzc.data, p.parcel.nzc.size);
    at += p.parcel.nzc.size;
    zc.insert(zc.end(), p.parcel.zc.begin(), p.parcel.zc.end());
    callbacks.push_back(std::move(p.on_sent));
  }
  start_send(dev, destination, Chunk{out, nzc_total}, std::move(zc), kFlagAggregate, std::move(callbacks),
             std::move(merged));
}

// Tests the one outstanding request and keeps posting the next chunk for as long as requests
// complete at once, as HPX's connections do.
Step MpiParcelport::advance(SenderConnection& c) {
  Step step = Step::idle;
  for (;;) {
    if (c.request != MPI_REQUEST_NULL) {
      int done = 0;
      check(MPI_Test(&c.request, &done, MPI_STATUS_IGNORE), "MPI_Test(send)");
      if (!done) return step;
      step = Step::progressed;
    }
    MPI_Comm comm = c.device->comm;
    if (c.nzc_followup) {
      c.nzc_followup = false;
      check(isend(c.nzc.data, c.nzc.size, c.destination, c.tag, comm, &c.request), "MPI_Isend(nzc)");
      continue;
    }
    if (c.next_zc < c.zc.size()) {
      const Chunk& z = c.zc[c.next_zc++];
      check(isend(z.data, z.size, c.destination, c.tag, comm, &c.request), "MPI_Isend(zc)");
      continue;
    }
    return Step::finished;
  }
}

}  // namespace ferry::parcel::detail
