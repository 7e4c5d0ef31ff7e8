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

// A member's first round: the one that copies its contribution into place (possibly nothing
// else), or, when the schedule has rounds already, the first of them.
Round& first_round(Schedule& s) { return s.size() == 0 ? s.add_round() : s[0]; }

}  // namespace

void barrier_schedule(Schedule& s, int n, int me) {
  s.reset("dissemination");
  std::uint16_t step = 0;
  for (int d = 1; d < n; d *= 2, ++step) {
    Round& r = s.add_round();
    r.sends.push_back({(me + d) % n, step, nullptr, 0});
    r.recvs.push_back({(me - d + n) % n, step, nullptr, 0, false});
  }
}

void broadcast_schedule(Schedule& s, int n, int me, int root, unsigned char* buffer, std::size_t size) {
  s.reset("binomial");
  const int vr = (me - root + n) % n;
  const auto real = [&](int v) { return (v + root) % n; };
  int top;  // children are vr + mask for the masks below `top`
  if (vr != 0) {
    const int low = vr & -vr;
    s.add_round().recvs.push_back({real(vr - low), 0, buffer, size, false});
    top = low;
  } else {
    top = 1;
    while (top < n) top *= 2;
  }
  if (top / 2 >= 1 && vr + 1 < n) {
    Round& r = s.add_round();
    for (int mask = top / 2; mask >= 1; mask /= 2) {
      if (vr + mask < n) r.sends.push_back({real(vr + mask), 0, buffer, size});
    }
  }
}

void reduce_schedule(Schedule& s, int n, int me, int root, const unsigned char* send, unsigned char* recv, std::size_t bytes,
                     const Reduction& red) {
  s.reset("binomial", red);
  const int vr = (me - root + n) % n;
  const auto real = [&](int v) { return (v + root) % n; };
  unsigned char* acc = vr == 0 ? recv : s.scratch(bytes);
  Round& gather = s.add_round();
  copy_in(gather, acc, send, bytes);
  int parent = -1;
  for (int mask = 1; mask < n; mask *= 2) {
    if ((vr & mask) != 0) {
      parent = vr - mask;
      break;
    }
    if (vr + mask < n) gather.recvs.push_back({real(vr + mask), 0, acc, bytes, true});
  }
  if (parent >= 0) s.add_round().sends.push_back({real(parent), 0, acc, bytes});
}

namespace {

// Recursive doubling into `acc` (already holding this member's contribution, or to hold it
// after `first`'s copy): appended to s.
void recursive_doubling(Schedule& s, int n, int me, unsigned char* acc, std::size_t bytes) {
  const int p = largest_power_of_two_at_most(n);
  const int rem = n - p;
  Round& first = first_round(s);
  // The first 2*rem ranks pair up: the even one hands its data to the odd one and waits for
  // the result (steps 0 and 1 + log2 p); the odd ones and the ranks past 2*rem, p in all, run
  // recursive doubling (steps 1..log2 p).
  int vr;  // index among the p, or -1
  if (me < 2 * rem) {
    if (me % 2 == 0) {
      first.sends.push_back({me + 1, 0, acc, bytes});
      vr = -1;
    } else {
      first.recvs.push_back({me - 1, 0, acc, bytes, true});
      vr = me / 2;
    }
  } else {
    vr = me - rem;
  }
  int log_p = 0;
  while ((1 << log_p) < p) ++log_p;
  const auto real = [&](int v) { return v < rem ? v * 2 + 1 : v + rem; };
  if (vr >= 0) {
    std::uint16_t step = 1;
    for (int mask = 1; mask < p; mask *= 2, ++step) {
      const int partner = real(vr ^ mask);
      Round& r = s.add_round();
      r.sends.push_back({partner, step, acc, bytes});
      r.recvs.push_back({partner, step, acc, bytes, true});
    }
  }
  const auto last = static_cast<std::uint16_t>(log_p + 1);
  if (me < 2 * rem) {
    Round& r = s.add_round();
    if (me % 2 == 0) {
      r.recvs.push_back({me + 1, last, acc, bytes, false});
    } else {
      r.sends.push_back({me - 1, last, acc, bytes});
    }
  }
}

}  // namespace

void allreduce_schedule(Schedule& s, int n, int me, const unsigned char* send, unsigned char* recv, std::size_t bytes,
                        const Reduction& red) {
  s.reset("recursive_doubling", red);
  copy_in(s.add_round(), recv, send, bytes);
  recursive_doubling(s, n, me, recv, bytes);
}

