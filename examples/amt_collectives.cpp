// amt_collectives: an iterative solver's skeleton on ferry::amt — each step every rank
// computes a local residual, an all_reduce (max) decides convergence on every rank alike, and a
// job-wide counter on rank 0 hands out work items to whichever rank asks first. Run with any
// number of ranks: ferryrun -n 4 amt_collectives.
#include <algorithm>
#include <cstdio>

#include "ferry/amt.hpp"

int main() {
  ferry::amt::Runtime rt({.threads = 2});
  const ferry::amt::Counter next_item = rt.counter();  // collective: every rank has one
  double residual = 1.0 + rt.rank();
  int steps = 0;
  for (;; ++steps) {
    residual /= 2;  // this rank's "work"
    const double worst = rt.all_reduce(residual, [](double a, double b) { return std::max(a, b); }).get();
    if (worst < 1e-3) break;
  }
  // Dynamic work distribution: take items from rank 0's counter until 100 are handed out.
  int mine = 0;
  while (rt.fetch_add(0, next_item, 1).get() < 100) ++mine;
  const int taken = rt.all_reduce(mine, [](int a, int b) { return a + b; }).get();
  rt.finalize();
  std::printf("amt_collectives: rank %d: converged in %d steps; took %d of %d items\n", rt.rank(), steps, mine, taken);
  return taken == 100 ? 0 : 1;
}
