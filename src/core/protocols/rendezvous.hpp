// rendezvous.hpp — the large-message protocol: the receiver reads from the sender's memory.
//
// The sender registers its buffer (or each zero-copy part of an iovec message) and sends an
// RTS naming it; the receiver takes a destination (the matched receive's buffer, or a receive
// block for an active message), reads it with the transport's get in chunks of at most
// max_rma_size, delivers, and answers with a FIN that completes the sender's operation. Where
// the transport offers it, a read into a receive block may instead ask the sender to write
// (get_pushed, see FERRY_RDV_READ): the same protocol, the copy made by the other side.
// Records are allocated per operation; the reads are issued by progress from the deferred list.
//
// Concurrency. post() and post_iovec() by any thread. start_recv(), on_read() and on_fin() by
// the poll lock holder (or, for start_recv, a post_recv that matched a waiting RTS).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

#include "core/device_context.hpp"
#include "ferry/runtime.hpp"

namespace ferry::detail {

struct RecvOp;
struct SendOp;

// Rendezvous sends that wait for their FIN, named on the wire by an id (slot index in the low
// 32 bits, the slot's generation in the high 32) that the receiver echoes. The id is looked up
// here and never turned into a pointer, so a repeated, stale or forged FIN, or one from a rank
// the send did not go to, finds nothing (and is reported) instead of freeing memory.
//
// Concurrency: add() by any posting thread, take() and remove() by the poll lock holder or the
// poster; one mutex orders them. It is off the small-message path: a rendezvous post also
// allocates and registers memory.
//
// Peer failure: a send is confirmed once its RTS went out. take_failed() takes only confirmed
// sends, so it never races a post that is still undoing itself (remove); a post confirms and
// then checks the failed flag, taking its send back itself when the rank failed meanwhile.
// The mutex orders the two: one of them sees the other (see DeviceImpl::fail_peer).
class PendingSends {
 public:
  std::uint64_t add(SendOp* op, int rank);
  // The send `id` names, if it went to `rank` and is still pending; it leaves the table.
  SendOp* take(std::uint64_t id, int rank);
  // A post that failed after add(): its slot goes back unused.
  void remove(std::uint64_t id);
  // The RTS of send `id` went out. Returns false when the send is already gone (its FIN came).
  bool confirm(std::uint64_t id);
  // The send `id` names if it is still pending (whatever its rank); it leaves the table.
  SendOp* take_id(std::uint64_t id);
  // Every confirmed send to `rank`; they leave the table.
  void take_failed(int rank, std::vector<SendOp*>& out);

 private:
  struct Slot {
    SendOp* op = nullptr;
    std::uint32_t generation = 0;  // bumped when the slot is freed, so an old id misses
    int rank = -1;
    bool confirmed = false;
  };
  void free_slot(std::uint32_t i);
  std::mutex mutex_;
  std::vector<Slot> slots_;
  std::vector<std::uint32_t> free_;
};

class Rendezvous {
 public:
  explicit Rendezvous(DeviceContext& dc) : dc_(dc) {}
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  // An am (target) or tagged send of `size` bytes.
  Status post(OpKind op, int rank, Tag tag, std::uint16_t target, const void* buffer, std::size_t size,
              CompletionObject* local, void* context);
  // An iovec active message whose zero-copy parts total `total` bytes (checked to fit a packet).
  Status post_iovec(const AmIovecArgs& a, std::size_t total);

  // Starts reading the message an RTS announces. `recv` is the matched user receive (rts_msg)
  // or null (rts_am, rts_iovec). Consumes the RTS packet.
  void start_recv(Packet* rts, const RecvDescriptor* recv);
  // The event of one read chunk (CtxKind::rdv_read).
  // `abandoned`: the transport gave the read up (Event::abandoned): its memory is never reused.
  void on_read(Chunk* c, int error, bool abandoned);
  // A FIN arrived (its packet is consumed).
  void on_fin(Packet* p);
  // `rank` failed: every send waiting for its FIN there completes with peer_failed_error.
  // (Receives reading from it fail at their next read: issue_reads checks the rank.)
  void fail_peer(int rank);
  // Progress (under the poll lock) grants a read budget for one run of the deferred steps and
  // withdraws it after; steps that find none wait, in order, for the next grant.
  void begin_reads() noexcept { read_budget_ = kReadBudget; }
  void end_reads() noexcept { read_budget_ = 0; }

