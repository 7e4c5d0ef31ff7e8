// rma.hpp — put, get and put with notification.
//
// A put of at most the link's inject size without notification is injected (done at once, no
// context). A transfer of at most max_rma_size bytes keeps its whole state in a pool packet
// (view `rma`), so nothing is allocated. A larger one is an RmaOp of chunks issued by progress
// from the deferred list as credits allow; a notifying put writes its last chunk, carrying the
// notification, only after every other chunk completed, so the target never sees the
// notification before the data.
//
// Concurrency. post() by any thread; on_single(), on_chunk() and on_notification() by the poll
// lock holder.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/device_context.hpp"
#include "ferry/runtime.hpp"

namespace ferry::detail {

struct RmaOp;

struct RmaRequest {
  OpKind op;  // put or get
  int rank;
  unsigned char* local;
  std::size_t size;
  const RemoteKey& remote;
  std::size_t offset;
  CompletionObject* local_comp;
  void* context;
  bool notify;
  std::uint64_t notify_data;  // the transport's remote data for a notifying put
};

class Rma {
 public:
  explicit Rma(DeviceContext& dc) : dc_(dc) {}

  // A checked request (the remote key names `rank` and this device, the range fits).
  Status post(const RmaRequest& r);
  // Events: a one-transfer put/get (CtxKind::rma_single) over transport `t`, a chunk of a
  // larger one (rma_chunk), and a notifying put that landed here.
  // `abandoned`: the transport gave the operation up (Event::abandoned): its context's memory
  // is never reused.
  void on_single(Packet* p, net::Transport* t, int error, bool abandoned);
  void on_chunk(Chunk* c, int error, bool abandoned);
  void on_notification(const net::Event& e);

 private:
  bool issue(RmaOp* op);
  void finish(RmaOp* op);

  DeviceContext& dc_;
};

}  // namespace ferry::detail
