// mpi_parcelport_recv.cpp — the MPI parcelports' receive path: the one pre-posted header
// receive per communicator, a header checked and decoded into a receiver connection, the
// connection advanced one request at a time (nzc, then the zero-copy chunks the layer above
// allocates), and delivery — one parcel, or each parcel of an mpi_a aggregate, sharing its nzc
// buffer.
#include <mpi.h>

#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/log.hpp"
#include "ferry/error.hpp"
#include "parcel/mpi_header.hpp"
#include "parcel/mpi_parcelport_impl.hpp"

namespace ferry::parcel::detail {

namespace {

// Chunks can exceed INT_MAX bytes; MPI-4's large-count call takes them whole.
int irecv(void* data, std::size_t size, int source, int tag, MPI_Comm comm, MPI_Request* req) {
#if MPI_VERSION >= 4
  return MPI_Irecv_c(data, static_cast<MPI_Count>(size), MPI_BYTE, source, tag, comm, req);
#else
  if (size > static_cast<std::size_t>(INT_MAX)) {
    throw Error("chunk of " + std::to_string(size) + " bytes exceeds INT_MAX");
  }
  return MPI_Irecv(data, static_cast<int>(size), MPI_BYTE, source, tag, comm, req);
#endif
}

void release_free(void* /*owner*/, void* data) noexcept { std::free(data); }

// One receive buffer holding the nzcs of an aggregate; each delivered parcel holds a reference.
struct SharedNzc {
  std::atomic<std::size_t> refs;
  void* base;
};

void release_shared(void* owner, void* /*data*/) noexcept {
  auto* shared = static_cast<SharedNzc*>(owner);
  if (shared->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    std::free(shared->base);
    delete shared;
  }
}

}  // namespace

void MpiParcelport::post_header_receive(Device& dev) {
  check(MPI_Irecv(dev.header_buffer.data(), static_cast<int>(max_header_), MPI_BYTE, MPI_ANY_SOURCE, kHeaderTag,
                  dev.comm, &dev.header_request),
        "MPI_Irecv(header)");
}

// The header request is tested only under its try-lock, and re-posted before the lock is
// dropped, so there is always exactly one header receive outstanding.
std::unique_ptr<ReceiverConnection> MpiParcelport::accept(Device& dev) {
  if (!dev.header_lock.try_lock()) return nullptr;
  std::vector<std::byte> received;
  int source = MPI_ANY_SOURCE;
  {
    std::lock_guard<Spinlock> lock(dev.header_lock, std::adopt_lock);
    int done = 0;
    MPI_Status status;
    check(MPI_Test(&dev.header_request, &done, &status), "MPI_Test(header)");
    if (!done) return nullptr;
    int count = 0;
    check(MPI_Get_count(&status, MPI_BYTE, &count), "MPI_Get_count(header)");
    source = status.MPI_SOURCE;
    // Out of the buffer before it is re-posted for the next header.
    received.assign(dev.header_buffer.data(), dev.header_buffer.data() + count);
    post_header_receive(dev);
  }
  return parse_header(dev, source, received.data(), received.size());
}

// A header that does not check out is dropped and logged with its sender's rank (its
// follow-ups, if any, are never received); nullptr then.
std::unique_ptr<ReceiverConnection> MpiParcelport::parse_header(Device& dev, int source, const std::byte* data,
                                                               std::size_t len) {
  MpiHeaderView v;
  // Follow-ups are received on the header's tag: past MPI_TAG_UB the receive would fail, and
  // on the header tag it could take the sender's next header.
  const bool ok = check_mpi_header(data, len, v);
  const bool follow_ups = ok && (v.h.zc_count != 0 || !v.piggyback());
  if (!ok || (follow_ups && (v.h.tag > tag_ub_ || v.h.tag == kHeaderTag))) {
    malformed_.fetch_add(1, std::memory_order_relaxed);
    FERRY_LOG_AT(warn, rank_, -1,
                 "MPI parcelport: dropped a malformed %zu-byte header from rank %d (is max_header the same on "
                 "every rank?)",
                 len, source);
    return nullptr;
  }
  auto c = std::make_unique<ReceiverConnection>();
  c->device = &dev;
  c->source = source;
  c->tag = v.h.tag;
  c->aggregate = v.aggregate();
  c->zc_sizes.resize(v.h.zc_count);
  for (std::size_t i = 0; i < v.h.zc_count; ++i) c->zc_sizes[i] = static_cast<std::size_t>(mpi_zc_size(v, i));
  c->nzc.reset(checked_malloc(v.h.nzc_size, "parcel receive"));
  c->nzc_size = v.h.nzc_size;
  if (v.piggyback()) {
    if (v.h.nzc_size != 0) std::memcpy(c->nzc.get(), v.nzc, v.h.nzc_size);
  } else {
    c->nzc_followup = true;
  }
  return c;
}

Step MpiParcelport::advance(ReceiverConnection& c) {
  Step step = Step::idle;
  for (;;) {
    if (c.request != MPI_REQUEST_NULL) {
      int done = 0;
      check(MPI_Test(&c.request, &done, MPI_STATUS_IGNORE), "MPI_Test(recv)");
      if (!done) return step;
      step = Step::progressed;
    }
    MPI_Comm comm = c.device->comm;
    if (c.nzc_followup) {
      c.nzc_followup = false;
      check(irecv(c.nzc.get(), c.nzc_size, c.source, c.tag, comm, &c.request),
            "MPI_Irecv(nzc)");
      continue;
    }
    if (!c.zc_ready) {
      c.zc_ready = true;
      if (!allocate_zc(c)) {
        malformed_.fetch_add(1, std::memory_order_relaxed);
        // Dropped: its zero-copy follow-ups are never received.
        FERRY_LOG_AT(warn, rank_, -1, "MPI parcelport: dropped an aggregate with a malformed index from rank %d",
                     c.source);
        return Step::finished;
      }
    }
    if (c.next_zc < c.zc.size()) {
      const std::size_t i = c.next_zc++;
      check(irecv(c.zc[i].data, c.zc_sizes[i], c.source, c.tag, comm, &c.request), "MPI_Irecv(zc)");
      continue;
    }
    deliver(c);
    return Step::finished;
  }
}

std::vector<Chunk> MpiParcelport::allocate_checked(int source, const Chunk& nzc,
                                                   const std::vector<std::size_t>& sizes) {
  std::vector<Chunk> got = upcalls_.allocate_zc_chunks(source, nzc, sizes);
  if (got.size() != sizes.size()) {
    throw Error("allocate_zc_chunks returned " + std::to_string(got.size()) + " chunks for " +
                std::to_string(sizes.size()));
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) got[i].size = sizes[i];
  return got;
}

// Needs the whole nzc: the upper layer reads the zc layout from it, and for an aggregate the
// index that splits it into parcels is in there too. False when that index does not check out.
bool MpiParcelport::allocate_zc(ReceiverConnection& c) {
  auto* base = static_cast<std::byte*>(c.nzc.get());
  const std::size_t size = c.nzc_size;
  if (!c.aggregate) {
    if (!c.zc_sizes.empty()) c.zc = allocate_checked(c.source, Chunk{base, size}, c.zc_sizes);
    return true;
  }
  std::vector<AggregatePart> index;
  if (!check_aggregate_index(base, size, c.zc_sizes.size(), index)) return false;
  c.parts.resize(index.size());
  c.zc.reserve(c.zc_sizes.size());
  std::size_t zc_at = 0;
  for (std::size_t i = 0; i < index.size(); ++i) {
    auto& part = c.parts[i];
    part.nzc = Chunk{base + index[i].nzc_offset, index[i].nzc_size};
    part.zc_count = index[i].zc_count;
    if (part.zc_count != 0) {
      std::vector<std::size_t> sizes(c.zc_sizes.begin() + static_cast<std::ptrdiff_t>(zc_at),
                                     c.zc_sizes.begin() + static_cast<std::ptrdiff_t>(zc_at + part.zc_count));
      std::vector<Chunk> got = allocate_checked(c.source, part.nzc, sizes);
      c.zc.insert(c.zc.end(), got.begin(), got.end());
    }
    zc_at += part.zc_count;
  }
  return true;
}

// Counted before the upcall, like the ferry parcelport, so both report the same numbers.
void MpiParcelport::deliver(ReceiverConnection& c) {
  if (!c.aggregate) {
    Parcel p;
    p.nzc = Chunk{static_cast<std::byte*>(c.nzc.get()), c.nzc_size};
    p.zc = std::move(c.zc);
    p.nzc_storage = Buffer(c.nzc.release(), c.nzc_size, &release_free, nullptr);
    delivered_.fetch_add(1, std::memory_order_relaxed);
    upcalls_.handle_parcel(c.source, std::move(p));
    return;
  }
  if (c.parts.empty()) return;
  // Every parcel takes its reference before the first upcall, so that an upcall that throws
  // still leaves each reference with an owner that releases it.
  auto* shared = new SharedNzc{{c.parts.size()}, c.nzc.release()};
  std::vector<Parcel> parcels(c.parts.size());
  std::size_t zc_at = 0;
  for (std::size_t i = 0; i < c.parts.size(); ++i) {
    Parcel& p = parcels[i];
    p.nzc = c.parts[i].nzc;
    p.zc.assign(c.zc.begin() + static_cast<std::ptrdiff_t>(zc_at),
                c.zc.begin() + static_cast<std::ptrdiff_t>(zc_at + c.parts[i].zc_count));
    zc_at += c.parts[i].zc_count;
    p.nzc_storage = Buffer(p.nzc.data, p.nzc.size, &release_shared, shared);
  }
  for (Parcel& p : parcels) {
    delivered_.fetch_add(1, std::memory_order_relaxed);
    upcalls_.handle_parcel(c.source, std::move(p));
  }
}

}  // namespace ferry::parcel::detail
