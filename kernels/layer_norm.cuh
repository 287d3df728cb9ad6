// LayerNorm over the last dim (length D) of x, as in ir/reference/norm_ops.cc, in fp32:
//   mean = sum(x) / D
//   r    = 1 / sqrtf(sum((x - mean)^2) / D + eps)   (two passes over the registers: the
//                                                    variance of the centered row, never
//                                                    E[x^2] - mean^2, which cancels)
//   y    = (x - mean) * r * w + b
// The row slice stays in registers, so x is read from memory once. The gradients are the
// rms_norm kernels run on the centered row (passes/vjp_rules.cc, LayerNormVjp). Its residual
// form (add_layer_norm) reads x + branch and writes that sum too (LoadRowWithResidual).
#pragma once

#include "kernels/common.cuh"

namespace kiln::kernels {

// ------------------------------------------------------------------------------- kernels

// y = layer_norm(x, w, b), or with `branch` (add_layer_norm) s = x + branch and y =
// layer_norm(s, w, b), s written to `residual_sum`. Launch: RowLayout's geometry (grid =
// ceil(kRows / kRowsPerBlock), block = kThreadsPerRow * kRowsPerBlock).
template <typename TX, typename TW, typename TB, typename TY, long long kRows, int kD, int kVec, int kThreadsPerRow,
          int kRowsPerBlock, typename TBranch = float, typename TS = float>
__device__ __forceinline__ void LayerNormForward(TY* y, const TX* x, const TW* w, const TB* b, float eps,
                                                 const TBranch* branch = nullptr, TS* residual_sum = nullptr) {
  using Layout = RowLayout<kRows, kD, kVec, kThreadsPerRow, kRowsPerBlock>;
  const long long row = Layout::Row();
  if (row >= kRows) return;  // whole warps only: a warp is one row

  float xs[Layout::kChunks][kVec];
  LoadRowWithResidual<Layout>(x + row * kD, branch == nullptr ? nullptr : branch + row * kD,
                              residual_sum == nullptr ? nullptr : residual_sum + row * kD, xs);
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < Layout::kChunks; ++k) {
    if (Layout::ChunkStart(k) >= kD) continue;
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
    if (y != nullptr) StoreFloats(y + row * kD + i, ys);  // null: add_layer_norm's y unread
  }
}

}  // namespace kiln::kernels
