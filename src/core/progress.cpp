#include "core/progress.hpp"

#include <exception>

#include "common/cpu_relax.hpp"
#include "common/log.hpp"
#include "core/config.hpp"

namespace ferry::detail {

ProgressThreads::ProgressThreads(std::vector<Device>& devices, int threads) {
  const int d = static_cast<int>(devices.size());
  threads_.reserve(static_cast<std::size_t>(threads));
  for (int i = 0; i < threads; ++i) {
    std::vector<Device*> mine;
    if (threads <= d) {
      for (int k = i; k < d; k += threads) mine.push_back(&devices[static_cast<std::size_t>(k)]);
    } else {
      mine.push_back(&devices[static_cast<std::size_t>(i % d)]);
    }
    threads_.emplace_back([this, mine = std::move(mine)] { run(mine); });
  }
}

ProgressThreads::~ProgressThreads() {
  stop_.store(true, std::memory_order_release);
  for (auto& t : threads_) t.join();
}

void ProgressThreads::run(std::vector<Device*> mine) noexcept {
  IdleBackoff idle;
  while (!stop_.load(std::memory_order_acquire)) {
    bool any = false;
    for (Device* dev : mine) {
      try {
        any |= dev->progress();
      } catch (const std::exception& e) {
        // Progress only throws on a dead network; report it once and stop this thread, the
        // application sees the failure on its own calls.
        FERRY_LOG(error, "progress thread: %s; the thread stops", e.what());
        return;
      }
    }
    idle(any);
  }
}

std::unique_ptr<ProgressThreads> start_progress_threads(const Config& config, std::vector<Device>& devices) {
  if (config.progress.value != ProgressMode::thread || devices.empty()) return nullptr;
  return std::make_unique<ProgressThreads>(devices, static_cast<int>(config.progress.count));
}

}  // namespace ferry::detail
