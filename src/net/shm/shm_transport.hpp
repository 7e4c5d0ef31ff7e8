// shm_transport.hpp — ferry's native shared-memory transport: ranks of one host exchange
// messages through lock-free queues of cache-line cells in POSIX shared memory, and move
// large data in one copy with cross-memory attach (or, where the kernel forbids that, in
// pieces through the same queues).
//
// Design
//  - Each transport (one per rank and device) owns one segment (segment.hpp) holding its
//    receive queue (cell_queue.hpp): many senders, of any thread of any process, post into
//    it with one CAS; only the owner's poll consumes it. No lock, no system call and no
//    allocation on the message path, sender or receiver.
//  - send() and every RMA post complete locally: their events go through a lock-free MPSC
//    list linked through the OpContext's backend bytes and come out of a later poll.
//  - Receives are lent (Receives::lent): poll hands each arrived message to the core where
//    it lies, in its cell, and frees the cells at the next poll. A message waits in its cell
//    until a poll has room for it: back-pressure reaches the senders as -EAGAIN, nothing is
//    dropped.
//  - RMA: registration is a local record (key 0, no desc). With cross-memory attach (CMA)
//    put/get are one process_vm_writev/readv at post time, complete at once, and need no
//    progress from the target. put_data then posts a "remote write" cell; if the target's
//    queue is full, the write stands and the notice (and the put_data's event) follow from
//    this transport's later polls.
//  - Copy mode (ShmCopy::copy, or where the CMA probe at connect fails for a peer): a put
//    travels as "put chunk" cells that the target's poll copies in after checking the range
//    lies inside one of its registrations allowing remote writes (else the chunk is dropped
//    and logged); a get is a "get request" cell that the target's poll answers with "get
//    reply" cells (request ids index a table of outstanding gets with a generation; a reply
//    that does not match a live request is dropped). So copy mode needs the target to poll,
//    and a put bigger than the queue needs the initiator to poll too (the rest is pushed
//    from its polls). A put's local event means its data sits in the target's queue; the
//    target writes it before any later cell of the same queue. At most 1024 copy-mode gets
//    are outstanding per transport (beyond: -EAGAIN). The registration table is a map under
//    a mutex (registrations come from any thread); only copy-mode chunks and get requests
//    consult it, never the message path or CMA.
//  - Pushed gets (get_pushed, with CMA to the target): a "get request" cell that also names the
//    destination; the target's poll writes it with one process_vm_writev and answers with a
//    "get done" cell. Used by core only for rendezvous reads into its receive blocks, whose
//    sender polls anyway (it waits for the FIN); the README says why it is faster.
//  - A failed peer: its outstanding copy-mode and pushed gets are given up (abandoned error
//    events) once its process is gone or after kAbandonGraceMs; requests from it are dropped.
//  - Ranks talk to themselves through their own queue (self-sends); RMA to oneself is a
//    memcpy, except in forced copy mode, where it takes the copy path too.
//  - Bytes read from a cell were written by another process: every field is checked before
//    use; a malformed cell is skipped with a warning.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "common/mpsc_queue.hpp"
#include "net/shm/cell_queue.hpp"
#include "net/shm/segment.hpp"
#include "net/transport.hpp"

