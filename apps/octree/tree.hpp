// tree.hpp — the octree proxy's mesh: an adaptive octree of leaves, each a block of n³ cells,
// and the halo links between leaves. Pure and serial: every rank builds the same tree.
//
// Geometry is in integers. The finest lattice has R = n << max_level cells per dimension; a
// leaf at level l covers a cube of n << (max_level - l) finest cells, its own cells being
// 1 << (max_level - l) finest cells wide. Leaves are numbered in depth-first order, which is
// Morton order: consecutive leaves are close in space, so a contiguous range is a subtree-like
// piece of the domain.
//
// A leaf's ghost cells are the n×n cells just outside each of its six faces, at its own
// resolution. A ghost cell takes the value of the cell of whichever leaf contains its centre
// (a coarser, an equal or a finer neighbour alike), or at the domain's boundary the leaf's own
// adjacent cell (no flux out). The pairs (ghost slot, source cell) are grouped per source leaf
// into links: one message per link per step.
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace octree {

struct Params {
  int n = 8;              // cells per leaf edge
  int min_level = 2;      // every leaf at least this deep
  int max_level = 4;      // refinement near the stars stops here
  int stars = 2;          // 1 or 2 refinement centres
  int steps = 20;         // time steps
  int regrid_every = 5;   // the leaves move to other ranks every K steps (0: never)
  int work = 16;          // extra terms per cell per step (compute intensity)
};

struct Leaf {
  int level = 0;
  std::array<std::int64_t, 3> lo{};  // first finest cell
  std::int64_t width = 0;            // finest cells per edge of the leaf
  std::int64_t cell = 0;             // finest cells per edge of one of its cells
};

// Source leaf `from` fills the ghost slots `slots` of the owning leaf from its cells `cells`
// (same order on both sides).
struct Link {
  std::uint32_t peer = 0;  // in-link: the source leaf; out-link: the destination leaf
  std::vector<std::int32_t> slots;  // in-links: ghost slots of this leaf
  std::vector<std::int32_t> cells;  // out-links: cells of this leaf
};

class Mesh {
 public:
  explicit Mesh(const Params& p);

  const Params& params() const noexcept { return p_; }
  std::size_t leaves() const noexcept { return leaves_.size(); }
  const Leaf& leaf(std::size_t i) const { return leaves_[i]; }
  int cells() const noexcept { return p_.n * p_.n * p_.n; }
  int ghosts() const noexcept { return 6 * p_.n * p_.n; }
  // Links into leaf i (one per source leaf) and out of it (one per destination leaf).
  const std::vector<Link>& in_links(std::size_t i) const { return in_[i]; }
  const std::vector<Link>& out_links(std::size_t i) const { return out_[i]; }
  // Ghost slots of leaf i at the domain's boundary, each with the own cell that mirrors it.
  const std::vector<std::pair<std::int32_t, std::int32_t>>& mirrored(std::size_t i) const { return mirror_[i]; }
  // The index of a link in in_links(i) by its source leaf; -1 when there is none.
  int in_link_of(std::size_t i, std::uint32_t from) const;
  int max_level_present() const noexcept { return deepest_; }

 private:
  struct Node {
    std::int32_t leaf = -1;   // the leaf's number, or -1 for an inner node
    std::int32_t child = -1;  // inner: index of the first of 8 children
  };
  void build(std::size_t self, int level, std::array<std::int64_t, 3> lo);
  bool near_star(int level, const std::array<std::int64_t, 3>& lo) const;
  std::int32_t locate(const std::array<std::int64_t, 3>& f) const;  // leaf containing finest cell f
  void link();

  Params p_;
  std::int64_t R_ = 0;
  int deepest_ = 0;
  std::vector<Leaf> leaves_;
  std::vector<Node> nodes_;
  std::vector<std::vector<Link>> in_, out_;
  std::vector<std::vector<std::pair<std::int32_t, std::int32_t>>> mirror_;
};

// Checks what the command line gave; throws std::invalid_argument naming the option and value.
void check(const Params& p);

// Cell index within a leaf, and the initial value of a cell (two Gaussian "stars").
inline int cell_index(int n, int x, int y, int z) { return (x * n + y) * n + z; }
double initial_value(const Mesh& m, std::size_t leaf, int x, int y, int z);

// One time step of one leaf: `ghost` holds its 6n² ghost values (boundary slots included once
// fill_mirrored has run). Deterministic: the same inputs give the same bits on every rank.
void fill_mirrored(const Mesh& m, std::size_t leaf, const double* u, double* ghost);
void step_leaf(const Mesh& m, const double* u, const double* ghost, double* out);

// Checksum of one leaf's cells: their sum, and an FNV-1a hash of their bits.
struct LeafSum {
  double sum = 0;
  std::uint64_t hash = 0;
};
LeafSum leaf_sum(const Mesh& m, const double* u);
// The job's checksum from per-leaf sums, in leaf order.
LeafSum combine(const std::vector<LeafSum>& per_leaf);

// The reference: every leaf stepped in one process, no runtime. Returns per-leaf sums.
std::vector<LeafSum> run_serial(const Mesh& m);

}  // namespace octree
