// cpu_relax.hpp — the spin-wait hint, for every loop that waits on another thread's store.
//
// On x86 PAUSE stops the core from speculating down the loop (no memory-order mis-speculation
// flush when the awaited store lands) and yields pipeline resources to a hyperthread sibling;
// on aarch64 YIELD is the equivalent hint. Elsewhere it does nothing. It never enters the
// kernel: loops that may wait long fall back to a yield, as IdleBackoff below does.
#pragma once

#include <thread>

namespace ferry::detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}


// The wait of a thread that progresses until something arrives: a PAUSE after each call that
// found nothing, and after kSpins of them in a row a yield to the scheduler. With a core per
// rank the yield is a cheap system call that finds nobody to run; with more ranks or threads
// than cores (a laptop, an oversubscribed test) it hands the core to the peer being waited
// for, which otherwise waits a whole time slice of this spin.
class IdleBackoff {
 public:
  static constexpr int kSpins = 32;
  void operator()(bool progressed) noexcept {
    if (progressed) {
      idle_ = 0;
    } else if (++idle_ < kSpins) {
      cpu_relax();
    } else {
      std::this_thread::yield();
      idle_ = 0;
    }
  }

 private:
  int idle_ = 0;
};

}  // namespace ferry::detail
