// extension.cpp — the core's interface to the layers above it inside libferry (extension.hpp).
#include "core/extension.hpp"

#include <mutex>

#include "core/device.hpp"
#include "core/runtime_impl.hpp"

namespace ferry::detail {

struct CoreAccess {
  static RuntimeImpl& runtime(Runtime& r) noexcept { return *r.impl_; }
  static const RuntimeImpl& runtime(const Runtime& r) noexcept { return *r.impl_; }
  static DeviceImpl& device(Device& d) noexcept { return *d.impl_; }
};

DeviceExtension& device_extension(Device& device, const std::function<std::unique_ptr<DeviceExtension>()>& make) {
  return CoreAccess::device(device).extension(make);
}

void expose_collectives(Runtime& runtime, CompletionObject& object) {
  CoreAccess::runtime(runtime).targets().expose_collectives(object);
}

const std::vector<std::uint32_t>& host_of(Runtime& runtime) { return CoreAccess::runtime(runtime).host_of(); }

bool peer_failed(const Runtime& runtime, int rank) noexcept { return CoreAccess::runtime(runtime).failures().failed(rank); }

bool progressing_here(Device& device) noexcept { return CoreAccess::device(device).progressing_here(); }

}  // namespace ferry::detail
