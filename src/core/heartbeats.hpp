// heartbeats.hpp — the keepalive's channel: heartbeats to and from the peers on other hosts,
// on an endpoint of their own.
//
// A heartbeat on the data endpoint waits behind its sender's flood, and one arriving waits
// behind the backlog its receiver has yet to drain: through a cut link that backlog still
// drains for seconds, so silence could not be measured from the moment of the cut. On an
// endpoint that carries nothing else (its own connections, its own completion queue) a
// heartbeat waits for neither, so the keepalive counts only heartbeats, and a peer is named
// within the timeout and one check interval of its last one.
//
// A heartbeat is 16 bytes: the magic "FRHB", a kind (alive; departing: the sender finalized;
// failed: a notice that the subject failed, monitor_ring.hpp), three zero bytes, the sender's
// rank and the subject's (a notice's; zero for the other kinds); the words in the byte order of
// wire.hpp's encode (the job's own: one binary, one architecture). Every field is checked
// before use; a message that fails a check is dropped and counted.
//
// Concurrency: not shared. Everything is called by the one keepalive thread, except the
// constructor, address(), connect() and connected(), called before it starts, and the
// destructor, after it ends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/monitor_ring.hpp"
#include "core/op_context.hpp"
#include "net/transport.hpp"

namespace ferry::detail {

inline constexpr std::size_t kBeatBytes = 16;
inline constexpr std::uint32_t kBeatMagic = 0x42485246;  // "FRHB" on a little-endian machine

// Encodes a heartbeat of `kind` from `rank` (`subject`: a notice's failed rank, else 0).
void encode_beat(unsigned char (&out)[kBeatBytes], Beat kind, int rank, int subject = 0) noexcept;
// Decodes `length` bytes received from a job of `size` ranks (`source`: the rank the
// transport names as sender, or -1 when it names none). False when any check fails: the
// length, the magic, the kind, the padding, a rank outside the job, a rank that is not the
// transport's sender, a notice's subject outside the job or equal to its sender, or another
// kind's subject not zero.
bool decode_beat(const unsigned char* data, std::size_t length, int size, int source, Beat& kind,
                 int& rank) noexcept;
bool decode_beat(const unsigned char* data, std::size_t length, int size, int source, Beat& kind, int& rank,
                 int& subject) noexcept;

class HeartbeatChannel {
 public:
  // Takes a transport of its own (a network backend's endpoint). Throws ferry::Error when the
  // transport cannot inject a heartbeat.
  HeartbeatChannel(std::unique_ptr<net::Transport> transport, int rank, int size);
  ~HeartbeatChannel();
  HeartbeatChannel(const HeartbeatChannel&) = delete;
  HeartbeatChannel& operator=(const HeartbeatChannel&) = delete;

  std::string address() const { return transport_->address(); }
  // addresses[r]: rank r's channel address, "" for ranks not watched. Posts the receives
  // (none where the transport lends its messages, Caps::receives).
  void connect(const std::vector<std::string>& addresses);
  void connected() { transport_->connected(); }

  // Injects a heartbeat to `rank`: 0, -EAGAIN (try again later) or another negative errno.
  int send(int rank, Beat kind, int subject = 0) noexcept;
  // `rank` failed: the transport then closes without waiting on it (see Transport::peer_failed).
  void peer_failed(int rank) { transport_->peer_failed(rank); }

  struct Arrived {
    int rank;
    Beat kind;
    int subject;  // a notice's failed rank (Beat::failed), else 0
  };
  // Polls the channel: appends each heartbeat arrived to `arrived`, drops (and counts) each
  // malformed one, and reposts every receive used up (one the transport refuses for now is
  // tried again at the next poll); a lent heartbeat is copied out and checked there.
  void poll(std::vector<Arrived>& arrived);
  std::uint64_t malformed() const noexcept { return malformed_; }

 private:
  struct Slot {
    OpContext context;
    alignas(8) unsigned char buffer[64];
  };
  // Posts slot's receive; false (and the slot kept in unposted_) when the transport refuses.
  bool post(std::size_t slot);

  std::unique_ptr<net::Transport> transport_;
  int rank_;
  int size_;
  std::unique_ptr<Slot[]> slots_;
  std::size_t slot_count_ = 0;
  std::vector<std::size_t> unposted_;          // slots whose receive the transport refused
  net::Registration* registration_ = nullptr;  // where the transport needs local registration
  std::uint64_t malformed_ = 0;
  bool posted_ = false;
  bool lends_;  // the transport lends its messages: no receives posted
};

}  // namespace ferry::detail
