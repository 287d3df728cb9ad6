// The reference backend's matrix multiply: C[b] = A[b] · B[b] over double values, cache
// blocked, with the work split across a thread pool. Operands are read through offset
// tables, so any dot_general layout (batch, free and contracting dims anywhere, several
// of each) is packed straight into the micro-kernel's panel layout in one pass.
//
// Each C element is the sum over k in increasing order (blocked by kKBlock, the partial
// sums added in order), whatever the thread count: results are deterministic.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/thread_pool.h"

namespace kiln::reference {

// Element (b, row, col) of an operand is data[batch[b] + row_offsets[row] + col_offsets[col]].
struct GemmOperand {
  const double* data;
  std::vector<int64_t> batch_offsets;
  std::vector<int64_t> row_offsets;
  std::vector<int64_t> col_offsets;
};

// A is [batch, m, k], B is [batch, k, n]; writes C as row-major [batch, m, n].
void Gemm(const GemmOperand& a, const GemmOperand& b, double* c, ThreadPool& pool);

}  // namespace kiln::reference
