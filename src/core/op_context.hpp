// op_context.hpp — what libfabric hands back with each completion.
//
// Every operation ferry gives to libfabric passes a pointer to an OpContext as its context.
// OpContext starts with fi_context2, which satisfies both the FI_CONTEXT and FI_CONTEXT2 mode
// bits (the provider may scribble on it until the operation completes), and then says what
// kind of operation it is, so progress can dispatch without a lookup.
#pragma once

#include <rdma/fabric.h>

#include <cstdint>

#include "ferry/completion.hpp"

namespace ferry::detail {

enum class CtxKind : std::uint8_t {
  recv_packet,    // a pre-posted receive
  send_packet,    // an eager send or control message; return the packet when done
  rma_single,     // a one-chunk put/get whose state lives in its packet
  rma_chunk,      // one chunk of a multi-chunk put/get (RmaOp)
  rdv_read,       // one chunk of a rendezvous read (RecvOp)
};

struct OpContext {
  struct fi_context2 fi;
  CtxKind kind;
};

}  // namespace ferry::detail
