// algorithms.cpp — each collective's schedule for one member: dissemination barrier, binomial
// broadcast and reduce, recursive-doubling allreduce (with the fold of the ranks beyond a
// power of two), recursive-doubling allgather on a power of two and a ring otherwise,
// Hillis-Steele scan, direct gather and alltoall.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "coll/schedule.hpp"

namespace ferry::detail {

namespace {

// Copies `size` bytes from src to dst at the round's start, unless they are one buffer.
void copy_in(Round& round, unsigned char* dst, const unsigned char* src, std::size_t size) {
  if (dst != src && size != 0) round.locals.push_back({dst, src, size, false});
}

int largest_power_of_two_at_most(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

}  // namespace

Schedule barrier_schedule(int n, int me) {
  Schedule s;
  s.algorithm = "dissemination";
  std::uint16_t step = 0;
  for (int d = 1; d < n; d *= 2, ++step) {
    Round r;
    r.sends.push_back({(me + d) % n, step, nullptr, 0});
    r.recvs.push_back({(me - d + n) % n, step, nullptr, 0, false});
    s.rounds.push_back(std::move(r));
  }
  return s;
}

Schedule broadcast_schedule(int n, int me, int root, unsigned char* buffer, std::size_t size) {
  Schedule s;
  s.algorithm = "binomial";
  const int vr = (me - root + n) % n;
  const auto real = [&](int v) { return (v + root) % n; };
  int top;  // children are vr + mask for the masks below `top`
  if (vr != 0) {
    const int low = vr & -vr;
    Round r;
    r.recvs.push_back({real(vr - low), 0, buffer, size, false});
    s.rounds.push_back(std::move(r));
    top = low;
  } else {
    top = 1;
    while (top < n) top *= 2;
  }
  Round r;
  for (int mask = top / 2; mask >= 1; mask /= 2) {
    if (vr + mask < n) r.sends.push_back({real(vr + mask), 0, buffer, size});
  }
  if (!r.sends.empty()) s.rounds.push_back(std::move(r));
  return s;
}

Schedule reduce_schedule(int n, int me, int root, const unsigned char* send, unsigned char* recv, std::size_t bytes,
                         const Reduction& red) {
  Schedule s;
  s.algorithm = "binomial";
  s.reduction = red;
  const int vr = (me - root + n) % n;
  const auto real = [&](int v) { return (v + root) % n; };
  unsigned char* acc = vr == 0 ? recv : s.make_scratch(bytes);
  Round gather;
  copy_in(gather, acc, send, bytes);
  int parent = -1;
  for (int mask = 1; mask < n; mask *= 2) {
    if ((vr & mask) != 0) {
      parent = vr - mask;
      break;
    }
    if (vr + mask < n) gather.recvs.push_back({real(vr + mask), 0, acc, bytes, true});
  }
  s.rounds.push_back(std::move(gather));
  if (parent >= 0) {
    Round up;
    up.sends.push_back({real(parent), 0, acc, bytes});
    s.rounds.push_back(std::move(up));
  }
  return s;
}

Schedule allreduce_schedule(int n, int me, const unsigned char* send, unsigned char* recv, std::size_t bytes,
                            const Reduction& red) {
  Schedule s;
  s.algorithm = "recursive_doubling";
  s.reduction = red;
  const int p = largest_power_of_two_at_most(n);
  const int rem = n - p;
  Round first;
  copy_in(first, recv, send, bytes);
  // The first 2*rem ranks pair up: the even one hands its data to the odd one and waits for
  // the result (steps 0 and 1 + log2 p); the odd ones and the ranks past 2*rem, p in all, run
  // recursive doubling (steps 1..log2 p).
  int vr;  // index among the p, or -1
  if (me < 2 * rem) {
    if (me % 2 == 0) {
      first.sends.push_back({me + 1, 0, recv, bytes});
      vr = -1;
    } else {
      first.recvs.push_back({me - 1, 0, recv, bytes, true});
      vr = me / 2;
    }
  } else {
    vr = me - rem;
  }
  s.rounds.push_back(std::move(first));
  int log_p = 0;
  while ((1 << log_p) < p) ++log_p;
  const auto real = [&](int v) { return v < rem ? v * 2 + 1 : v + rem; };
  if (vr >= 0) {
    std::uint16_t step = 1;
    for (int mask = 1; mask < p; mask *= 2, ++step) {
      const int partner = real(vr ^ mask);
      Round r;
      r.sends.push_back({partner, step, recv, bytes});
      r.recvs.push_back({partner, step, recv, bytes, true});
      s.rounds.push_back(std::move(r));
    }
  }
  const auto last = static_cast<std::uint16_t>(log_p + 1);
  if (me < 2 * rem) {
    Round r;
    if (me % 2 == 0) {
      r.recvs.push_back({me + 1, last, recv, bytes, false});
    } else {
      r.sends.push_back({me - 1, last, recv, bytes});
    }
    s.rounds.push_back(std::move(r));
  }
  return s;
}

Schedule reduce_scatter_schedule(int n, int me, const unsigned char* send, unsigned char* recv, std::size_t block,
                                 const Reduction& red) {
  // The allreduce of the whole vector into scratch, then this member's block.
  const std::size_t total = block * static_cast<std::size_t>(n);
  auto scratch = std::make_unique_for_overwrite<unsigned char[]>(total == 0 ? 1 : total);
  Schedule s = allreduce_schedule(n, me, send, scratch.get(), total, red);
  s.scratch = std::move(scratch);
  s.algorithm = "allreduce";
  Round out;
  copy_in(out, recv, s.scratch.get() + static_cast<std::size_t>(me) * block, block);
  s.rounds.push_back(std::move(out));
  return s;
}

Schedule scan_schedule(int n, int me, const unsigned char* send, unsigned char* recv, std::size_t bytes,
                       const Reduction& red) {
  Schedule s;
  s.algorithm = "hillis_steele";
  s.reduction = red;
  Round first;
  copy_in(first, recv, send, bytes);
  if (n == 1) s.rounds.push_back(std::move(first));
  std::uint16_t step = 0;
  for (int d = 1; d < n; d *= 2, ++step) {
    Round r = step == 0 ? std::move(first) : Round{};
    if (me + d < n) r.sends.push_back({me + d, step, recv, bytes});
    if (me - d >= 0) r.recvs.push_back({me - d, step, recv, bytes, true});
    s.rounds.push_back(std::move(r));
  }
  return s;
}

Schedule gather_schedule(int n, int me, int root, const unsigned char* send, unsigned char* recv, std::size_t size) {
  Schedule s;
  s.algorithm = "direct";
  Round r;
  if (me == root) {
    copy_in(r, recv + static_cast<std::size_t>(me) * size, send, size);
    for (int i = 0; i < n; ++i) {
      if (i != me) r.recvs.push_back({i, 0, recv + static_cast<std::size_t>(i) * size, size, false});
    }
  } else {
    r.sends.push_back({root, 0, send, size});
  }
  s.rounds.push_back(std::move(r));
  return s;
}

Schedule allgather_schedule(int n, int me, const unsigned char* send, unsigned char* recv, std::size_t size) {
  Schedule s;
  const auto at = [&](int block) { return recv + static_cast<std::size_t>(block) * size; };
  Round first;
  copy_in(first, at(me), send, size);
  if ((n & (n - 1)) == 0) {
    s.algorithm = "recursive_doubling";
    std::uint16_t step = 0;
    for (int mask = 1; mask < n; mask *= 2, ++step) {
      Round r = step == 0 ? std::move(first) : Round{};
      const int partner = me ^ mask;
      const int mine = me & ~(mask - 1), theirs = partner & ~(mask - 1);
      r.sends.push_back({partner, step, at(mine), static_cast<std::size_t>(mask) * size});
      r.recvs.push_back({partner, step, at(theirs), static_cast<std::size_t>(mask) * size, false});
      s.rounds.push_back(std::move(r));
    }
    if (n == 1) s.rounds.push_back(std::move(first));
    return s;
  }
  s.algorithm = "ring";
  const int right = (me + 1) % n, left = (me - 1 + n) % n;
  for (int k = 0; k + 1 < n; ++k) {
    Round r = k == 0 ? std::move(first) : Round{};
    r.sends.push_back({right, static_cast<std::uint16_t>(k), at((me - k + n) % n), size});
    r.recvs.push_back({left, static_cast<std::uint16_t>(k), at((me - k - 1 + 2 * n) % n), size, false});
    s.rounds.push_back(std::move(r));
  }
  return s;
}

Schedule allgatherv_schedule(int n, int me, const unsigned char* send, unsigned char* recv,
                             const std::vector<std::size_t>& counts, const std::vector<std::size_t>& offsets) {
  Schedule s;
  s.algorithm = "direct";
  Round r;
  const auto m = static_cast<std::size_t>(me);
  copy_in(r, recv + offsets[m], send, counts[m]);
  for (int i = 0; i < n; ++i) {
    if (i == me) continue;
    const auto k = static_cast<std::size_t>(i);
    r.sends.push_back({i, 0, send, counts[m]});
    r.recvs.push_back({i, 0, recv + offsets[k], counts[k], false});
  }
  s.rounds.push_back(std::move(r));
  return s;
}

Schedule alltoallv_schedule(int n, int me, const unsigned char* send, const std::vector<std::size_t>& send_counts,
                            const std::vector<std::size_t>& send_offsets, unsigned char* recv,
                            const std::vector<std::size_t>& recv_counts, const std::vector<std::size_t>& recv_offsets) {
  Schedule s;
  s.algorithm = "direct";
  Round r;
  const auto m = static_cast<std::size_t>(me);
  copy_in(r, recv + recv_offsets[m], send + send_offsets[m], send_counts[m]);
  // Each member starts with the member after it, so n senders do not all aim at member 0 first.
  for (int k = 1; k < n; ++k) {
    const int to = (me + k) % n, from = (me - k + n) % n;
    r.sends.push_back({to, 0, send + send_offsets[static_cast<std::size_t>(to)], send_counts[static_cast<std::size_t>(to)]});
    r.recvs.push_back({from, 0, recv + recv_offsets[static_cast<std::size_t>(from)],
                       recv_counts[static_cast<std::size_t>(from)], false});
  }
  s.rounds.push_back(std::move(r));
  return s;
}

}  // namespace ferry::detail
