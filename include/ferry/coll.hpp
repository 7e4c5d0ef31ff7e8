// ferry/coll.hpp — teams and their nonblocking collectives.
//
// A Team is a group of ranks of one runtime, bound to one device: the whole job
// (Team::world), or a group made collectively from another team (split by colour and key,
// a subset by index list, the ranks on this rank's host). A team has a size and this rank's
// index in it; its collectives travel on its device and advance as that device progresses.
// A Team is a shared handle (copies name one team) and must not outlive its runtime.
//
// Every collective is posted like any ferry operation and returns
//   done    it is complete (a team of one, say); its local completion object is not signalled;
//   posted  it is under way; `local` is signalled exactly once, with Completion::op ==
//           OpKind::coll, `context`, and error 0, peer_failed_error (Completion::rank: the
//           failed member's rank in the job), or -EPROTO when a member's message did not
//           have the size this member's call expects (the members disagree on the call);
//   failed  a member had failed before it could start (Status::rank: that member).
// It never answers retry: a collective whose messages find the device short of a resource
// keeps them and sends them as progress frees it.
//
// Matching: the members of a team must post its collectives in the same order (the k-th
// collective posted on a team on every member is one operation), with the same operation,
// root, count and type; as in MPI. Any thread may post, and many collectives may be in flight
// on one team and on several teams at once; when several threads post on one team, they must
// agree among themselves on the order (a team is one sequence of operations).
//
// Buffers: the send and receive buffers belong to ferry from the post until completion (or
// `done`); a send buffer is read, a receive buffer written, at any moment in between. A send
// buffer may equal the receive buffer where a call says so (in place).
//
// Peer failure: a collective whose team holds a rank that failed (before or while it runs)
// completes on every survivor that posted it with peer_failed_error naming a failed member,
// never hangs; its receive buffer's content is then undefined. Team construction throws
// ferry::PeerFailed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ferry/completion.hpp"
#include "ferry/datatype.hpp"
#include "ferry/runtime.hpp"
#include "ferry/status.hpp"

namespace ferry {

namespace detail {
class TeamImpl;
}

// user: ReduceArgs::fn. Every reduction must be associative and commutative: ferry combines
// contributions in the order its algorithm finds fastest, not by rank.
enum class ReduceOp : std::uint8_t { sum, prod, min, max, band, bor, bxor, land, lor, user };

const char* to_string(ReduceOp op) noexcept;

// A user reduction: inout[i] = inout[i] (op) in[i] for i < count elements of the call's type.
using ReduceFn = void (*)(void* inout, const void* in, std::size_t count, void* user);

struct CollArgs {
  CompletionObject* local = nullptr;
  void* context = nullptr;
};

// Broadcast: `size` bytes of `buffer` on the root to `buffer` on every member.
struct BroadcastArgs {
  void* buffer = nullptr;
  std::size_t size = 0;
  int root = 0;  // an index in the team
  CompletionObject* local = nullptr;
  void* context = nullptr;
};

// Reduce (to `root`), allreduce, scan (inclusive: member i gets the reduction of members
// 0..i) and reduce-scatter (member i gets block i of `count` elements of the reduction of
// count * size() elements). `send` may equal `recv` (in place); reduce's `recv` matters on the
// root only.
struct ReduceArgs {
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;  // elements (reduce-scatter: per member)
  DataType type = DataType::i64;
  ReduceOp op = ReduceOp::sum;
  ReduceFn fn = nullptr;  // op == user
  void* fn_arg = nullptr;
  int root = 0;           // reduce only
  CompletionObject* local = nullptr;
  void* context = nullptr;
};

// Gather (to `root`) and allgather: `size` bytes from every member, member i's at
// recv + i * size (recv: size() * size bytes; gather's matters on the root only).
struct GatherArgs {
  const void* send = nullptr;
  std::size_t size = 0;
  void* recv = nullptr;
  int root = 0;  // gather only
  CompletionObject* local = nullptr;
  void* context = nullptr;
};

// Alltoall: block j of `send` (size bytes at send + j * size) to member j, block i of
// `recv` from member i.
struct AlltoallArgs {
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t size = 0;  // bytes per member
  CompletionObject* local = nullptr;
  void* context = nullptr;
};

// The `v` forms: per-member byte counts and offsets (in bytes), as MPI's. Allgatherv:
// member i contributes counts[i] bytes, placed at recv + offsets[i] on every member.
// Alltoallv: send_counts[j] bytes at send + send_offsets[j] go to member j, recv_counts[i]
// bytes from member i land at recv + recv_offsets[i]. The vectors are copied at the post.
struct AllgathervArgs {
  const void* send = nullptr;
  void* recv = nullptr;
  std::vector<std::size_t> counts;
  std::vector<std::size_t> offsets;
  CompletionObject* local = nullptr;
  void* context = nullptr;
};
struct AlltoallvArgs {
  const void* send = nullptr;
  std::vector<std::size_t> send_counts;
  std::vector<std::size_t> send_offsets;
  void* recv = nullptr;
  std::vector<std::size_t> recv_counts;
  std::vector<std::size_t> recv_offsets;
  CompletionObject* local = nullptr;
  void* context = nullptr;
};

class Team {
 public:
  Team() noexcept = default;  // no team (split with a negative colour returns one)
  // The whole job on `device`: the same team for every call with one runtime and device.
  static Team world(Runtime& runtime, int device = 0);

  explicit operator bool() const noexcept { return impl_ != nullptr; }
  int size() const noexcept;
  int rank() const noexcept;               // this rank's index in the team
  int world_rank(int index) const;         // the job rank of member `index`
  int index_of(int world_rank) const noexcept;  // the member index of a job rank, or -1

  // Making teams: blocking, progressing the team's device while they wait (not from inside
  // its progress). Throws ferry::PeerFailed if a member has failed, ferry::Error on bad input.
  //
  // Collective over this team: members with the same `color` >= 0 form a team, ordered by
  // `key`, then by index here; a negative colour makes no team (an empty Team).
  Team split(int color, int key) const;
  // Collective over the listed members only (indices in this team, distinct, in the order
  // of the new team): every listed member calls it with the same list; no message is sent.
  Team subset(const std::vector<int>& indices) const;
  // This rank's host: the members that share it (as FERRY_HOST or the hostname says), in
  // this team's order. No message is sent; the same team on every call.
  Team host() const;

  [[nodiscard]] Status post_barrier(const CollArgs& args);
  [[nodiscard]] Status post_broadcast(const BroadcastArgs& args);
  [[nodiscard]] Status post_reduce(const ReduceArgs& args);
  [[nodiscard]] Status post_allreduce(const ReduceArgs& args);
  [[nodiscard]] Status post_reduce_scatter(const ReduceArgs& args);
  [[nodiscard]] Status post_scan(const ReduceArgs& args);
  [[nodiscard]] Status post_gather(const GatherArgs& args);
  [[nodiscard]] Status post_allgather(const GatherArgs& args);
  [[nodiscard]] Status post_allgatherv(const AllgathervArgs& args);
  [[nodiscard]] Status post_alltoall(const AlltoallArgs& args);
  [[nodiscard]] Status post_alltoallv(const AlltoallvArgs& args);

  // Blocking conveniences: post, then progress the team's device until complete. Throw
  // ferry::PeerFailed on a failed member.
  void barrier();
  void allreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op);

 private:
  explicit Team(std::shared_ptr<detail::TeamImpl> impl) noexcept : impl_(std::move(impl)) {}
  std::shared_ptr<detail::TeamImpl> impl_;
};

}  // namespace ferry
