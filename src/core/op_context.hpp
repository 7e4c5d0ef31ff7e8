// op_context.hpp — what a transport hands back with each completion.
//
// Every operation ferry gives to a transport passes a pointer to an OpContext. OpContext starts
// with 64 bytes that belong to the backend from the post until the operation's event (libfabric
// keeps its fi_context2 there, satisfying FI_CONTEXT and FI_CONTEXT2; the shared-memory backend
// links its local completions through it), and then says what kind of operation it is, so
// progress can dispatch without a lookup.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>

#include "ferry/completion.hpp"

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
struct OpContext {
  static constexpr std::size_t kBackendBytes = 64;
  alignas(8) unsigned char backend[kBackendBytes];
  std::atomic<CtxKind> kind_{CtxKind::recv_packet};

  OpContext() = default;
  OpContext(const OpContext& o) noexcept : kind_(o.kind_.load(std::memory_order_relaxed)) {
    std::memcpy(backend, o.backend, sizeof(backend));
  }
  OpContext& operator=(const OpContext& o) noexcept {
    std::memcpy(backend, o.backend, sizeof(backend));
    kind_.store(o.kind_.load(std::memory_order_relaxed), std::memory_order_relaxed);
    return *this;
  }
  void set_kind(CtxKind k) noexcept { kind_.store(k, std::memory_order_release); }
  CtxKind kind() const noexcept { return kind_.load(std::memory_order_acquire); }
};

}  // namespace ferry::detail
