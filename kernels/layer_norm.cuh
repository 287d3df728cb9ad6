// LayerNorm over the last dim (length D) of x, as in ir/reference/norm_ops.cc, in fp32:
//   mean = sum(x) / D
//   r    = 1 / sqrtf(sum((x - mean)^2) / D + eps)   (two passes over the registers: the
//                                                    variance of the centered row, never
//                                                    E[x^2] - mean^2, which cancels)
//   y    = (x - mean) * r * w + b
// The row slice stays in registers, so x is read from memory once. The gradients are the
// rms_norm kernels run on the centered row (passes/vjp_rules.cc, LayerNormVjp).
#pragma once

#include "kernels/common.cuh"

namespace kiln::kernels {

// ------------------------------------------------------------------------------- kernels

// y = layer_norm(x, w, b). Launch: RowLayout's geometry (grid = ceil(kRows / kRowsPerBlock),
// block = kThreadsPerRow * kRowsPerBlock).
template <typename TX, typename TW, typename TB, typename TY, long long kRows, int kD, int kVec, int kThreadsPerRow,
          int kRowsPerBlock>
__device__ __forceinline__ void LayerNormForward(TY* y, const TX* x, const TW* w, const TB* b, float eps) {
  using Layout = RowLayout<kRows, kD, kVec, kThreadsPerRow, kRowsPerBlock>;
  const long long row = Layout::Row();
  if (row >= kRows) return;  // whole warps only: a warp is one row
  const TX* x_row = x + row * kD;

  float xs[Layout::kChunks][kVec];
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < Layout::kChunks; ++k) {
    const int i = Layout::ChunkStart(k);
    if (i >= kD) continue;
    LoadFloats(x_row + i, xs[k]);
#pragma unroll
    for (int j = 0; j < kVec; ++j) sum += xs[k][j];
  }
  const float mean = RowReduce<kThreadsPerRow>(sum, SumOp(), 0.f) / kD;

  float sum_squares = 0.f;
#pragma unroll
  for (int k = 0; k < Layout::kChunks; ++k) {
    const int i = Layout::ChunkStart(k);
    if (i >= kD) continue;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      xs[k][j] -= mean;
      sum_squares += xs[k][j] * xs[k][j];
    }
  }
  const float r = 1.f / sqrtf(RowReduce<kThreadsPerRow>(sum_squares, SumOp(), 0.f) / kD + eps);

#pragma unroll
  for (int k = 0; k < Layout::kChunks; ++k) {
    const int i = Layout::ChunkStart(k);
    if (i >= kD) continue;
    float ws[kVec], bs[kVec], ys[kVec];
    LoadFloats(w + i, ws);
    LoadFloats(b + i, bs);
#pragma unroll
    for (int j = 0; j < kVec; ++j) ys[j] = xs[k][j] * r * ws[j] + bs[j];
    StoreFloats(y + row * kD + i, ys);
  }
}

}  // namespace kiln::kernels
