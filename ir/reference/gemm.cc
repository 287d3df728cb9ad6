#include "ir/reference/gemm.h"

#include <immintrin.h>

#include <algorithm>

#include "ir/status_macros.h"

namespace kiln::reference {
namespace {

// Micro-tile: kMr rows of A times kNr columns of B, held in 12 AVX2 registers.
constexpr int kMr = 6;
constexpr int kNr = 8;
constexpr int kMaxPanelWidth = kMr > kNr ? kMr : kNr;
// Blocking: a kKBlock x kNBlock slice of packed B (512 KiB) stays in L2 while the
// micro-kernel sweeps kMGroup panels of A (12 KiB each) over it.
constexpr int64_t kKBlock = 256;
constexpr int64_t kNBlock = 256;
constexpr int64_t kMGroup = 16;

// Writes a computed tile into C (only the `rows` x `cols` part inside the matrix).
inline void StoreTile(const double (&tile)[kMr][kNr], double* c, int64_t ldc, int rows, int cols, bool accumulate) {
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < cols; ++j) c[r * ldc + j] = (accumulate ? c[r * ldc + j] : 0.0) + tile[r][j];
  }
}

// a: kc x kMr (packed panel), b: kc x kNr (packed panel).
void MicroKernelPortable(int64_t kc, const double* a, const double* b, double* c, int64_t ldc, int rows, int cols,
                         bool accumulate) {
  double tile[kMr][kNr] = {};
  for (int64_t p = 0; p < kc; ++p) {
    for (int r = 0; r < kMr; ++r) {
      for (int j = 0; j < kNr; ++j) tile[r][j] += a[p * kMr + r] * b[p * kNr + j];
    }
  }
  StoreTile(tile, c, ldc, rows, cols, accumulate);
}

// The same sums with AVX2 FMA. Products of f32 (or narrower) operands are exact in
// double, so the fused multiply-add gives the same sums as the portable kernel.
__attribute__((target("avx2,fma"))) void MicroKernelAvx2(int64_t kc, const double* a, const double* b, double* c,
                                                          int64_t ldc, int rows, int cols, bool accumulate) {
  __m256d acc[kMr][2];
  for (int r = 0; r < kMr; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_pd();
  for (int64_t p = 0; p < kc; ++p) {
    const __m256d b0 = _mm256_loadu_pd(b + p * kNr);
    const __m256d b1 = _mm256_loadu_pd(b + p * kNr + 4);
    for (int r = 0; r < kMr; ++r) {
      const __m256d ar = _mm256_broadcast_sd(a + p * kMr + r);
      acc[r][0] = _mm256_fmadd_pd(ar, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_pd(ar, b1, acc[r][1]);
    }
  }
  if (rows == kMr && cols == kNr) {
    for (int r = 0; r < kMr; ++r) {
      double* row = c + r * ldc;
      if (accumulate) {
        _mm256_storeu_pd(row, _mm256_add_pd(_mm256_loadu_pd(row), acc[r][0]));
        _mm256_storeu_pd(row + 4, _mm256_add_pd(_mm256_loadu_pd(row + 4), acc[r][1]));
      } else {
        _mm256_storeu_pd(row, acc[r][0]);
        _mm256_storeu_pd(row + 4, acc[r][1]);
      }
    }
    return;
  }
  double tile[kMr][kNr];
  for (int r = 0; r < kMr; ++r) {
    _mm256_storeu_pd(&tile[r][0], acc[r][0]);
    _mm256_storeu_pd(&tile[r][4], acc[r][1]);
  }
  StoreTile(tile, c, ldc, rows, cols, accumulate);
}

using MicroKernel = void (*)(int64_t, const double*, const double*, double*, int64_t, int, int, bool);

MicroKernel SelectMicroKernel() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return MicroKernelAvx2;
  return MicroKernelPortable;
}

// Packs a [batch, rows, depth] view into panels of `width` rows, each stored depth-major
// ([panel][depth][width], zero-padded past the last row). With `rows_are_cols`, the
// view's rows are the operand's columns (B is packed by its columns).
std::vector<double> Pack(const GemmOperand& x, bool rows_are_cols, int width, ThreadPool& pool) {
  const std::vector<int64_t>& rows = rows_are_cols ? x.col_offsets : x.row_offsets;
  const std::vector<int64_t>& depth = rows_are_cols ? x.row_offsets : x.col_offsets;
  const int64_t batch = static_cast<int64_t>(x.batch_offsets.size());
  const int64_t num_rows = static_cast<int64_t>(rows.size());
  const int64_t k = static_cast<int64_t>(depth.size());
  const int64_t panels = (num_rows + width - 1) / width;
  std::vector<double> packed(batch * panels * k * width, 0.0);
  pool.ParallelFor(batch * panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bp = begin; bp < end; ++bp) {
      const int64_t b = bp / panels;
      const int64_t first_row = (bp % panels) * width;
      const int live = static_cast<int>(std::min<int64_t>(width, num_rows - first_row));
      double* dst = packed.data() + bp * k * width;
      const double* row_start[kMaxPanelWidth];
      for (int r = 0; r < live; ++r) row_start[r] = x.data + x.batch_offsets[b] + rows[first_row + r];
      // Depth outer, panel rows inner: for B the panel rows are neighbouring columns, so
      // each depth step reads one contiguous run instead of striding down K.
      for (int64_t p = 0; p < k; ++p) {
        for (int r = 0; r < live; ++r) dst[p * width + r] = row_start[r][depth[p]];
      }
    }
  });
  return packed;
}

}  // namespace

