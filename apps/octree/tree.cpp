// tree.cpp — the octree proxy's mesh, halo links and kernel (see tree.hpp).
#include "tree.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace octree {

namespace {

constexpr std::size_t kMaxLeaves = 1u << 20;
constexpr double kAlpha = 0.1;      // diffusion number: stable below 1/6
constexpr double kReaction = 1e-3;  // weight of the work term

// The refinement centres, as fractions of the domain; the initial state is a Gaussian at each.
constexpr double kStar[2][3] = {{0.30, 0.35, 0.40}, {0.70, 0.60, 0.55}};
constexpr double kStarWidth = 0.06;

std::string range_text(const char* name, long long v, long long lo, long long hi) {
  return std::string(name) + " " + std::to_string(v) + " is out of range (allowed: " + std::to_string(lo) + " to " +
         std::to_string(hi) + ")";
}

}  // namespace

void check(const Params& p) {
  auto in = [](const char* name, long long v, long long lo, long long hi) {
    if (v < lo || v > hi) throw std::invalid_argument(range_text(name, v, lo, hi));
  };
  in("--cells", p.n, 2, 64);
  in("--min-level", p.min_level, 0, 8);
  in("--max-level", p.max_level, 0, 10);
  if (p.max_level < p.min_level) {
    throw std::invalid_argument("--max-level " + std::to_string(p.max_level) + " is below --min-level " +
                                std::to_string(p.min_level));
  }
  in("--stars", p.stars, 1, 2);
  in("--steps", p.steps, 1, 1'000'000);
  in("--regrid-every", p.regrid_every, 0, 1'000'000);
  in("--work", p.work, 0, 100'000);
}

Mesh::Mesh(const Params& p) : p_(p) {
  check(p);
  R_ = static_cast<std::int64_t>(p.n) << p.max_level;
  nodes_.push_back(Node{});
  build(0, 0, {0, 0, 0});
  link();
}

bool Mesh::near_star(int level, const std::array<std::int64_t, 3>& lo) const {
  // Refined when a star lies within one box width of the box.
  const double w = static_cast<double>(R_ >> level);
  for (int s = 0; s < p_.stars; ++s) {
    double d2 = 0;
    for (int k = 0; k < 3; ++k) {
      const double c = kStar[s][k] * static_cast<double>(R_);
      const double a = static_cast<double>(lo[k]);
      const double gap = c < a ? a - c : (c > a + w ? c - a - w : 0.0);
      d2 += gap * gap;
    }
    if (d2 < w * w) return true;
  }
  return false;
}

void Mesh::build(std::size_t self, int level, std::array<std::int64_t, 3> lo) {
  // Depth first, children in (x, y, z) bit order: leaves come out in Morton order. Nodes are
  // addressed by index: the vector grows while the recursion runs.
  const std::int64_t width = R_ >> level;
  if (level < p_.min_level || (level < p_.max_level && near_star(level, lo))) {
    const std::size_t first = nodes_.size();
    nodes_[self].child = static_cast<std::int32_t>(first);
    nodes_.resize(first + 8);
    const std::int64_t half = width / 2;
    for (int c = 0; c < 8; ++c) {
      build(first + static_cast<std::size_t>(c), level + 1,
            {lo[0] + ((c >> 2) & 1) * half, lo[1] + ((c >> 1) & 1) * half, lo[2] + (c & 1) * half});
    }
    return;
  }
  if (leaves_.size() == kMaxLeaves) {
    throw std::invalid_argument("--min-level " + std::to_string(p_.min_level) + " and --max-level " +
                                std::to_string(p_.max_level) + " give more than " + std::to_string(kMaxLeaves) +
                                " leaves");
  }
  nodes_[self].leaf = static_cast<std::int32_t>(leaves_.size());
  leaves_.push_back(Leaf{level, lo, width, width / p_.n});
  deepest_ = std::max(deepest_, level);
}

std::int32_t Mesh::locate(const std::array<std::int64_t, 3>& f) const {
  std::size_t node = 0;
  std::array<std::int64_t, 3> lo{0, 0, 0};
  std::int64_t width = R_;
  while (nodes_[node].leaf < 0) {
    const std::int64_t half = width / 2;
    int c = 0;
    for (int k = 0; k < 3; ++k) {
      const bool upper = f[k] >= lo[k] + half;
      c |= static_cast<int>(upper) << (2 - k);
      if (upper) lo[k] += half;
    }
    node = static_cast<std::size_t>(nodes_[node].child + c);
    width = half;
  }
  return nodes_[node].leaf;
}

void Mesh::link() {
  const std::size_t L = leaves_.size();
  const int n = p_.n;
  in_.assign(L, {});
  out_.assign(L, {});
  mirror_.assign(L, {});
  for (std::size_t a = 0; a < L; ++a) {
    const Leaf& A = leaves_[a];
    const std::int64_t c = A.cell;
    for (int face = 0; face < 6; ++face) {
      const int d = face / 2;
      const bool high = (face & 1) != 0;
      const int t0 = d == 0 ? 1 : 0, t1 = d == 2 ? 1 : 2;  // the two tangential dimensions
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < n; ++j) {
          const auto slot = static_cast<std::int32_t>(face * n * n + i * n + j);
          // The finest cell holding the ghost cell's centre (one of the two around it when
          // the centre lies on a finest-cell boundary: always the same one).
          std::array<std::int64_t, 3> f{};
          f[d] = high ? A.lo[d] + A.width + c / 2 : A.lo[d] - std::max<std::int64_t>(1, c / 2);
          f[t0] = A.lo[t0] + i * c + c / 2;
          f[t1] = A.lo[t1] + j * c + c / 2;
          if (f[d] < 0 || f[d] >= R_) {
            std::array<int, 3> own{};
            own[d] = high ? n - 1 : 0;
            own[t0] = i;
            own[t1] = j;
            mirror_[a].emplace_back(slot, cell_index(n, own[0], own[1], own[2]));
            continue;
          }
          const std::int32_t b = locate(f);
          const Leaf& B = leaves_[static_cast<std::size_t>(b)];
          const auto cell = static_cast<std::int32_t>(cell_index(n, static_cast<int>((f[0] - B.lo[0]) / B.cell),
                                                                 static_cast<int>((f[1] - B.lo[1]) / B.cell),
                                                                 static_cast<int>((f[2] - B.lo[2]) / B.cell)));
          const int k = in_link_of(a, static_cast<std::uint32_t>(b));
          if (k < 0) {
            in_[a].push_back(Link{static_cast<std::uint32_t>(b), {}, {}});
            out_[static_cast<std::size_t>(b)].push_back(Link{static_cast<std::uint32_t>(a), {}, {}});
          }
          Link& in = k < 0 ? in_[a].back() : in_[a][static_cast<std::size_t>(k)];
          in.slots.push_back(slot);
          // Leaves are linked in order, so B's link to A, if any, is its last.
          out_[static_cast<std::size_t>(b)].back().cells.push_back(cell);
        }
      }
    }
  }
}

