// termination.cpp — how the AMT runtime ends: finalize, and rank 0's termination waves.
//
// Termination (finalize) is a double-counting wave protocol run by rank 0: it asks every
// rank for (application parcels sent, received, idle, finalizing); when two consecutive
// waves report everyone idle and finalizing with equal, unchanged totals, nothing can be in
// flight anywhere, and rank 0 tells everyone to stop. Control parcels are not counted.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "amt/runtime_impl.hpp"
#include "common/log.hpp"

namespace ferry::amt {

// GCC 12 inlines the Writer's vector insert into this function (its only user in this file) and
// then takes the 24-byte Report it appends to an empty vector for a write past the 24 bytes just
// allocated for it. The write is in bounds: a -Wstringop-overflow false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstringop-overflow"
void Runtime::Impl::on_control(Kind kind, int source, const parcel::Parcel& p) {
  std::uint64_t round = 0;
  std::memcpy(&round, p.nzc.data + 1, 8);
  if (kind == Kind::term_query) {
    // Acquire on received_ pairs with count_received: see there.
    Report rep{sent_.load(std::memory_order_relaxed), received_.load(std::memory_order_acquire),
               static_cast<std::uint8_t>(active_.load(std::memory_order_acquire) == 0),
               static_cast<std::uint8_t>(finalizing_.load(std::memory_order_acquire))};
    detail::Writer w;
    w.pod(rep);
    send(source, Kind::term_report, round, 0, std::move(w), false);
  } else if (kind == Kind::term_report) {
    Report rep;
    if (p.nzc.size < 17 + sizeof rep) return;
    std::memcpy(&rep, p.nzc.data + 17, sizeof rep);
    std::lock_guard<std::mutex> g(term_mutex_);
    if (round != round_) return;
    ++reports_;
    wave_sent_ += rep.sent;
    wave_received_ += rep.received;
    wave_quiet_ = wave_quiet_ && rep.idle && rep.finalizing;
  } else {
    stop_received_.store(true, std::memory_order_release);
  }
}
#pragma GCC diagnostic pop

void Runtime::Impl::finalize() {
  if (finalized_) return;
  finalized_ = true;
  finalizing_.store(true, std::memory_order_release);
  if (rank() == 0) run_waves();
  while (!stop_received_.load(std::memory_order_acquire)) {
    if (!help()) std::this_thread::yield();
    throw_if_failed("finalize");
  }
  parcelport_->barrier();
  std::lock_guard<std::shared_mutex> g(actions_mutex_);
  for (const auto& [id, parked] : parked_) {
    FERRY_LOG_AT(warn, rank(), -1, "amt: a call from rank %d named action id %llu, which was never registered here",
                 parked.first, static_cast<unsigned long long>(id));
    unknown_.fetch_add(1, std::memory_order_relaxed);
  }
}

void Runtime::Impl::run_waves() {
  std::uint64_t last_sent = ~0ull, last_received = ~0ull;
  bool last_quiet = false;
  for (;;) {
    {
      std::lock_guard<std::mutex> g(term_mutex_);
      ++round_;
      reports_ = 0;
      wave_sent_ = wave_received_ = 0;
      wave_quiet_ = true;
    }
    const std::uint64_t round = round_;
    for (int l = 0; l < size(); ++l) send(l, Kind::term_query, round, 0, detail::Writer{}, false);
    for (;;) {
      {
        std::lock_guard<std::mutex> g(term_mutex_);
        if (reports_ == size()) break;
      }
      if (!help()) std::this_thread::yield();
      throw_if_failed("finalize");
    }
    std::lock_guard<std::mutex> g(term_mutex_);
    const bool quiet = wave_quiet_ && wave_sent_ == wave_received_;
    if (quiet && last_quiet && wave_sent_ == last_sent && wave_received_ == last_received) break;
    last_quiet = quiet;
    last_sent = wave_sent_;
    last_received = wave_received_;
  }
  for (int l = 0; l < size(); ++l) send(l, Kind::term_stop, 0, 0, detail::Writer{}, false);
}

}  // namespace ferry::amt
