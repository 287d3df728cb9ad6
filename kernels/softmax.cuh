// Softmax over the last dim (length D) and its gradient, as in
// ir/reference/softmax_ops.cc, in fp32:
//   (m, s) = (max(x), sum(exp(x - m)))      merged online across threads (MaxExpSumOp)
//   y      = exp(x - m) / s
//   dx     = y * (dy - sum(dy * y))
// Each thread keeps its slice of the row in registers: the inputs are read from memory once
// and exp(x - m) is never written anywhere but y.
#pragma once

#include "kernels/common.cuh"

namespace kiln::kernels {

// ------------------------------------------------------------------------------- kernels

// y = softmax(x). Launch: RowLayout's geometry (grid = ceil(kRows / kRowsPerBlock),
// block = kThreadsPerRow * kRowsPerBlock).
template <typename TX, typename TY, long long kRows, int kD, int kVec, int kThreadsPerRow, int kRowsPerBlock>
__device__ __forceinline__ void SoftmaxForward(TY* y, const TX* x) {
  using Layout = RowLayout<kRows, kD, kVec, kThreadsPerRow, kRowsPerBlock>;
  const long long row = Layout::Row();
  if (row >= kRows) return;  // whole warps only: a warp is one row

  float xs[Layout::kChunks][kVec];
  MaxExpSum stats{-CUDART_INF_F, 0.f};
#pragma unroll
  for (int k = 0; k < Layout::kChunks; ++k) {
    const int i = Layout::ChunkStart(k);
    if (i >= kD) continue;
    LoadFloats(x + row * kD + i, xs[k]);
    stats = MaxExpSumOp()(stats, MaxExpSumOf(xs[k]));
  }
  stats = RowReduce<kThreadsPerRow>(stats, MaxExpSumOp(), MaxExpSum{-CUDART_INF_F, 0.f});

#pragma unroll
  for (int k = 0; k < Layout::kChunks; ++k) {
    const int i = Layout::ChunkStart(k);
    if (i >= kD) continue;
    float ys[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) ys[j] = expf(xs[k][j] - stats.max) / stats.sum;
    StoreFloats(y + row * kD + i, ys);
  }
}

// dx = softmax_grad(y, dy). Same geometry as the forward.
template <typename TY, typename TDY, typename TDX, long long kRows, int kD, int kVec, int kThreadsPerRow,
          int kRowsPerBlock>
__device__ __forceinline__ void SoftmaxBackward(TDX* dx, const TY* y, const TDY* dy) {
  using Layout = RowLayout<kRows, kD, kVec, kThreadsPerRow, kRowsPerBlock>;
  const long long row = Layout::Row();
  if (row >= kRows) return;

  float ys[Layout::kChunks][kVec], dys[Layout::kChunks][kVec];
  float dot = 0.f;  // sum(dy * y) over this thread's chunks
#pragma unroll
  for (int k = 0; k < Layout::kChunks; ++k) {
    const int i = Layout::ChunkStart(k);
    if (i >= kD) continue;
    LoadFloats(y + row * kD + i, ys[k]);
    LoadFloats(dy + row * kD + i, dys[k]);
#pragma unroll
    for (int j = 0; j < kVec; ++j) dot += dys[k][j] * ys[k][j];
  }
  dot = RowReduce<kThreadsPerRow>(dot, SumOp(), 0.f);

#pragma unroll
  for (int k = 0; k < Layout::kChunks; ++k) {
    const int i = Layout::ChunkStart(k);
    if (i >= kD) continue;
    float dxs[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) dxs[j] = ys[k][j] * (dys[k][j] - dot);
    StoreFloats(dx + row * kD + i, dxs);
  }
}

}  // namespace kiln::kernels