int Mesh::in_link_of(std::size_t i, std::uint32_t from) const {
  const std::vector<Link>& links = in_[i];
  for (std::size_t k = 0; k < links.size(); ++k)
    if (links[k].peer == from) return static_cast<int>(k);
  return -1;
}

double initial_value(const Mesh& m, std::size_t leaf, int x, int y, int z) {
  const Leaf& A = m.leaf(leaf);
  const double R = static_cast<double>(static_cast<std::int64_t>(m.params().n) << m.params().max_level);
  const int xyz[3] = {x, y, z};
  double v = 0;
  for (int s = 0; s < m.params().stars; ++s) {
    double d2 = 0;
    for (int k = 0; k < 3; ++k) {
      const double p = (static_cast<double>(A.lo[k]) + (xyz[k] + 0.5) * static_cast<double>(A.cell)) / R;
      d2 += (p - kStar[s][k]) * (p - kStar[s][k]);
    }
    v += std::exp(-d2 / (kStarWidth * kStarWidth));
  }
  return v;
}

void fill_mirrored(const Mesh& m, std::size_t leaf, const double* u, double* ghost) {
  for (const auto& [slot, cell] : m.mirrored(leaf)) ghost[slot] = u[cell];
}

void step_leaf(const Mesh& m, const double* u, const double* ghost, double* out) {
  const int n = m.params().n;
  const int work = m.params().work;
  const int nn = n * n;
  for (int x = 0; x < n; ++x) {
    for (int y = 0; y < n; ++y) {
      for (int z = 0; z < n; ++z) {
        const int i = cell_index(n, x, y, z);
        const double c = u[i];
        const double xm = x > 0 ? u[i - nn] : ghost[0 * nn + y * n + z];
        const double xp = x < n - 1 ? u[i + nn] : ghost[1 * nn + y * n + z];
        const double ym = y > 0 ? u[i - n] : ghost[2 * nn + x * n + z];
        const double yp = y < n - 1 ? u[i + n] : ghost[3 * nn + x * n + z];
        const double zm = z > 0 ? u[i - 1] : ghost[4 * nn + x * n + y];
        const double zp = z < n - 1 ? u[i + 1] : ghost[5 * nn + x * n + y];
        // A source term of `work` terms (Horner): the compute a real kernel spends per cell.
        double acc = 0;
        for (int k = 0; k < work; ++k) acc = acc * c + ((k & 1) != 0 ? -1.0 : 1.0) / (k + 1);
        out[i] = c + kAlpha * (xm + xp + ym + yp + zm + zp - 6 * c) + kReaction * c * (1 - c) * acc;
      }
    }
  }
}

