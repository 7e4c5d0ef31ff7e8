// device_harness.hpp — one real device of a one-rank runtime over a ScriptedTransport: the
// frames of a script arrive as messages from rank 0, the device progresses until they are
// consumed, and what reached the application comes back. Used by the fuzz target and by the
// hostile-bytes tests.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "core/device.hpp"
#include "core/runtime_impl.hpp"
#include "ferry/completion.hpp"
#include "scripted_transport.hpp"

namespace ferry::fuzz {

// Small pools so each script sets up quickly; four targets, so ids past them exercise the
// runtime's range check; 2 KiB packets, so fragments past a packet reassemble on the heap.
inline void set_harness_environment() {
  ::setenv("FERRY_BOOTSTRAP", "single", 1);
  ::setenv("FERRY_TRANSPORT", "shm", 1);
  ::setenv("FERRY_PACKETS", "64", 1);
  ::setenv("FERRY_PACKET_SIZE", "2048", 1);
  ::setenv("FERRY_PREPOST", "8", 1);
  ::setenv("FERRY_RECV_DESCRIPTORS", "64", 1);
  ::setenv("FERRY_MAX_TARGETS", "4", 1);
  ::setenv("FERRY_RECV_CACHE", "0", 1);
  if (std::getenv("FERRY_LOG") == nullptr) ::setenv("FERRY_LOG", "off", 1);
}

// What reached the application, copied out of the device's buffers.
struct Delivered {
  OpKind op;
  int rank;
  Tag tag;
  std::size_t size;
  int error;
  std::vector<unsigned char> bytes;  // an active message's payload (a receive's is in its buffer)
};

struct ScriptResult {
  std::uint64_t malformed = 0;     // the device's count of dropped messages
  bool settled = false;            // nothing was left in flight at the end
  std::vector<Delivered> delivered;  // active messages, then receives' completions
};

class DeviceHarness {
 public:
  static DeviceHarness& get() {
    static DeviceHarness* h = new DeviceHarness;  // for the process: the runtime is set up once
    return *h;
  }

  // The one-rank runtime every device of the harness belongs to.
  detail::RuntimeImpl& runtime() noexcept { return *runtime_; }

  // Feeds `frames`; then posts a few receives that match anything (one large, two small that
  // truncate, one empty) for tagged messages, and progresses again.
  // `copy_payloads` false leaves Delivered::bytes empty (the fuzz target reads none of them).
  // `notices` (remote writes with data: put notifications) arrive before the frames.
  ScriptResult run(std::vector<std::vector<unsigned char>> frames, bool copy_payloads = true,
                   std::vector<net::Event> notices = {}) {
    ScriptResult out;
    const std::size_t count = frames.size() + notices.size();
    auto owned = std::make_unique<ScriptedTransport>(std::move(frames), std::move(notices));
    ScriptedTransport* script = owned.get();
    std::vector<std::unique_ptr<net::Transport>> transports;
    transports.push_back(std::move(owned));
    {
      detail::DeviceImpl dev(runtime_->device_parts(), 0, runtime_->config(), std::move(transports), std::vector<int>{0});
      dev.start();
      for (std::size_t i = 0; i < 4 * count + 16 && !script->done(); ++i) (void)dev.progress();
      settle(dev);
      drain(out, copy_payloads);
      const std::size_t sizes[4] = {sizeof buffers_[0], 64, 0, 3000};
      for (int k = 0; k < 4; ++k) {
        const Status st = dev.post_recv(
            RecvArgs{.rank = any_source, .buffer = buffers_[k], .size = sizes[k], .tag = any_tag, .local = &inbox_});
        // A message that was waiting completes the receive at once, in the status.
        if (st.is_done()) out.delivered.push_back(Delivered{OpKind::recv, st.rank, st.tag, st.size, 0, {}});
      }
      settle(dev);
      drain(out, copy_payloads);
      out.malformed = dev.malformed();
      out.settled = dev.in_flight() == 0;
    }
    drain(out, copy_payloads);
    return out;
  }

 private:
  DeviceHarness() {
    set_harness_environment();
    runtime_ = std::make_unique<detail::RuntimeImpl>(RuntimeOptions{});
    for (std::uint16_t id = 0; id < 4; ++id) runtime_->targets().expose(inbox_, id);
  }
  // Progress until the device's rendezvous receives are done (a read budget per call: a
  // 1 GiB message takes 4096 calls), as finalize would wait for them, within a bound.
  static void settle(detail::DeviceImpl& dev) {
    for (int i = 0; i < 16; ++i) (void)dev.progress();
    for (std::size_t i = 0; i < (std::size_t{1} << 20) && dev.in_flight() != 0; ++i) (void)dev.progress();
  }

  // Completions hold packets of the device's pool: each is copied out before the device goes.
  // Without the copy, a payload's first and last bytes are still read, so ASan sees a buffer
  // shorter than the size it claims.
  void drain(ScriptResult& out, bool copy_payloads) {
    while (auto c = inbox_.pop()) {
      const auto* b = static_cast<const unsigned char*>(c->buffer.data());
      const std::size_t n = b != nullptr ? c->buffer.size() : 0;
      if (!copy_payloads && n != 0) sink_ = static_cast<unsigned char>(b[0] ^ b[n - 1]);
      out.delivered.push_back(Delivered{c->op, c->rank, c->tag, c->size, c->error,
                                        copy_payloads ? std::vector<unsigned char>(b, b + n) : std::vector<unsigned char>{}});
    }
  }
  volatile unsigned char sink_ = 0;

  std::unique_ptr<detail::RuntimeImpl> runtime_;
  CompletionQueue inbox_;
  unsigned char buffers_[4][1 << 16] = {};
};

}  // namespace ferry::fuzz
