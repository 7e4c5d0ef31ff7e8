// progress.hpp — dedicated progress threads (FERRY_PROGRESS=thread:N).
//
// Contract
//  - Started by RuntimeImpl once every device is connected; stopped (joined) at the start of
//    finalize(), before the drain, so finalize progresses alone from then on.
//  - Thread i progresses devices i, i+N, i+2N, ... (N <= devices). With more threads than
//    devices, thread i progresses device i % devices: the surplus threads share a device and
//    its progress try-lock lets one of them in at a time.
//  - Threads call Device::progress (the public handle), so the lock model in force applies.
//  - An idle thread spins briefly with a pause, then yields: oversubscribed runs (more
//    threads than cores, e.g. tests) still let the workers run.
#pragma once

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "ferry/runtime.hpp"

namespace ferry::detail {

using Config = RuntimeSettings;  // core/config.hpp

class ProgressThreads {
 public:
  // `devices` must outlive this object.
  ProgressThreads(std::vector<Device>& devices, int threads);
  // Stops and joins every thread.
  ~ProgressThreads();
  ProgressThreads(const ProgressThreads&) = delete;
  ProgressThreads& operator=(const ProgressThreads&) = delete;

 private:
  void run(std::vector<Device*> mine) noexcept;

  // Set once by the destructor; the threads read it every iteration. Release/acquire is not
  // needed for data (join() orders everything), relaxed would do; acquire/release keeps the
  // intent readable and costs nothing on x86.
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

// The progress threads the configuration asks for, or null (progress is not thread:N).
std::unique_ptr<ProgressThreads> start_progress_threads(const Config& config, std::vector<Device>& devices);

}  // namespace ferry::detail
