// ferry_parcelport.cpp — the ferry parcelport's set-up and teardown: the options checked; the
// devices, completion queues and pre-posted header receives set up before the first barrier; the
// completions left after finalize freed. Also failure reports to the layer above, and the factory.
// (The parcelport's design, and which file owns which path: ferry_parcelport_impl.hpp.)
#include "parcel/ferry_parcelport.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "ferry/error.hpp"
#include "parcel/ferry_parcelport_impl.hpp"
#include "parcel/header.hpp"

namespace ferry::parcel::detail {

// The options' own ranges, checked before the runtime's collective set-up starts.
const ParcelportOptions& FerryParcelport::checked(const ParcelportOptions& options) {
  if (options.max_header != 0 && options.max_header < sizeof(ParcelHeader) + 8) {
    throw Error("ParcelportOptions::max_header=" + std::to_string(options.max_header) + " is too small: 0 (the " +
                "device's eager limit) or at least " + std::to_string(sizeof(ParcelHeader) + 8) + " bytes");
  }
  if (options.header_recvs < 0 || options.header_recvs > 1024) {
    throw Error("ParcelportOptions::header_recvs=" + std::to_string(options.header_recvs) + " is out of range: 0 (default " +
                std::to_string(kDefaultHeaderRecvs) + ") to 1024");
  }
  return options;
}

FerryParcelport::FerryParcelport(const ParcelportOptions& options, Upcalls& upcalls)
    : upcalls_(upcalls),
      settings_(option_table().resolve(checked(options)).settings),
      rt_(RuntimeOptions{.devices = options.devices}),
      iovec_(options.iovec),
      tags_(static_cast<std::size_t>(rt_.device_count())) {
  const RuntimeSettings& core = rt_.options().settings;
  if (core.lock_model == LockModel::serialized) {
    throw Error("FERRY_LOCK_MODEL=serialized: the parcel layer's worker threads share its devices, which that "
                "model does not allow (choose another lock model)");
  }
  progress_ = core.progress.value;
  polling_ = settings_.device_polling;
  sendrecv_ = settings_.header == HeaderPrimitive::sendrecv;
  sync_ = core.completion == CompletionMechanism::sync;
  per_device_ = settings_.parcel_queues == ParcelQueues::device && rt_.device_count() > 1;
  for (int d = 0; d < rt_.device_count(); ++d) devs_.push_back(&rt_.device(d));
  if (progress_ == Progress::steal) policy_ = std::make_unique<StealPolicy>(rt_.device_count());
  if (sync_) pool_ = std::make_unique<SyncPool>();

  for (int q = 0; q < (per_device_ ? rt_.device_count() : 1); ++q) {
    cqs_.push_back(std::make_unique<CompletionQueue>());
    exposures_.push_back(rt_.expose(*cqs_.back(), static_cast<std::uint16_t>(kHeaderTarget + q)));
  }
  max_header_ = rt_.device(0).eager_limit();
  if (max_header_ < sizeof(ParcelHeader) + 8) {
    throw Error("the parcel header needs " + std::to_string(sizeof(ParcelHeader) + 8) + " bytes but the device's eager " +
                "limit is " + std::to_string(max_header_) + " (FERRY_PACKET_SIZE=" +
                std::to_string(core.packet_size) + ", FERRY_RDV_THRESHOLD=" + std::to_string(core.rdv_threshold) + ")");
  }
  if (options.max_header != 0 && options.max_header < max_header_) max_header_ = options.max_header;
  for (auto& t : tags_) t.store(1, std::memory_order_relaxed);
  if (sendrecv_) {
    const int k = options.header_recvs != 0 ? options.header_recvs : kDefaultHeaderRecvs;
    for (int d = 0; d < rt_.device_count(); ++d) {
      for (int i = 0; i < k; ++i) {
        auto hs = std::make_unique<HeaderSlot>();
        hs->kind = StateKind::header;
        hs->device = d;
        // The whole eager limit: a peer with a larger max_header still fits.
        hs->buffer.resize(rt_.device(d).eager_limit());
        header_slots_.push_back(std::move(hs));
      }
    }
    for (auto& hs : header_slots_) repost_header(hs.get());
  }
  rt_.barrier();  // every rank listens before anyone sends
}

FerryParcelport::~FerryParcelport() {
  try {
    rt_.finalize();
  } catch (const PeerFailed&) {
    // Closed all the same; the failure reached the layer above through peer_failed.
  }
  // Follow-ups the runtime completed while it shut down (a rendezvous whose FIN came during
  // finalize's drain) left their completions in the queues: their records are freed here.
  // No callback runs — the layer above is shutting down and must not be called back into.
  for (auto& q : cqs_) {
    while (auto c = q->pop()) discard(std::move(*c));
  }
  while (auto c = gets_cq_.pop()) delete static_cast<GetOp*>(c->context);
}

// A completion left after finalize: frees its record once its last follow-up is in.
void FerryParcelport::discard(Completion&& c) noexcept {
  if (c.op == OpKind::remote_am || c.context == nullptr) return;  // a header: its buffers go with c
  auto* st = static_cast<State*>(c.context);
  if (st->kind == StateKind::send) {
    auto* s = static_cast<SendState*>(st);
    if (s->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) delete s;
  } else if (st->kind == StateKind::recv) {
    auto* r = static_cast<RecvState*>(st);
    if (r->awaiting_nzc || r->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) delete r;
  }
}

// Tells the layer above of each rank that failed since the last report, once per rank. A
// slow path under a mutex; the count is stored after the upcalls, so a thread that reads
// it equal knows every failure up to it has been reported.
void FerryParcelport::report_failures() {
  std::unique_lock<std::mutex> g(failure_mutex_, std::try_to_lock);
  if (!g.owns_lock()) return;
  const std::uint32_t count = rt_.failure_count();
  for (int r : rt_.failed_ranks()) {
    if (reported_ranks_.size() < static_cast<std::size_t>(size())) reported_ranks_.assign(static_cast<std::size_t>(size()), 0);
    if (reported_ranks_[static_cast<std::size_t>(r)] != 0) continue;
    reported_ranks_[static_cast<std::size_t>(r)] = 1;
    upcalls_.peer_failed(r);
  }
  failures_reported_.store(count, std::memory_order_relaxed);
}

std::uint64_t FerryParcelport::next_generation() noexcept {
  // Relaxed: only uniqueness matters.
  static std::atomic<std::uint64_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed) + 1;
}

std::unique_ptr<Parcelport> make_ferry_parcelport(const ParcelportOptions& options, Upcalls& upcalls) {
  return std::make_unique<FerryParcelport>(options, upcalls);
}

}  // namespace ferry::parcel::detail
