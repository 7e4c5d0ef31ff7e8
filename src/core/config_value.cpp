// Runtime::config_value: the resolved Config of a runtime, by option name, as text.
#include <string>

#include "core/runtime_impl.hpp"
#include "ferry/error.hpp"

namespace ferry {

std::string Runtime::config_value(const std::string& name) const {
  const detail::Config& c = impl_->config();
  auto num = [](std::size_t v) { return std::to_string(v); };
  if (name == "bootstrap") return c.bootstrap;
  if (name == "provider") return c.provider;
  if (name == "devices") return num(static_cast<std::size_t>(c.devices));
  if (name == "packet_size") return num(c.packet_size);
  if (name == "packets") return num(c.packets);
  if (name == "prepost") return num(c.prepost);
  if (name == "recv_descriptors") return num(c.recv_descriptors);
  if (name == "send_credits") return num(c.send_credits);
  if (name == "cq_capacity") return num(c.cq_capacity);
  if (name == "max_targets") return num(c.max_targets);
  if (name == "rdv_threshold") return num(c.rdv_threshold);
  if (name == "fragment") return c.fragment;
  if (name == "fragment_max") return num(c.fragment_max);
  if (name == "lock_model") return c.lock_model;
  if (name == "completion") return c.completion;
  if (name == "header") return c.header;
  if (name == "progress") return c.progress;
  if (name == "device_polling") return c.device_polling;
  if (name == "parcel_queues") return c.parcel_queues;
  throw Error("config_value: '" + name + "' is not an option of the core runtime (see ferry-info)");
}

}  // namespace ferry
