#include "core/heartbeats.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/log.hpp"
#include "core/wire.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {

namespace {

constexpr std::size_t kSlots = 32;  // a few beats per watched peer between two polls

}  // namespace

void encode_beat(unsigned char (&out)[kBeatBytes], Beat kind, int rank, int subject) noexcept {
  std::memset(out, 0, sizeof out);
  encode(out, kBeatMagic);
  out[4] = static_cast<unsigned char>(kind);
  encode(out + 8, static_cast<std::uint32_t>(rank));
  encode(out + 12, static_cast<std::uint32_t>(subject));
}

bool decode_beat(const unsigned char* data, std::size_t length, int size, int source, Beat& kind, int& rank,
                 int& subject) noexcept {
  if (data == nullptr || length != kBeatBytes || decode<std::uint32_t>(data) != kBeatMagic) return false;
  const unsigned char k = data[4];
  if (k != static_cast<unsigned char>(Beat::alive) && k != static_cast<unsigned char>(Beat::departing) &&
      k != static_cast<unsigned char>(Beat::failed)) {
    return false;
  }
  if (data[5] != 0 || data[6] != 0 || data[7] != 0) return false;
  const std::uint32_t r = decode<std::uint32_t>(data + 8);
  const std::uint32_t about = decode<std::uint32_t>(data + 12);
  if (r >= static_cast<std::uint32_t>(size)) return false;
  if (source >= 0 && static_cast<std::uint32_t>(source) != r) return false;
  if (k == static_cast<unsigned char>(Beat::failed) ? about >= static_cast<std::uint32_t>(size) || about == r
                                                     : about != 0) {
    return false;
  }
  kind = static_cast<Beat>(k);
  rank = static_cast<int>(r);
  subject = static_cast<int>(about);
  return true;
}

bool decode_beat(const unsigned char* data, std::size_t length, int size, int source, Beat& kind,
                 int& rank) noexcept {
  int subject = 0;
  return decode_beat(data, length, size, source, kind, rank, subject);
}

HeartbeatChannel::HeartbeatChannel(std::unique_ptr<net::Transport> transport, int rank, int size)
    : transport_(std::move(transport)), rank_(rank), size_(size),
      lends_(transport_->caps().receives == net::Receives::lent) {
  if (transport_->caps().inject_size < kBeatBytes) {
    throw Error("the keepalive's channel over " + transport_->caps().name + " cannot inject " +
                std::to_string(kBeatBytes) + "-byte heartbeats (inject size " +
                std::to_string(transport_->caps().inject_size) + "); set FERRY_PEER_TIMEOUT_MS=0 to run without it");
  }
  slot_count_ = kSlots;
  slots_ = std::make_unique<Slot[]>(slot_count_);
  unposted_.reserve(2 * slot_count_);  // each slot at most once, and once more while retried
  if (transport_->caps().local_registration) {
    registration_ = transport_->register_memory(slots_.get(), sizeof(Slot) * slot_count_, net::Access::recv);
  }
}

HeartbeatChannel::~HeartbeatChannel() {
  transport_->cancel_all();
  transport_->close();
  if (registration_ != nullptr) transport_->deregister(registration_);
}

void HeartbeatChannel::connect(const std::vector<std::string>& addresses) {
  transport_->connect(addresses);
  // A transport that lends its messages takes no receives: each poll lends them instead.
  if (!lends_) {
    for (std::size_t i = 0; i < slot_count_; ++i) post(i);
  }
  posted_ = true;
}

bool HeartbeatChannel::post(std::size_t slot) {
  Slot& s = slots_[slot];
  s.context.set_kind(CtxKind::recv_packet);
  const int rc = transport_->post_recv(s.buffer, sizeof s.buffer, registration_ != nullptr ? registration_->desc() : nullptr,
                                       &s.context);
  if (rc == 0) return true;
  // Kept for the next poll: a slot lost for good would, 32 losses later, leave the channel
  // deaf and every peer on another host failed.
  unposted_.push_back(slot);
  if (rc != -EAGAIN) FERRY_LOG_AT(warn, rank_, -1, "keepalive channel: %s", net::error_text("post_recv", rc).c_str());
  return false;
}

int HeartbeatChannel::send(int rank, Beat kind, int subject) noexcept {
  unsigned char frame[kBeatBytes];
  encode_beat(frame, kind, rank_, subject);
  return transport_->inject(rank, frame, sizeof frame);
}

void HeartbeatChannel::poll(std::vector<Arrived>& arrived) {
  if (!posted_) return;
  if (!unposted_.empty()) {
    // post() appends what is refused again, after these (room reserved: no reallocation).
    const std::size_t retry = unposted_.size();
    for (std::size_t i = 0; i < retry; ++i) (void)post(unposted_[i]);
    unposted_.erase(unposted_.begin(), unposted_.begin() + static_cast<std::ptrdiff_t>(retry));
  }
  const bool named = transport_->caps().reports_source;
  // One heartbeat's bytes: a receive's buffer, or a lent message's copy (its sender may still
  // write where it lies, so it is checked only once copied).
  const auto take = [&](const unsigned char* data, std::size_t length, int error, int source) {
    Beat kind{};
    int from = -1, subject = 0;
    // Where the transport names senders, a sender it cannot name (-1) is not in the job.
    if (error == 0 && length <= sizeof slots_[0].buffer && !(named && source < 0) &&
        decode_beat(data, length, size_, source, kind, from, subject) &&
        from != rank_) {
      arrived.push_back(Arrived{from, kind, subject});
    } else if (error == 0 || error == -EMSGSIZE) {
      ++malformed_;
      FERRY_LOG_AT(warn, rank_, -1, "keepalive channel: dropped a malformed heartbeat of %zu bytes (from rank %d)",
                   length, source);
    } else {
      FERRY_LOG_AT(debug, rank_, -1, "keepalive channel: %s", net::error_text("recv", error).c_str());
    }
  };
  net::Event events[16];
  // A poll that returns nothing may have consumed an error entry (a failed inject to a peer
  // that is gone): only a few empty polls in a row end the round. At most a few rounds of
  // receives per call, so a peer that floods the channel cannot keep the keepalive thread
  // from its checks.
  int empty = 0;
  for (std::size_t seen = 0; seen < 4 * slot_count_ && empty < 4;) {
    if (lends_) transport_->set_lend_limit(16);  // each is copied out before the next poll
    const int n = transport_->poll(events, 16);
    if (n <= 0) {
      ++empty;
      continue;
    }
    empty = 0;
    seen += static_cast<std::size_t>(n);
    for (int i = 0; i < n; ++i) {
      const net::Event& e = events[i];
      if (e.lent != nullptr) {
        unsigned char copy[sizeof slots_[0].buffer];
        std::memcpy(copy, e.lent, std::min(e.length, sizeof copy));
        take(copy, e.length, 0, e.rank);
        continue;
      }
      // Only receives carry a context here (heartbeats go by inject, which reports nothing).
      if (e.context == nullptr || e.remote_write) continue;
      const auto* base = reinterpret_cast<const unsigned char*>(slots_.get());
      const auto* ctx = reinterpret_cast<const unsigned char*>(e.context);
      if (ctx < base || ctx >= base + sizeof(Slot) * slot_count_) continue;
      const std::size_t offset = static_cast<std::size_t>(ctx - base);
      if (offset % sizeof(Slot) != 0) continue;
      const std::size_t slot = offset / sizeof(Slot);
      take(slots_[slot].buffer, e.length, e.error, e.rank);
      (void)post(slot);
    }
  }
}

}  // namespace ferry::detail