void Gemm(const GemmOperand& a, const GemmOperand& b, double* c, ThreadPool& pool) {
  static const MicroKernel kernel = SelectMicroKernel();
  const int64_t batch = static_cast<int64_t>(a.batch_offsets.size());
  const int64_t m = static_cast<int64_t>(a.row_offsets.size());
  const int64_t k = static_cast<int64_t>(a.col_offsets.size());
  const int64_t n = static_cast<int64_t>(b.col_offsets.size());
  KILN_CHECK(static_cast<int64_t>(b.batch_offsets.size()) == batch);
  KILN_CHECK(static_cast<int64_t>(b.row_offsets.size()) == k);
  if (batch * m * n == 0) return;
  if (k == 0) {
    std::fill(c, c + batch * m * n, 0.0);
    return;
  }
  const std::vector<double> a_packed = Pack(a, /*rows_are_cols=*/false, kMr, pool);
  const std::vector<double> b_packed = Pack(b, /*rows_are_cols=*/true, kNr, pool);
  const int64_t m_panels = (m + kMr - 1) / kMr;
  const int64_t n_panels = (n + kNr - 1) / kNr;
  const int64_t m_groups = (m_panels + kMGroup - 1) / kMGroup;
  const int64_t n_panels_per_block = kNBlock / kNr;
  const int64_t n_blocks = (n_panels + n_panels_per_block - 1) / n_panels_per_block;

  // A task owns a (batch, group of row panels, block of column panels) tile of C, so no
  // two threads write the same element and the k order per element is fixed.
  pool.ParallelFor(batch * m_groups * n_blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bi = task / (m_groups * n_blocks);
      const int64_t mg = (task / n_blocks) % m_groups;
      const int64_t nb = task % n_blocks;
      const int64_t mp_end = std::min(m_panels, (mg + 1) * kMGroup);
      const int64_t np_end = std::min(n_panels, (nb + 1) * n_panels_per_block);
      for (int64_t k0 = 0; k0 < k; k0 += kKBlock) {
        const int64_t kc = std::min(kKBlock, k - k0);
        for (int64_t mp = mg * kMGroup; mp < mp_end; ++mp) {
          const double* a_panel = a_packed.data() + ((bi * m_panels + mp) * k + k0) * kMr;
          const int rows = static_cast<int>(std::min<int64_t>(kMr, m - mp * kMr));
          for (int64_t np = nb * n_panels_per_block; np < np_end; ++np) {
            const double* b_panel = b_packed.data() + ((bi * n_panels + np) * k + k0) * kNr;
            const int cols = static_cast<int>(std::min<int64_t>(kNr, n - np * kNr));
            double* c_tile = c + (bi * m + mp * kMr) * n + np * kNr;
            kernel(kc, a_panel, b_panel, c_tile, n, rows, cols, /*accumulate=*/k0 > 0);
          }
        }
      }
    }
  });
}

}  // namespace kiln::reference
