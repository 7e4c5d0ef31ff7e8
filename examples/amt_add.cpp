// amt_add: ferry/amt.hpp's own example as a program — an action registered on every rank and
// called on rank 1 through a future. Run with two or more ranks: ferryrun -n 2 amt_add.
#include <cstdio>

#include "ferry/amt.hpp"

int main() {
  ferry::amt::Runtime rt({.threads = 4});
  auto add = rt.action("add", [](int a, int b) { return a + b; });
  ferry::amt::Future<int> f = rt.async_future(1, add, 2, 3);
  int five = f.get();       // a worker helps (runs tasks, progresses) while it waits
  rt.finalize();            // collective: returns when no task or parcel is left anywhere
  std::printf("amt_add: rank %d of %d: add(2, 3) on rank 1 = %d over %s\n", rt.rank(), rt.size(), five,
              rt.parcelport().c_str());
  return five == 5 ? 0 : 1;
}
