// get_slots.hpp — the shared-memory transport's table of outstanding gets (copy-mode and
// pushed): setup allocates it, the RMA posts arm its slots, and the poll frees each once the
// get's answer, or its abandonment, is reported.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "net/op_context.hpp"
#include "net/shm/shm_transport.hpp"

namespace ferry::net::shm {

// Outstanding copy-mode gets per transport; a request id is (generation << kGetSlotBits) | slot.
constexpr unsigned kGetSlotBits = 10;
constexpr std::size_t kGetSlots = std::size_t{1} << kGetSlotBits;
// GetSlot::state = (generation << 2) | phase.
constexpr std::uint64_t kSlotFree = 0, kSlotClaimed = 1, kSlotArmed = 2;

// One outstanding copy-mode get. The posting thread claims a free slot (CAS, acquire: the
// previous owner's release of the slot ordered its last reads before our writes), fills it,
// and arms it with a release store that the poll thread's acquire load of state pairs with,
// so a reply sees the fields as written. The poll thread frees it (release) after its event.
struct ShmTransport::GetSlot {
  std::atomic<std::uint64_t> state{0};
  OpContext* ctx = nullptr;
  unsigned char* buf = nullptr;
  std::uint64_t len = 0;
  std::uint64_t received = 0;  // poll-lock holder only
  std::int32_t rank = -1;
};

}  // namespace ferry::net::shm