LeafSum leaf_sum(const Mesh& m, const double* u) {
  LeafSum s;
  s.hash = 1469598103934665603ull;
  for (int i = 0; i < m.cells(); ++i) {
    s.sum += u[i];
    std::uint64_t bits = 0;
    std::memcpy(&bits, &u[i], sizeof bits);
    s.hash = (s.hash ^ bits) * 1099511628211ull;
  }
  return s;
}

LeafSum combine(const std::vector<LeafSum>& per_leaf) {
  LeafSum s;
  s.hash = 1469598103934665603ull;
  for (const LeafSum& l : per_leaf) {
    s.sum += l.sum;
    s.hash = (s.hash ^ l.hash) * 1099511628211ull;
  }
  return s;
}

std::vector<LeafSum> run_serial(const Mesh& m) {
  const std::size_t L = m.leaves();
  const auto cells = static_cast<std::size_t>(m.cells());
  const int n = m.params().n;
  std::vector<double> u(L * cells), next(L * cells), ghost(static_cast<std::size_t>(m.ghosts()));
  for (std::size_t a = 0; a < L; ++a)
    for (int x = 0; x < n; ++x)
      for (int y = 0; y < n; ++y)
        for (int z = 0; z < n; ++z) u[a * cells + static_cast<std::size_t>(cell_index(n, x, y, z))] = initial_value(m, a, x, y, z);
  for (int s = 0; s < m.params().steps; ++s) {
    for (std::size_t a = 0; a < L; ++a) {
      for (const Link& in : m.in_links(a)) {
        // The source's out-link to a carries the cells in the order of in.slots.
        const std::vector<Link>& outs = m.out_links(in.peer);
        const auto it = std::find_if(outs.begin(), outs.end(), [a](const Link& o) { return o.peer == a; });
        for (std::size_t k = 0; k < in.slots.size(); ++k)
          ghost[static_cast<std::size_t>(in.slots[k])] = u[in.peer * cells + static_cast<std::size_t>(it->cells[k])];
      }
      fill_mirrored(m, a, &u[a * cells], ghost.data());
      step_leaf(m, &u[a * cells], ghost.data(), &next[a * cells]);
    }
    u.swap(next);
  }
  std::vector<LeafSum> sums(L);
  for (std::size_t a = 0; a < L; ++a) sums[a] = leaf_sum(m, &u[a * cells]);
  return sums;
}

}  // namespace octree
