// matrix.hpp — the block-sparse multiply's data: which blocks of A and B are nonzero, who
// owns each block of A, B and C, which (i, j, k) products each rank computes, the blocks'
// values, and the local DGEMM. Pure and deterministic: every rank derives the same layout.
//
// A stage multiplies A (n×n blocks of s×s doubles) by B (likewise) into C. A block of A or B is
// nonzero with probability `density` (a hash of its coordinates decides); the nonzero blocks
// are dealt round-robin to the ranks, each rank storing its own contiguously (the memory it
// exposes for gets). C's block (i, j) belongs to rank (i·n + j) mod ranks. The products
// A(i,k)·B(k,j) with both blocks nonzero are the tasks, dealt round-robin in (i, j, k) order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace bspmm {

struct Stage {
  int blocks = 8;         // blocks per dimension
  int block_size = 64;    // doubles per block edge
  double density = 0.5;   // fraction of nonzero blocks in A and in B
};

// Checks a stage's parameters; throws std::invalid_argument naming the option and value.
void check(const Stage& s, const std::string& prefix);

struct Place {
  int owner = -1;           // -1: a zero block
  std::size_t offset = 0;   // in doubles, into the owner's storage
};

struct Task {
  int i = 0, j = 0, k = 0;
};

class Layout {
 public:
  Layout(const Stage& s, int ranks);
  const Stage& stage() const noexcept { return s_; }
  std::size_t block_doubles() const noexcept { return static_cast<std::size_t>(s_.block_size) * static_cast<std::size_t>(s_.block_size); }
  const Place& a(int i, int k) const { return a_[index(i, k)]; }
  const Place& b(int k, int j) const { return b_[index(k, j)]; }
  int c_owner(int i, int j) const { return static_cast<int>(index(i, j) % static_cast<std::size_t>(ranks_)); }
  // This rank's C blocks, in (i, j) order: their offset (in doubles) in its C storage.
  std::size_t c_offset(int i, int j) const { return c_slot_[index(i, j)] * block_doubles(); }
  std::size_t a_doubles(int rank) const { return a_count_[static_cast<std::size_t>(rank)] * block_doubles(); }
  std::size_t b_doubles(int rank) const { return b_count_[static_cast<std::size_t>(rank)] * block_doubles(); }
  std::size_t c_doubles(int rank) const { return c_count_[static_cast<std::size_t>(rank)] * block_doubles(); }
  const std::vector<Task>& tasks(int rank) const { return tasks_[static_cast<std::size_t>(rank)]; }
  // Products that accumulate into C(i, j), and into all of `rank`'s C blocks.
  int contributions(int i, int j) const { return contributions_[index(i, j)]; }
  std::size_t contributions_to(int rank) const { return contributions_to_[static_cast<std::size_t>(rank)]; }
  std::size_t total_tasks() const noexcept { return total_tasks_; }
  double flops() const noexcept;  // of the whole multiply

 private:
  std::size_t index(int r, int c) const { return static_cast<std::size_t>(r) * static_cast<std::size_t>(s_.blocks) + static_cast<std::size_t>(c); }
  Stage s_;
  int ranks_;
  std::vector<Place> a_, b_;
  std::vector<std::size_t> a_count_, b_count_, c_count_, c_slot_;
  std::vector<std::vector<Task>> tasks_;
  std::vector<int> contributions_;
  std::vector<std::size_t> contributions_to_;
  std::size_t total_tasks_ = 0;
};

// The values of block (r, c) of matrix 'A' or 'B' (row-major, s×s), small and exact in binary.
void fill_block(char matrix, int r, int c, int block_size, double* out);
// c += a · b for s×s row-major blocks (CBLAS dgemm).
void multiply_add(int block_size, const double* a, const double* b, double* c);
// The BLAS library in use, for the record.
std::string blas_name();

// Every C block of `rank` computed serially from the generator, compared with `c` (that
// rank's C storage): the squared Frobenius norms of the difference and of the reference.
struct Check {
  double diff2 = 0, ref2 = 0;
};
Check check_rank(const Layout& l, int rank, const double* c);

}  // namespace bspmm
