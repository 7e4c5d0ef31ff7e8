// ferry/status.hpp — what every nonblocking post returns.
//
//   done    the operation is complete; its local completion object will NOT be signalled.
//           For a receive, the Status carries the matched rank, tag and size.
//   posted  the operation is under way; its local completion object is signalled exactly once.
//   retry   nothing happened (a resource was short); call progress() and post again.
//   failed  nothing happened and nothing will: the peer (Status::rank) has failed (its process
//           died, or its transport reported it unreachable). No completion object is signalled.
//           Posting to that rank again returns failed at once; see Runtime::failed_ranks().
//
// Invalid arguments are not a Status: they throw ferry::Error (error.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry {

enum class StatusKind : std::uint8_t { done, posted, retry, failed };

// Why a post asked to be retried. Running out of a resource is never an error.
#define FERRY_RETRY_REASONS(X)                                                  \
  X(none, "no reason")                                                          \
  X(packet_pool, "the packet pool is empty (receivers hold or have not returned packets)") \
  X(send_queue, "the device's send credits are used up")                        \
  X(transport, "the transport had no room for the operation now (its backend said -EAGAIN)") \
  X(lock, "another thread holds the device lock")

enum class RetryReason : std::uint8_t {
#define FERRY_X(name, text) name,
  FERRY_RETRY_REASONS(FERRY_X)
#undef FERRY_X
  // The name of `transport` in ferry 0.1, when libfabric was the only network backend.
  provider [[deprecated("use RetryReason::transport")]] = transport,
};

const char* to_string(StatusKind kind) noexcept;
const char* to_string(RetryReason reason) noexcept;

struct [[nodiscard]] Status {
  StatusKind kind = StatusKind::done;
  RetryReason reason = RetryReason::none;
  int rank = -1;           // receive done: the sender; failed: the failed peer
  std::uint32_t tag = 0;   // receive done: the matched tag
  std::size_t size = 0;    // receive done: the bytes delivered

  bool is_done() const noexcept { return kind == StatusKind::done; }
  bool is_posted() const noexcept { return kind == StatusKind::posted; }
  bool is_retry() const noexcept { return kind == StatusKind::retry; }
  bool is_failed() const noexcept { return kind == StatusKind::failed; }

  static Status make_done() noexcept { return {}; }
  static Status make_posted() noexcept { return {StatusKind::posted}; }
  static Status make_retry(RetryReason why) noexcept { return {StatusKind::retry, why}; }
  static Status make_failed(int peer) noexcept { return {StatusKind::failed, RetryReason::none, peer}; }
};

}  // namespace ferry
