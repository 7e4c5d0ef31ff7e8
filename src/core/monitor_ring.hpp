// monitor_ring.hpp — who watches whom across hosts, so that monitoring costs each process the
// same whatever the job's size.
//
// The ranks lie on a ring that interleaves the hosts: ordered by their index among their
// host's ranks, then by host (hosts in the order of their lowest rank). Neighbours on the ring
// sit on different hosts wherever the hosts hold as many ranks. Each rank has two guardians:
// the nearest rank on another host before it on the ring and the nearest after it that are
// neither failed nor departed. It sends heartbeats to its guardians and watches its wards (the
// ranks whose guardian it is). With hosts of equal size that is two heartbeats out and two in
// per period, for any job; a guardian with hosts of unequal size watches the run of a larger
// host's ranks between two of its own (the ratio of the sizes, never the job's size). Ranks of
// one host are not guardians of each other: their processes watch each other (liveness.hpp).
//
// Healing: a guardian is searched among the first kReach ranks on other hosts either side,
// so a ring on which up to kReach - 1 such neighbours of a rank failed side by side still
// watches it; the keepalive channel connects to all of them at start-up (links()).
//
// Notices: a rank that learns of a failure, by any means, sends a notice of it once to each
// of its links; each rank that learns of it from a notice does the same. Links also hold the
// ranks 2^j positions either side on the ring, so the links form a connected graph of
// diameter O(log N): every survivor connected to the rest learns of a failure within
// O(log N) hops, at O(log N) messages per process per failure.
//
// Every function here is pure: the same layout and the same knowledge of which ranks are gone
// give every rank the same guardians, so a guardian and its ward agree without messages.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/liveness.hpp"

namespace ferry::detail {

// What the keepalive's channel carries (heartbeats.hpp has the wire format): a heartbeat, a
// departing one (its sender finalized), or a notice that the message's subject failed.
enum class Beat : std::uint8_t { alive = 1, departing = 2, failed = 3 };

// Ring positions searched for a guardian on each side (see above).
inline constexpr int kReach = 4;

// The ring: immutable, shareable between the virtual ranks of a simulation.
class RingLayout {
 public:
  // host[r]: rank r's host (equal values, one host), for every rank of the job.
  explicit RingLayout(const std::vector<int>& host);
  int size() const noexcept { return static_cast<int>(rank_at_.size()); }
  int rank_at(int position) const noexcept { return rank_at_[static_cast<std::size_t>(position)]; }
  int position_of(int rank) const noexcept { return position_[static_cast<std::size_t>(rank)]; }
  int host_of(int rank) const noexcept { return host_[static_cast<std::size_t>(rank)]; }
  bool one_host() const noexcept { return one_host_; }

 private:
  std::vector<int> rank_at_, position_, host_;
  bool one_host_ = true;
};

// Host indices from host names (exchange_hosts' result): equal names, equal index.
std::vector<int> host_indices(const std::vector<std::string>& names);

// gone(rank): failed or departed, as the caller knows it.
using GoneFn = std::function<bool(int)>;

// The guardian of `rank` on side `dir` (-1 before it, +1 after it), or -1 when the first kReach
// ranks on other hosts that side are all gone.
int guardian(const RingLayout& ring, int rank, int dir, const GoneFn& gone);
// Appends the ranks `rank` guards (each once), none of them gone.
void wards(const RingLayout& ring, int rank, const GoneFn& gone, std::vector<int>& out);
// Every rank `rank` may ever exchange heartbeats or notices with, sorted: the first kReach
// ranks on other hosts either side, the ranks that have `rank` among theirs, and the ranks 2^j
// positions either side. Symmetric: s is in links(r) exactly when r is in links(s).
std::vector<int> links(const RingLayout& ring, int rank);

// One rank's share of the monitoring (the keepalive thread's, or a simulated rank's): the
// heartbeats to its guardians, the silence of its wards, and the notices it owes its links.
// Not shared: one thread calls everything.
class RingMonitor {
 public:
  // What the monitor sends through: 0, -EAGAIN (try again at a later tick), or another error
  // (that message is given up).
  struct Outbox {
    virtual int send(int to, Beat kind, int subject) noexcept = 0;

   protected:
    ~Outbox() = default;
  };

  RingMonitor(std::shared_ptr<const RingLayout> ring, int rank, int timeout_ms, int check_ms);
  const std::vector<int>& links() const noexcept { return links_; }
  // A heartbeat arrived from `rank`.
  void heard(int rank) noexcept { silence_.heard(rank); }
  // `subject` is newly known gone by failure: a notice of it goes to each link (but it).
  void spread(int subject);
  // Notices still owed.
  bool spreading() const noexcept { return !owed_.empty(); }
  // One check interval at `now_ns` (steady clock), `elapsed_ns` after the last: the guardians
  // and wards for what is now gone (found again only when `gone_version`, a count the caller
  // bumps whenever a rank becomes gone, has changed), a heartbeat to each guardian due one, the
  // owed notices, then the silence check: appends each ward silent for the timeout (each once).
  void tick(std::int64_t now_ns, std::int64_t elapsed_ns, std::uint64_t gone_version, const GoneFn& gone, Outbox& out,
            std::vector<int>& silent);
  // The owed notices alone (between ticks, so a notice goes on as soon as it arrives), in the
  // order owed; one refused for now (-EAGAIN) holds back the rest until the next call.
  void flush(const GoneFn& gone, Outbox& out);
  // Finalize: a departing heartbeat to every link not gone (best effort).
  void depart(const GoneFn& gone, Outbox& out);

  const std::vector<int>& watched() const noexcept { return wards_; }
  std::uint64_t beats_sent() const noexcept { return beats_sent_; }
  std::uint64_t notices_sent() const noexcept { return notices_sent_; }
  // The first error other than -EAGAIN a send returned, with its peer (0 and -1: none); the
  // caller logs it once.
  int send_error() const noexcept { return send_error_; }
  int send_error_peer() const noexcept { return send_error_peer_; }

 private:
  struct Owed {
    int subject;
    std::size_t next;  // index in links_ of the next link to tell
  };
  struct Guardian {
    int rank = -1;
    std::int64_t due_ns = 0;
  };
  void note_error(int rc, int peer) noexcept;

  std::shared_ptr<const RingLayout> ring_;
  int rank_;
  std::int64_t beat_every_ns_;
  std::vector<int> links_;
  Guardian guardians_[2];
  std::vector<int> wards_;
  std::uint64_t version_ = ~std::uint64_t{0};  // the gone_version guardians_ and wards_ are for
  std::vector<Owed> owed_;
  Keepalive silence_;
  std::uint64_t beats_sent_ = 0, notices_sent_ = 0;
  int send_error_ = 0, send_error_peer_ = -1;
};

}  // namespace ferry::detail