namespace ferry::net {

const char* to_string(ShmCopy c) noexcept;

struct ShmParams {
  int rank;                  // this process's rank in [0, size)
  int size;                  // the job size
  int device;                // the ferry device index: each device has its own segment and queue
  std::size_t cell_payload;  // largest message (caps().inject_size and max_msg_size); in [8, 16 MiB]
  std::size_t cells;         // cells per receive queue, a power of two in [2, 2^24]
  ShmCopy copy;
};

// Throws ferry::Error naming a bad parameter, or when the segment cannot be created.
std::unique_ptr<Transport> make_shm_transport(const ShmParams& p);

namespace shm {

// What the transport keeps in an OpContext's 64 backend bytes between a post and its event.
// Each is placement-constructed there at the step that needs it; the previous one is dead.
struct DoneNode {  // a local completion waiting for poll
  std::atomic<DoneNode*> next{nullptr};
  OpContext* ctx = nullptr;
  std::uint64_t length = 0;
  std::int32_t rank = -1;
  std::int32_t error = 0;
};
struct PutNode {  // a put still pushing chunks (copy mode) or its put_data notice
  std::atomic<PutNode*> next{nullptr};
  OpContext* ctx = nullptr;
  const unsigned char* src = nullptr;
  std::uint64_t len = 0;
  std::uint64_t addr = 0;
  std::uint64_t done = 0;  // bytes already in the target's queue
  std::uint64_t data = 0;
  std::int32_t rank = -1;
  std::uint32_t notify = 0;  // a put_data: a remote-write cell follows the chunks
};
static_assert(sizeof(DoneNode) <= OpContext::kBackendBytes && alignof(DoneNode) <= 8);
static_assert(sizeof(PutNode) <= OpContext::kBackendBytes && alignof(PutNode) <= 8);

class ShmTransport final : public Transport {
 public:
  explicit ShmTransport(const ShmParams& p);
  ~ShmTransport() override;

  std::string address() const override;
  void connect(const std::vector<std::string>& addresses) override;
  void connected() override;

  int inject(int rank, const void* buf, std::size_t len) override;
  int send(int rank, const void* buf, std::size_t len, void* desc, OpContext* ctx) override;
  int post_recv(void* buf, std::size_t len, void* desc, OpContext* ctx) override;
  int put(int rank, const void* buf, std::size_t len, void* desc, std::uint64_t addr, std::uint64_t key,
          OpContext* ctx) override;
  int put_data(int rank, const void* buf, std::size_t len, void* desc, std::uint64_t data, std::uint64_t addr,
               std::uint64_t key, OpContext* ctx) override;
  int inject_put(int rank, const void* buf, std::size_t len, std::uint64_t addr, std::uint64_t key) override;
  int get(int rank, void* buf, std::size_t len, void* desc, std::uint64_t addr, std::uint64_t key,
          OpContext* ctx) override;
  // With cross-memory attach to `rank`: a request that rank's poll serves by one
  // process_vm_writev into `buf`, then a "get done" cell. Otherwise get().
  int get_pushed(int rank, void* buf, std::size_t len, void* desc, std::uint64_t addr, std::uint64_t key,
                 OpContext* ctx) override;
  int poll(Event* events, int max) override;
  int inject_parts(int rank, const void* head, std::size_t head_len, const void* body, std::size_t body_len) override;
  Registration* register_memory(const void* buf, std::size_t len, Access access) override;
  void deregister(Registration* r) noexcept override;
  void cancel_all() noexcept override;
  // The rank failed: a cell it claimed in this rank's queue and never published is passed
  // over (CellQueue::skip_dead_claim) instead of stalling the queue, and the gets it was to
  // answer are given up (abandon_gets, from later polls).
  void peer_failed(int rank) override;

  // How RMA to `rank` moves data: "self" (memcpy), "cma", "copy", or "none" (no address).
  const char* copy_mode(int rank) const noexcept;
  // For ferry-info: "cma" or "copy" when every peer moves data that way, "self" when there
  // are no peers, else "mixed (cma: ranks 1,2; copy: ranks 3)".
  std::string copy_summary() const;
  // Whether rank's process still exists (kill(pid, 0)); false for ranks without an address.
  bool peer_alive(int rank) const noexcept;
  const std::string& segment_name() const noexcept { return own_.name(); }

 private:
  enum class Mode : std::uint8_t { none, self, cma, copy };
  struct Peer {
    Segment segment;  // empty for this rank itself (its queue is own_'s)
    CellQueue queue;
    pid_t pid = 0;
    Mode mode = Mode::none;
  };
  struct GetSlot;
  struct Serve {  // a get request this rank answers (copy mode, or a pushed get), poll-private
    std::int32_t rank;
    std::int32_t error;  // positive errno to report instead of data, or 0
    std::uint64_t addr, len, offset, id;
    bool push;           // write into the requester at dest (offset == len once written)
    std::uint64_t dest;
  };
  struct Failing {  // a failed rank whose outstanding gets are not given up yet
    int rank;
    std::chrono::steady_clock::time_point deadline;
    int abandoned = 0;  // gets given up so far
  };
  struct Region {
    std::uintptr_t end;
    Access access;
  };

