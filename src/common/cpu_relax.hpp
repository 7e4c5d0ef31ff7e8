// cpu_relax.hpp — the spin-wait hint, for every loop that waits on another thread's store.
//
// On x86 PAUSE stops the core from speculating down the loop (no memory-order mis-speculation
// flush when the awaited store lands) and yields pipeline resources to a hyperthread sibling;
// on aarch64 YIELD is the equivalent hint. Elsewhere it does nothing. It never enters the
// kernel: loops that may wait long fall back to std::this_thread::yield() themselves.
#pragma once

namespace ferry::detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace ferry::detail