void reduce_scatter_schedule(Schedule& s, int n, int me, const unsigned char* send, unsigned char* recv, std::size_t block,
                             const Reduction& red) {
  // The allreduce of the whole vector into scratch, then this member's block.
  s.reset("allreduce", red);
  const std::size_t total = block * static_cast<std::size_t>(n);
  unsigned char* all = s.scratch(total);
  copy_in(s.add_round(), all, send, total);
  recursive_doubling(s, n, me, all, total);
  copy_in(s.add_round(), recv, all + static_cast<std::size_t>(me) * block, block);
}

void scan_schedule(Schedule& s, int n, int me, const unsigned char* send, unsigned char* recv, std::size_t bytes,
                   const Reduction& red) {
  s.reset("hillis_steele", red);
  copy_in(s.add_round(), recv, send, bytes);
  std::uint16_t step = 0;
  for (int d = 1; d < n; d *= 2, ++step) {
    Round& r = step == 0 ? s[0] : s.add_round();
    if (me + d < n) r.sends.push_back({me + d, step, recv, bytes});
    if (me - d >= 0) r.recvs.push_back({me - d, step, recv, bytes, true});
  }
}

void gather_schedule(Schedule& s, int n, int me, int root, const unsigned char* send, unsigned char* recv, std::size_t size) {
  s.reset("direct");
  Round& r = s.add_round();
  if (me == root) {
    copy_in(r, recv + static_cast<std::size_t>(me) * size, send, size);
    for (int i = 0; i < n; ++i) {
      if (i != me) r.recvs.push_back({i, 0, recv + static_cast<std::size_t>(i) * size, size, false});
    }
  } else {
    r.sends.push_back({root, 0, send, size});
  }
}

void allgather_schedule(Schedule& s, int n, int me, const unsigned char* send, unsigned char* recv, std::size_t size) {
  const auto at = [&](int block) { return recv + static_cast<std::size_t>(block) * size; };
  const bool power_of_two = (n & (n - 1)) == 0;
  s.reset(power_of_two ? "recursive_doubling" : "ring");
  copy_in(s.add_round(), at(me), send, size);
  if (power_of_two) {
    std::uint16_t step = 0;
    for (int mask = 1; mask < n; mask *= 2, ++step) {
      Round& r = step == 0 ? s[0] : s.add_round();
      const int partner = me ^ mask;
      const int mine = me & ~(mask - 1), theirs = partner & ~(mask - 1);
      r.sends.push_back({partner, step, at(mine), static_cast<std::size_t>(mask) * size});
      r.recvs.push_back({partner, step, at(theirs), static_cast<std::size_t>(mask) * size, false});
    }
    return;
  }
  const int right = (me + 1) % n, left = (me - 1 + n) % n;
  for (int k = 0; k + 1 < n; ++k) {
    Round& r = k == 0 ? s[0] : s.add_round();
    r.sends.push_back({right, static_cast<std::uint16_t>(k), at((me - k + n) % n), size});
    r.recvs.push_back({left, static_cast<std::uint16_t>(k), at((me - k - 1 + 2 * n) % n), size, false});
  }
}

void allgatherv_schedule(Schedule& s, int n, int me, const unsigned char* send, unsigned char* recv,
                         const std::vector<std::size_t>& counts, const std::vector<std::size_t>& offsets) {
  s.reset("direct");
  Round& r = s.add_round();
  const auto m = static_cast<std::size_t>(me);
  copy_in(r, recv + offsets[m], send, counts[m]);
  for (int i = 0; i < n; ++i) {
    if (i == me) continue;
    const auto k = static_cast<std::size_t>(i);
    r.sends.push_back({i, 0, send, counts[m]});
    r.recvs.push_back({i, 0, recv + offsets[k], counts[k], false});
  }
}

void alltoallv_schedule(Schedule& s, int n, int me, const unsigned char* send, const std::vector<std::size_t>& send_counts,
                        const std::vector<std::size_t>& send_offsets, unsigned char* recv,
                        const std::vector<std::size_t>& recv_counts, const std::vector<std::size_t>& recv_offsets) {
  s.reset("direct");
  Round& r = s.add_round();
  const auto m = static_cast<std::size_t>(me);
  copy_in(r, recv + recv_offsets[m], send + send_offsets[m], send_counts[m]);
  // Each member starts with the member after it, so n senders do not all aim at member 0 first.
  for (int k = 1; k < n; ++k) {
    const auto to = static_cast<std::size_t>((me + k) % n), from = static_cast<std::size_t>((me - k + n) % n);
    r.sends.push_back({static_cast<int>(to), 0, send + send_offsets[to], send_counts[to]});
    r.recvs.push_back({static_cast<int>(from), 0, recv + recv_offsets[from], recv_counts[from], false});
  }
}

}  // namespace ferry::detail