  Peer* peer(int rank) noexcept {
    if (static_cast<unsigned>(rank) >= static_cast<unsigned>(size_)) return nullptr;
    Peer* p = &peers_[static_cast<std::size_t>(rank)];
    return p->mode == Mode::none ? nullptr : p;
  }
  // A local completion for a later poll: inline, for send and the RMA posts of other files.
  void complete(OpContext* ctx, std::size_t length, int rank, int error) noexcept {
    auto* n = new (ctx->backend) DoneNode{};
    n->ctx = ctx;
    n->length = length;
    n->rank = rank;
    n->error = error;
    done_.push(n);
  }
  int start_copy_put(int rank, const void* buf, std::size_t len, std::uint64_t addr, bool notify, std::uint64_t data,
                     OpContext* ctx) noexcept;
  bool push_put(PutNode& n) noexcept;
  void progress_puts() noexcept;
  void progress_serves() noexcept;
  bool region_allows(std::uint64_t addr, std::uint64_t len, Access need) noexcept;
  void on_put_chunk(CellHeader* c, std::uint32_t len, int src) noexcept;
  void on_get_request(CellHeader* c, std::uint32_t len, int src) noexcept;
  bool on_get_reply(CellHeader* c, std::uint32_t len, int src, Event& ev) noexcept;
  bool on_get_done(CellHeader* c, int src, Event& ev) noexcept;
  int request_get(Peer& p, int rank, void* buf, std::size_t len, std::uint64_t addr, bool push,
                  OpContext* ctx) noexcept;
  bool serve_push(Serve& s, CellQueue& q) noexcept;
  int abandon_gets(Event* events, int max) noexcept;

  const int rank_;
  const std::uint64_t claim_mark_ = CellQueue::claim_mark(rank_);  // this rank's part of the claim words it writes
  const int size_;
  const int device_;
  const std::size_t cell_payload_;
  const ShmCopy copy_;
  Segment own_;
  CellQueue rx_;
  std::uint64_t head_ = 0;   // rx_'s consumer position (poll-lock holder)
  std::uint64_t freed_ = 0;  // what rx_'s shared head says: cells below it are free (poll-lock holder)
  std::vector<std::uint8_t> failed_;  // by rank, once one failed: 1 if failed (poll-lock holder)
  std::vector<Failing> failing_;       // poll-lock holder
  std::chrono::steady_clock::time_point next_abandon_check_{};
  std::unique_ptr<Peer[]> peers_;

  detail::MpscQueue<DoneNode> done_;  // local completions (any thread pushes, poll pops)
  // Lending (poll-lock holder): the cells the last poll lent stay unfreed until the next poll,
  // and with them every cell after the first (the shared head frees a prefix), so their
  // senders see them as full meanwhile; a poll lends at most its `max`.
  int lent_count_ = 0;
  // The end of a poll: frees the cells behind the reader and serves pushed gets; returns n.
  int finish_poll(int n);
  std::uint64_t lent_first_ = 0;  // the position of the first cell lent (when lent_count_ > 0)

  detail::MpscQueue<PutNode> outbound_;  // puts that did not fit the target's queue at post
  PutNode* puts_head_ = nullptr;          // ... taken over by poll, in order (poll-lock holder)
  PutNode* puts_tail_ = nullptr;
  // Copy mode.
  std::unique_ptr<GetSlot[]> gets_;       // outstanding gets of this rank
  std::atomic<std::uint64_t> get_hint_{0};
  std::deque<Serve> serves_;              // gets this rank answers (poll-lock holder)
  std::mutex regions_mutex_;              // registration may come from any thread
  std::multimap<std::uintptr_t, Region> regions_;
};

}  // namespace shm
}  // namespace ferry::net
