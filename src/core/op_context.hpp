// op_context.hpp — the core's record of an operation handed to a transport.
//
// The transport's part is net::OpContext (its 64 backend bytes, net/op_context.hpp); the core
// adds what kind of operation it is, so progress can dispatch an event without a lookup
// (static_cast from the event's context: every context the core posts is one of these).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ferry/completion.hpp"
#include "net/op_context.hpp"

namespace ferry::detail {

enum class CtxKind : std::uint8_t {
  recv_packet,    // a pre-posted receive; its packet's `arrived` view is valid from the completion
  send_packet,    // an eager send or control message (packet view `send`); return the packet when done
  rma_single,     // a one-chunk put/get whose state lives in its packet (view `rma`)
  rma_chunk,      // one chunk of a multi-chunk put/get (RmaOp)
  rdv_read,       // one chunk of a rendezvous read (RecvOp)
};

// The kind is written (release) just before an operation is handed to a transport and read
// (acquire) by whichever thread polls its completion. The transport orders the two already,
// but through code and memory no tool can see (another process, for shared memory); this pair
// makes the handoff of everything written before the post explicit. On x86 both are plain moves.
// The kind lives in net::OpContext's owner byte (the core's, never the backend's): this type
// adds functions only, so records that embed it stay standard-layout.
struct OpContext : net::OpContext {
  OpContext() { owner.store(static_cast<std::uint8_t>(CtxKind::recv_packet), std::memory_order_relaxed); }
  OpContext(const OpContext& o) noexcept : net::OpContext() {
    std::memcpy(backend, o.backend, sizeof(backend));
    owner.store(o.owner.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
  OpContext& operator=(const OpContext& o) noexcept {
    std::memcpy(backend, o.backend, sizeof(backend));
    owner.store(o.owner.load(std::memory_order_relaxed), std::memory_order_relaxed);
    return *this;
  }
  void set_kind(CtxKind k) noexcept { owner.store(static_cast<std::uint8_t>(k), std::memory_order_release); }
  CtxKind kind() const noexcept { return static_cast<CtxKind>(owner.load(std::memory_order_acquire)); }
  // The record of a context an event carries back (every context the core posts is one).
  static OpContext* of(net::OpContext* c) noexcept { return static_cast<OpContext*>(c); }
};
static_assert(std::is_standard_layout_v<OpContext> && sizeof(OpContext) == sizeof(net::OpContext));

}  // namespace ferry::detail
