// engine.hpp — what runs ferry's collectives: the teams of one runtime (TeamImpl), each
// collective in flight on them (Op, the execution of its Schedule), and the Engine that
// sends their messages and takes in what arrives.
//
// Messages. Every message of a collective is an active message to the collectives' target
// (kCollectiveTarget) on the team's device: a CollHeader naming the team, the collective's
// sequence number on it, the step and the kind, then the data (eager), or the key a larger
// data is read with (rts: the receiver gets it straight into place and answers fin).
// Everything in a header is checked before use; a message that fails is dropped and logged,
// or, when it names an operation in flight with a size it does not expect, ends that
// operation with -EPROTO.
//
// Matching. A team numbers its collectives in posting order (next_seq_); a message for a
// number this rank has not posted yet waits in the team's unexpected list, one for a team this
// rank has not made yet in the engine's orphans, one for a number already complete (possible
// only after a failure) is dropped.
//
// Threads and locks. A team's state (its ops, their rounds, the unexpected list) is under the
// team's mutex; the engine's (the team table, the orphans, the sends and gets to retry) under
// the engine's. Neither is ever held while calling into a device (a post, a registration) or
// signalling a completion object:
// a post may run another thread's progress (lock models that combine), which may deliver a
// collective's message and take the team's mutex. Work found under a lock goes into an Outbox,
// carried out after it is released. Collectives are not the small-message path: a mutex is
// taken per message.
#pragma once

#include <array>
#include <atomic>
#include <deque>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "coll/schedule.hpp"
#include "coll/wire.hpp"
#include "core/extension.hpp"
#include "ferry/coll.hpp"
#include "ferry/completion.hpp"

namespace ferry::detail {

class Engine;
class TeamImpl;

// A message of a collective, as it arrived: its data stays in the Buffer ferry delivered.
struct Message {
  int src = -1;  // team index
  std::uint16_t step = 0;
  Buffer holder;  // the eager payload: header, and the data when it came eagerly
  const unsigned char* data = nullptr;
  std::size_t size = 0;
  bool rts = false;      // the data waits on its sender, readable through `key`
  bool in_place = false;  // read by a get straight into the receive's destination
  RemoteKey key{};
};

struct Op;

// One message of an Op on its way, in the op's storage for its current round (stable while the
// round runs: the round ends only once every send completed). The device signals the engine
// with it as context when a send it answered `posted` for completes.
struct SendRec {
  Op* op = nullptr;
  int rank = -1;  // job rank
  CollHeader header{};
  const unsigned char* data = nullptr;
  std::vector<unsigned char> bytes;  // the message: header, then the data or the key (capacity kept)
  MemoryRegion region;               // rts: the data's registration, until the fin
  bool awaiting_fin = false;         // rts: the send ends with the receiver's fin
};

// A get of a receive's data from its sender (an rts), into the receive's destination or, for a
// reduction, a landing buffer of the op's.
struct GetRec {
  Op* op = nullptr;
  std::size_t index = 0;  // the receive's, in its round
  int rank = -1;          // the sender's job rank
  std::uint16_t step = 0;
  RemoteKey key{};
  unsigned char* dst = nullptr;
  std::size_t size = 0;
};

// A collective in flight. Pooled per team: every field is reset by the next collective that
// takes it, the vectors keep their capacity. All of it under the team's mutex.
struct Op {
  TeamImpl* team = nullptr;
  std::uint64_t seq = 0;
  Schedule schedule;
  std::size_t round = 0;
  bool round_started = false;
  std::size_t sends_left = 0;  // the current round's sends not yet complete
  std::size_t missing = 0;     // its receives not yet arrived
  std::vector<Message> got;    // by receive index, for the current round
  std::vector<Message> early;  // arrived for a later round
  // Every message this op sent and get it posted, in order (their counts reset at each start):
  // a deque, whose elements stay put as it grows, so a record the device still holds is never
  // moved or reused while the op runs; kept across uses for their buffers' capacity.
  std::deque<SendRec> sends;
  std::size_t send_count = 0;
  std::size_t round_sends = 0;  // sends[round_sends..send_count) are the current round's
  std::deque<GetRec> gets;
  std::size_t get_count = 0;
  std::vector<std::vector<unsigned char>> landing;  // by receive index: a reduction's got data
  CompletionObject* local = nullptr;
  void* context = nullptr;
  std::size_t bytes = 0;  // Completion::size
  bool in_post = true;    // the posting thread is still inside post: it reports the end itself
  bool finished = false;
  int error = 0;
  int error_rank = -1;
  // Back to the pool at 0: 1 while in flight, 1 more per send posted and not complete.
  int refs = 0;
};

// A list that holds its first N entries in place: an Outbox is made per message and post, and
// usually carries one or two sends and at most one completion.
template <class T, std::size_t N>
class SmallList {
 public:
  void push_back(const T& v) {
    if (size_ < N) {
      inline_[size_] = v;
    } else {
      more_.push_back(v);
    }
    ++size_;
  }
  T& operator[](std::size_t i) noexcept { return i < N ? inline_[i] : more_[i - N]; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  void clear() noexcept {
    size_ = 0;
    more_.clear();
  }

 private:
  std::array<T, N> inline_{};
  std::vector<T> more_;
  std::size_t size_ = 0;
};

// A collective's end, to signal once the team's mutex is released.
struct Ended {
  CompletionObject* local = nullptr;
  void* context = nullptr;
  std::size_t bytes = 0;
  int error = 0;
  int rank = -1;
};

// What a locked section leaves to do once the lock is released.
struct Outbox {
  SmallList<SendRec*, 8> sends;
  std::size_t next = 0;  // sends[next..] are still to post
  SmallList<GetRec*, 4> gets;
  std::size_t next_get = 0;
  SmallList<Ended, 2> ended;
  std::vector<MemoryRegion> drop;  // registrations to release (a device call: not under a lock)
  bool empty() const noexcept { return next == sends.size() && next_get == gets.size() && ended.empty() && drop.empty(); }
};

class TeamImpl {
 public:
  // `members`: job ranks, in team order; this rank among them.
  TeamImpl(Engine& engine, Device& device, std::uint64_t id, std::vector<int> members, int world_size);

