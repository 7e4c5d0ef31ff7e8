// extension.hpp — the core's interface to the layers built into libferry above it (the
// collectives, src/coll/): what they may reach behind the public handles, and nothing more.
// Includes only public headers, so such a layer sees none of the core's internals.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ferry/completion.hpp"
#include "ferry/runtime.hpp"

namespace ferry::detail {

// State a layer keeps per device, driven by the device's progress. Installed once per device
// and owned by it; destroyed first when the device goes (before its packets: it may hold
// received Buffers), after the collectives' target is unexposed.
class DeviceExtension {
 public:
  virtual ~DeviceExtension() = default;
  // In progress's slow path (every 1024 calls, and at once when a peer has failed), by the
  // poll lock holder, after the device failed its own operations with a failed peer: what
  // must be retried or failed without a message to prompt it.
  virtual void slow_path() noexcept = 0;
};

// The device's extension, made by `make` on the first call (any thread; later calls return the
// first one's).
DeviceExtension& device_extension(Device& device, const std::function<std::unique_ptr<DeviceExtension>()>& make);

// The remote-target id of the collectives' messages: above every application id
// (FERRY_MAX_TARGETS is at most 65535). Messages for it that arrive before it is exposed wait.
inline constexpr std::uint16_t kCollectiveTarget = 0xFFFF;
// Exposes `object` under kCollectiveTarget (once per runtime); the runtime's devices unexpose
// it when they go.
void expose_collectives(Runtime& runtime, CompletionObject& object);

// By rank, the lowest rank on its host: ranks with one value share a host.
const std::vector<std::uint32_t>& host_of(Runtime& runtime);
// Whether `rank` is known to have failed (Runtime::failed_ranks; one relaxed load).
bool peer_failed(const Runtime& runtime, int rank) noexcept;
// Whether the calling thread is inside `device`'s progress.
bool progressing_here(Device& device) noexcept;

}  // namespace ferry::detail
