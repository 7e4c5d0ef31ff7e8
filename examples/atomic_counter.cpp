// atomic_counter: a job-wide ticket counter on rank 0. Rank 0 allocates the counter with
// Device::allocate_memory and publishes its key; every rank takes 1000 tickets with
// post_atomic fetch_add (a CPU atomic on its mapping of rank 0's memory when it shares rank 0's
// host, a message to rank 0 otherwise), then an allreduce checks that no ticket was given
// twice. Run with any number of ranks: ferryrun -n 4 atomic_counter.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "ferry/ferry.hpp"

int main() {
  ferry::Runtime rt;
  ferry::Device& dev = rt.device();
  ferry::MemoryRegion counter;
  if (rt.rank() == 0) {
    counter = dev.allocate_memory(sizeof(std::uint64_t));
    const ferry::RemoteKey k = counter.remote_key();
    rt.kv_put("counter", std::string(reinterpret_cast<const char*>(&k), sizeof k));
  }
  rt.kv_fence();
  ferry::RemoteKey key;
  const std::string bytes = rt.kv_get(0, "counter");
  std::memcpy(&key, bytes.data(), sizeof key);

  constexpr int kTickets = 1000;
  std::uint64_t sum = 0, ticket = 0;
  for (int i = 0; i < kTickets; ++i) {
    ferry::Synchronizer done;
    ferry::Status s;
    while ((s = dev.post_atomic({.rank = 0, .remote = key, .op = ferry::AtomicOp::fetch_add, .type = ferry::DataType::u64,
                                 .operand = 1, .result = &ticket, .local = &done}))
               .is_retry()) {
      dev.progress();
    }
    if (s.is_failed()) return 1;
    while (s.is_posted() && !done.test()) dev.progress();
    sum += ticket;
  }
  // The tickets are 0 .. n*1000-1, each once, exactly when their sum over the job is right.
  ferry::Team world = ferry::Team::world(rt);
  std::uint64_t total = 0;
  world.allreduce(&sum, &total, 1, ferry::DataType::u64, ferry::ReduceOp::sum);
  const std::uint64_t n = static_cast<std::uint64_t>(rt.size()) * kTickets;
  const bool ok = total == n * (n - 1) / 2;
  if (rt.rank() == 0) std::printf("atomic_counter: %d ranks took %llu tickets: %s\n", rt.size(), static_cast<unsigned long long>(n), ok ? "each once" : "WRONG");
  rt.barrier();
  counter = ferry::MemoryRegion();
  rt.finalize();
  return ok ? 0 : 1;
}