  // Bytes of reads a progress call starts, at least one chunk. Why: a synchronous transport
  // (ferry's shm with cross-memory attach) copies inside get, so a flood of RTS would take a
  // receive block for each and copy into all of them before the application sees the first.
  // Started one budget per call, the application consumes and returns a block before the next
  // read takes one, so a stream reuses a block that is still in cache (ferry-bench msgrate,
  // 1 MiB, window 64, ferry's shm: 15.2-16.7 GB/s with 16 blocks in turn, 19.3-20.5 GB/s with
  // the budget, medians of 5 on one machine). An asynchronous transport keeps reads in flight
  // across calls, so it loses nothing.
  static constexpr std::ptrdiff_t kReadBudget = 256 * 1024;
  // Bytes of pushed reads (get_pushed) in flight, at least one chunk. A pushed read returns at
  // once and the sender copies later, so the budget above would let a flood of RTS take a
  // receive block each; the window keeps the blocks in use few and their memory in cache.
  // Measured (ferry-bench msgrate, 1 MiB, window 64, ferry's shm, 2 ranks, 2 runs each):
  // 47.9-48.4 GB/s with 1 MiB in flight, 50.1-50.7 with 2 MiB, 45.7-49.0 with 4 MiB, 39.7-45.7
  // with 16 MiB, and 15.5-16.0 with 128 MiB (every block of the window taken, all cold): no
  // better than reading.
  static constexpr std::size_t kPushWindow = std::size_t{2} << 20;

 private:
  bool issue_reads(RecvOp* op);
  // One receive's next steps (its blocks, its reads, its finish); false while it must wait.
  bool step(RecvOp* op);
  // The deferred step for every waiting receive: runs them in arrival order and stops at the
  // first that must wait (all later ones would wait too: the read budget, credits or the
  // transport are exhausted). One step for all, so a progress call with thousands of waiting
  // receives costs one look at the first, not one call each. A receive from a failed peer
  // behind a waiting one completes (with the failure) once the ones before it have gone.
  bool run_waiting();
  bool pushes_into(const Link& l, const void* block) const noexcept;
  void prepare(RecvOp* op);
  void finish(RecvOp* op);
  // Every RecvOp from its creation (start_recv: progress, or a thread posting a receive) to
  // its finish, so the destructor frees the unfinished ones. Large-message path only.
  void track(RecvOp* op);
  void untrack(RecvOp* op);
  bool send_fin(int rank, std::uint64_t send_op);
  // Confirms a posted send; completes it with peer_failed_error if its rank failed meanwhile.
  void confirm(std::uint64_t id, int rank);
  // Completes a send taken from pending_: its registrations go, its local completion is signalled.
  void complete_send(SendOp* send, int error);

  DeviceContext& dc_;
  PendingSends pending_;
  std::ptrdiff_t read_budget_ = 0;  // used by deferred steps, which only progress runs
  std::size_t pushing_ = 0;         // bytes of pushed reads in flight (progress only, as read_budget_)
  // Receives waiting to read, in arrival order, and whether run_waiting is deferred. A thread
  // posting a receive may add one (start_recv); progress runs them.
  std::mutex waiting_mutex_;
  std::deque<RecvOp*> waiting_;
  bool waiting_scheduled_ = false;
  std::mutex live_mutex_;
  RecvOp* live_head_ = nullptr;  // the unfinished RecvOps (track/untrack)
};

}  // namespace ferry::detail
