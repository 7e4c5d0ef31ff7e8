// op_context.hpp — what libfabric hands back with each completion.
//
// Every operation ferry gives to libfabric passes a pointer to an OpContext as its context.
// OpContext starts with fi_context2, which satisfies both the FI_CONTEXT and FI_CONTEXT2 mode
// bits (the provider may scribble on it until the operation completes), and then says what
// kind of operation it is, so progress can dispatch without a lookup.
#pragma once

#include <rdma/fabric.h>

#include <atomic>
#include <cstdint>

#include "ferry/completion.hpp"

namespace ferry::detail {

enum class CtxKind : std::uint8_t {
  recv_packet,    // a pre-posted receive; its packet's `arrived` view is valid from the completion
  send_packet,    // an eager send or control message (packet view `send`); return the packet when done
  rma_single,     // a one-chunk put/get whose state lives in its packet (view `rma`)
  rma_chunk,      // one chunk of a multi-chunk put/get (RmaOp)
  rdv_read,       // one chunk of a rendezvous read (RecvOp)
};

// The kind is written (release) just before an operation is handed to libfabric and read
// (acquire) by whichever thread polls its completion. The provider orders the two already,
// but through code and memory no tool can see (another process, for shm); this pair makes
// the handoff of everything written before the post explicit. On x86 both are plain moves.
struct OpContext {
  struct fi_context2 fi;
  std::atomic<CtxKind> kind_{CtxKind::recv_packet};

  OpContext() = default;
  OpContext(const OpContext& o) noexcept : fi(o.fi), kind_(o.kind_.load(std::memory_order_relaxed)) {}
  OpContext& operator=(const OpContext& o) noexcept {
    fi = o.fi;
    kind_.store(o.kind_.load(std::memory_order_relaxed), std::memory_order_relaxed);
    return *this;
  }
  void set_kind(CtxKind k) noexcept { kind_.store(k, std::memory_order_release); }
  CtxKind kind() const noexcept { return kind_.load(std::memory_order_acquire); }
};

}  // namespace ferry::detail
