// matrix.cpp — the block-sparse multiply's layout, values and DGEMM (see matrix.hpp).
#include "matrix.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>

namespace bspmm {

namespace {

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}

bool nonzero(char matrix, int r, int c, double density) {
  const std::uint64_t h = mix((static_cast<std::uint64_t>(matrix) << 48) ^ (static_cast<std::uint64_t>(r) << 24) ^
                              static_cast<std::uint64_t>(c) ^ 0x9E3779B97F4A7C15ull);
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0) < density;
}

}  // namespace

void check(const Stage& s, const std::string& prefix) {
  if (s.blocks < 1 || s.blocks > 4096) {
    throw std::invalid_argument("--" + prefix + "-blocks " + std::to_string(s.blocks) + " is out of range (allowed: 1 to 4096)");
  }
  if (s.block_size < 1 || s.block_size > 4096) {
    throw std::invalid_argument("--" + prefix + "-block-size " + std::to_string(s.block_size) +
                                " is out of range (allowed: 1 to 4096)");
  }
  if (!(s.density > 0.0 && s.density <= 1.0)) {
    throw std::invalid_argument("--" + prefix + "-density " + std::to_string(s.density) + " is out of range (allowed: above 0, at most 1)");
  }
}

Layout::Layout(const Stage& s, int ranks) : s_(s), ranks_(ranks) {
  check(s, "stage");
  const auto n = static_cast<std::size_t>(s.blocks);
  const auto R = static_cast<std::size_t>(ranks);
  a_.resize(n * n);
  b_.resize(n * n);
  a_count_.assign(R, 0);
  b_count_.assign(R, 0);
  c_count_.assign(R, 0);
  c_slot_.assign(n * n, 0);
  contributions_.assign(n * n, 0);
  contributions_to_.assign(R, 0);
  tasks_.assign(R, {});
  std::size_t a_seen = 0, b_seen = 0;
  for (int r = 0; r < s.blocks; ++r) {
    for (int c = 0; c < s.blocks; ++c) {
      if (nonzero('A', r, c, s.density)) {
        const std::size_t owner = a_seen++ % R;
        a_[index(r, c)] = Place{static_cast<int>(owner), a_count_[owner]++ * block_doubles()};
      }
      if (nonzero('B', r, c, s.density)) {
        const std::size_t owner = b_seen++ % R;
        b_[index(r, c)] = Place{static_cast<int>(owner), b_count_[owner]++ * block_doubles()};
      }
      const auto owner = static_cast<std::size_t>(c_owner(r, c));
      c_slot_[index(r, c)] = c_count_[owner]++;
    }
  }
  for (int i = 0; i < s.blocks; ++i) {
    for (int j = 0; j < s.blocks; ++j) {
      for (int k = 0; k < s.blocks; ++k) {
        if (a(i, k).owner < 0 || b(k, j).owner < 0) continue;
        tasks_[total_tasks_++ % R].push_back(Task{i, j, k});
        ++contributions_[index(i, j)];
        ++contributions_to_[static_cast<std::size_t>(c_owner(i, j))];
      }
    }
  }
}

double Layout::flops() const noexcept {
  const double s = s_.block_size;
  return 2.0 * s * s * s * static_cast<double>(total_tasks_);
}

void fill_block(char matrix, int r, int c, int block_size, double* out) {
  const int salt = matrix == 'A' ? 3 : 5;
  for (int x = 0; x < block_size; ++x)
    for (int y = 0; y < block_size; ++y)
      out[static_cast<std::size_t>(x) * static_cast<std::size_t>(block_size) + static_cast<std::size_t>(y)] =
          static_cast<double>((x * 7 + y * salt + r * 11 + c * 13) % 17 - 8) / 8.0;
}

void multiply_add(int block_size, const double* a, const double* b, double* c) {
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, block_size, block_size, block_size, 1.0, a, block_size, b,
              block_size, 1.0, c, block_size);
}

std::string blas_name() {
#ifdef FERRY_BSPMM_OPENBLAS
  return std::string("OpenBLAS (") + openblas_get_config() + ")";
#else
  return "CBLAS";
#endif
}

Check check_rank(const Layout& l, int rank, const double* c) {
  const int n = l.stage().blocks, s = l.stage().block_size;
  const std::size_t bd = l.block_doubles();
  std::vector<double> a(bd), b(bd), ref(bd);
  Check out;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (l.c_owner(i, j) != rank) continue;
      std::fill(ref.begin(), ref.end(), 0.0);
      for (int k = 0; k < n; ++k) {
        if (l.a(i, k).owner < 0 || l.b(k, j).owner < 0) continue;
        fill_block('A', i, k, s, a.data());
        fill_block('B', k, j, s, b.data());
        multiply_add(s, a.data(), b.data(), ref.data());
      }
      const double* got = c + l.c_offset(i, j);
      for (std::size_t e = 0; e < bd; ++e) {
        out.diff2 += (got[e] - ref[e]) * (got[e] - ref[e]);
        out.ref2 += ref[e] * ref[e];
      }
    }
  }
  return out;
}

}  // namespace bspmm
