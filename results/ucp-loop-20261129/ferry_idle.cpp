// One idle turn of ferry's polling loop: Device::progress with nothing to deliver (rank 0 of
// two; run by run.sh under ferryrun with FERRY_TRANSPORT=ucx FERRY_LOCK_MODEL=serialized).
#include <chrono>
#include <cstdio>
#include "ferry/ferry.hpp"
int main() {
  ferry::Runtime rt;
  rt.barrier();
  ferry::Device& dev = rt.device();
  if (rt.rank() == 0) {
    for (int k = 0; k < 5; ++k) {
      const int n = 5000000;
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < n; ++i) dev.progress();
      double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n;
      std::printf("idle progress: %.1f ns per call\n", ns);
    }
  }
  rt.barrier();
  rt.finalize();
}
