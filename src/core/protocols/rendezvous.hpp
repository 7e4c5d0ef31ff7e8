// rendezvous.hpp — the large-message protocol: the receiver reads from the sender's memory.
//
// The sender registers its buffer (or each zero-copy part of an iovec message) and sends an
// RTS naming it; the receiver takes a destination (the matched receive's buffer, or a receive
// block for an active message), reads it with the transport's get in chunks of at most
// max_rma_size, delivers, and answers with a FIN that completes the sender's operation.
// Records are allocated per operation; the reads are issued by progress from the deferred list.
//
// Concurrency. post() and post_iovec() by any thread. start_recv(), on_read() and on_fin() by
// the poll lock holder (or, for start_recv, a post_recv that matched a waiting RTS).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/device_context.hpp"
#include "ferry/runtime.hpp"

namespace ferry::detail {

struct RecvOp;

class Rendezvous {
 public:
  explicit Rendezvous(DeviceContext& dc) : dc_(dc) {}

  // An am (target) or tagged send of `size` bytes.
  Status post(OpKind op, int rank, Tag tag, std::uint16_t target, const void* buffer, std::size_t size,
              CompletionObject* local, void* context);
  // An iovec active message whose zero-copy parts total `total` bytes (checked to fit a packet).
  Status post_iovec(const AmIovecArgs& a, std::size_t total);

  // Starts reading the message an RTS announces. `recv` is the matched user receive (rts_msg)
  // or null (rts_am, rts_iovec). Consumes the RTS packet.
  void start_recv(Packet* rts, const RecvDescriptor* recv);
  // The event of one read chunk (CtxKind::rdv_read).
  void on_read(Chunk* c, int error);
  // A FIN arrived (its packet is consumed).
  void on_fin(Packet* p);

 private:
  bool issue_reads(RecvOp* op);
  void finish(RecvOp* op);
  bool send_fin(int rank, std::uint64_t send_op);

  DeviceContext& dc_;
};

}  // namespace ferry::detail