  Engine& engine() noexcept { return engine_; }
  Device& device() noexcept { return device_; }
  std::uint64_t id() const noexcept { return id_; }
  int size() const noexcept { return static_cast<int>(members_.size()); }
  int me() const noexcept { return me_; }
  int world_rank(int index) const { return members_.at(static_cast<std::size_t>(index)); }
  int index_of(int world_rank) const noexcept;
  const std::vector<int>& members() const noexcept { return members_; }

  // Starts this team's next collective, its schedule filled in by build(Schedule&): done,
  // posted or failed (ferry/coll.hpp).
  template <class Build>
  Status post(Build&& build, std::size_t bytes, CompletionObject* local, void* context) {
    Outbox out;
    Op* op;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      if (const int failed = failed_member(); failed >= 0) return Status::make_failed(failed);
      op = take_op();
      build(op->schedule);
      start(*op, bytes, local, context, out);
    }
    return posted(*op, out);
  }
  // A message for this team (from job rank `src`).
  void on_message(int src, std::uint64_t seq, std::uint16_t step, Message&& m);
  // A send of `op` completed: error 0, or peer_failed_error with the failed rank.
  void send_complete(SendRec& s, int error, int rank);
  // A send of `op` the engine gives up on (its collective ended while it waited to be retried).
  void send_dropped(SendRec& s);
  // An rts or fin left (its post completed): the record's reference goes.
  void posted_only(SendRec& s);
  // A get of an rts's data completed (error 0, or peer_failed_error with the rank).
  void get_complete(GetRec& g, int error);
  // The receiver of this rank's rts read it: the send ends.
  void on_fin(int src, std::uint64_t seq, std::uint16_t step);
  bool running(const GetRec& g);
  void get_dropped(GetRec& g);
  // Ends every collective in flight with peer_failed_error when a member has failed.
  void fail_if_broken();
  // Whether the send's collective still runs (a send to retry is posted only then).
  bool running(const SendRec& s);
  // Teardown: drops the ops in flight and the messages waiting (they hold the team).
  void clear() noexcept;

  // A new team's id: a hash of this team's, `salt`, the number of ids this salt gave before
  // (the same on every member that makes the same teams in the same order) and `extra`.
  std::uint64_t next_child_id(std::uint64_t salt, std::uint64_t extra = 0);
  std::shared_ptr<TeamImpl> host_team;  // Team::host's, made once
  std::mutex make_mutex;                // one construction at a time per team

