// algorithms.cpp — each collective's schedule for one member: dissemination barrier; binomial
// and scatter-allgather broadcast; binomial reduce; recursive-doubling allreduce (with the fold
// of the ranks beyond a power of two) and ring allreduce; ring reduce-scatter; recursive-
// doubling allgather on a power of two and ring allgather; Hillis-Steele scan; direct gather
// and alltoall.
#include <algorithm>
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

namespace {

// n blocks of `bytes` in whole elements of `elem` bytes, as even as they go: block b's offset
// and size.
struct Blocks {
  std::size_t base, extra, elem;
  Blocks(std::size_t bytes, std::size_t elem_size, int n)
      : base(bytes / elem_size / static_cast<std::size_t>(n)), extra(bytes / elem_size % static_cast<std::size_t>(n)), elem(elem_size) {}
  std::size_t offset(int b) const { return (static_cast<std::size_t>(b) * base + std::min<std::size_t>(static_cast<std::size_t>(b), extra)) * elem; }
  std::size_t size(int b) const { return (base + (static_cast<std::size_t>(b) < extra ? 1 : 0)) * elem; }
};

int mod(int a, int n) { return ((a % n) + n) % n; }

// Ring reduce-scatter over acc's n blocks (steps first..first+n-2): member r ends with block r
// reduced over every member. Step k: block r-k-1 to the right, block r-k-2 from the left.
void ring_reduce_scatter(Schedule& s, int n, int me, unsigned char* acc, const Blocks& b, std::uint16_t first) {
  const int right = mod(me + 1, n), left = mod(me - 1, n);
  for (int k = 0; k + 1 < n; ++k) {
    Round& r = k == 0 ? first_round(s) : s.add_round();
    const int out = mod(me - k - 1, n), in = mod(me - k - 2, n);
    const auto step = static_cast<std::uint16_t>(first + k);
    r.sends.push_back({right, step, acc + b.offset(out), b.size(out)});
    r.recvs.push_back({left, step, acc + b.offset(in), b.size(in), true});
  }
}

// Ring allgather of acc's n blocks, member r holding block r (steps first..first+n-2).
// Step k: block r-k to the right, block r-k-1 from the left. `map` turns a ring position into
// a team index (the identity, or a broadcast's rotation by its root).
template <class Map>
void ring_allgather(Schedule& s, int n, int me, unsigned char* acc, const Blocks& b, std::uint16_t first, bool in_first,
                    Map&& map) {
  for (int k = 0; k + 1 < n; ++k) {
    Round& r = k == 0 && in_first ? first_round(s) : s.add_round();
    const int out = mod(me - k, n), in = mod(me - k - 1, n);
    const auto step = static_cast<std::uint16_t>(first + k);
    r.sends.push_back({map(mod(me + 1, n)), step, acc + b.offset(out), b.size(out)});
    r.recvs.push_back({map(mod(me - 1, n)), step, acc + b.offset(in), b.size(in), false});
  }
}

}  // namespace

void allreduce_schedule(Schedule& s, int n, int me, const unsigned char* send, unsigned char* recv, std::size_t bytes,
                        const Reduction& red, bool ring) {
  const bool use_ring = ring && n >= 3;  // two members: the ring is the one exchange of recursive doubling
  s.reset(use_ring ? "ring" : "recursive_doubling", red);
  copy_in(s.add_round(), recv, send, bytes);
  if (!use_ring) {
    recursive_doubling(s, n, me, recv, bytes);
    return;
  }
  const Blocks b(bytes, std::max<std::size_t>(1, size_of(red.type)), n);
  ring_reduce_scatter(s, n, me, recv, b, 0);
  ring_allgather(s, n, me, recv, b, static_cast<std::uint16_t>(n - 1), false, [](int i) { return i; });
}

void reduce_scatter_schedule(Schedule& s, int n, int me, const unsigned char* send, unsigned char* recv, std::size_t block,
                             const Reduction& red) {
  // The ring over a copy of the whole vector in scratch, then this member's block.
  s.reset("ring", red);
  const std::size_t total = block * static_cast<std::size_t>(n);
  unsigned char* all = s.scratch(total);
  copy_in(s.add_round(), all, send, total);
  const Blocks b(total, block == 0 ? 1 : block, n);
  ring_reduce_scatter(s, n, me, all, b, 0);
  copy_in(s.add_round(), recv, all + static_cast<std::size_t>(me) * block, block);
}

void scatter_allgather_broadcast_schedule(Schedule& s, int n, int me, int root, unsigned char* buffer, std::size_t size) {
  s.reset("scatter_allgather");
  const int vr = mod(me - root, n);
  const auto real = [&](int v) { return mod(v + root, n); };
  const Blocks b(size, 1, n);
  // The blocks of virtual ranks [lo, hi): contiguous in the buffer.
  const auto span = [&](int lo, int hi) { return b.offset(std::min(hi, n)) - b.offset(lo); };
  int top;
  if (vr != 0) {
    const int low = vr & -vr;
    s.add_round().recvs.push_back({real(vr - low), 0, buffer + b.offset(vr), span(vr, vr + low), false});
    top = low;
  } else {
    top = 1;
    while (top < n) top *= 2;
  }
  Round& down = s.add_round();
  for (int mask = top / 2; mask >= 1; mask /= 2) {
    const int child = vr + mask;
    if (child < n) down.sends.push_back({real(child), 0, buffer + b.offset(child), span(child, child + mask)});
  }
  ring_allgather(s, n, vr, buffer, b, 1, false, real);
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

void allgather_schedule(Schedule& s, int n, int me, const unsigned char* send, unsigned char* recv, std::size_t size,
                        bool ring) {
  const auto at = [&](int block) { return recv + static_cast<std::size_t>(block) * size; };
  const bool power_of_two = (n & (n - 1)) == 0 && !ring;
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