 private:
  Op* take_op();
  void release(Op& op) noexcept;  // one reference less; the op goes back to the pool at 0
  void start(Op& op, std::size_t bytes, CompletionObject* local, void* context, Outbox& out);
  Status posted(Op& op, Outbox& out);
  void advance(Op& op, Outbox& out);
  void accept(Op& op, Message&& m, Outbox& out);
  void finish(Op& op, int error, int rank, Outbox& out);
  int failed_member() noexcept;  // under mutex_
  std::uint32_t failures_checked_ = 0;  // the failure count failed_ is for, under mutex_
  int failed_ = -1;

  Engine& engine_;
  Device& device_;
  const std::uint64_t id_;
  const std::vector<int> members_;
  int me_ = -1;
  // Job rank -> team index: a vector for a team of most of the job, a sorted list otherwise.
  std::vector<int> index_by_rank_;
  std::vector<std::pair<int, int>> index_sorted_;

  std::mutex mutex_;
  std::uint64_t next_seq_ = 0;                                   // under mutex_
  // In flight, and arrived for collectives not posted yet, by sequence number. Few at a time
  // (a team's collectives complete in about posting order): vectors searched from the front,
  // which keep their capacity, rather than maps that allocate a node per entry.
  std::vector<std::pair<std::uint64_t, Op*>> active_;                  // under mutex_
  std::vector<std::pair<std::uint64_t, Message>> unexpected_;          // under mutex_
  static constexpr std::size_t kNone = ~std::size_t{0};
  std::size_t active_index(std::uint64_t seq) const noexcept {
    for (std::size_t i = 0; i < active_.size(); ++i) {
      if (active_[i].first == seq) return i;
    }
    return kNone;
  }
  std::vector<std::unique_ptr<Op>> ops_;  // every op made, under mutex_
  std::vector<Op*> free_ops_;             // of those, the ones not in use, under mutex_
  std::unordered_map<std::uint64_t, std::uint64_t> child_count_; // under make_mutex
};

class Engine final : public DeviceExtension, public CompletionObject {
 public:
  explicit Engine(Runtime& runtime);
  ~Engine() override;

  // The engine of `runtime` (made on first use; owned by its device 0).
  static Engine& of(Runtime& runtime);
  // The whole job on `device`.
  std::shared_ptr<TeamImpl> world(int device);
  // Registers a team made on this rank, handing it what already arrived for it.
  std::shared_ptr<TeamImpl> add_team(int device, std::uint64_t id, std::vector<int> members);

  Runtime& runtime() noexcept { return runtime_; }
  bool peer_failed(int rank) const noexcept;

  // Carries out what a locked section left: signals the finished ops, posts the sends.
  void run(Outbox& out);

  // CompletionObject: the collectives' messages and the engine's own sends' completions.
  void signal(Completion&& c) noexcept override;
  // DeviceExtension: the sends to retry, and the ops a failure ends.
  void slow_path() noexcept override;

 private:
  void on_message(Completion&& c);
  void post_send(SendRec* s);
  void sent(SendRec& s, int error, int rank);
  void post_get(GetRec* g);

  Runtime& runtime_;
  std::mutex mutex_;
  std::unordered_map<std::uint64_t, std::shared_ptr<TeamImpl>> teams_;  // under mutex_
  std::vector<std::shared_ptr<TeamImpl>> worlds_;                      // by device, under mutex_
  struct Orphan {
    std::uint64_t team, seq;
    int src;
    std::uint16_t step;
    Message m;
  };
  std::vector<Orphan> orphans_;  // under mutex_
  std::vector<SendRec*> retry_;      // under mutex_
  std::vector<GetRec*> retry_gets_;  // under mutex_
  // Entries of retry_ and retry_gets_ (at least), read without the lock; relaxed: a hint, the
  // lock orders the lists themselves.
  std::atomic<std::size_t> retry_count_{0};
  std::uint32_t failures_seen_ = 0;          // under mutex_
  // The team the last message was for: a team is never removed before the engine goes.
  // Release/acquire: the team is constructed before another thread uses the pointer.
  std::atomic<TeamImpl*> last_team_{nullptr};
};

}  // namespace ferry::detail
