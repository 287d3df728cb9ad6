// Cross-entropy of logits [N, V] against integer labels [N], and its gradient, as in
// ir/reference/softmax_ops.cc, in fp32:
//   (m, s)   = (max(row), sum(exp(row - m)))     merged online across threads (MaxExpSumOp)
//   loss     = (m - row[label]) + log(s)         = logsumexp(row) - row[label]; m - row[label]
//                                                  first, so a large m cancels exactly
//   dlogits  = (exp(row - m) / s - onehot(label)) * dloss
// Neither kernel materializes the softmax: the loss kernel streams the row once; the
// gradient kernel keeps its slice of the row in registers and writes only dlogits.
// kClasses <= kV: only a row's first kClasses columns are classes; the rest are padding (a
// vocabulary padded for the GEMMs), read as -inf (exp gives 0) and given gradient 0, so the
// padded logits need no slice before the loss and no zero columns after its gradient.
//
// A label outside [0, V) makes that row's loss (or every element of its gradient row) NaN.
// The reference backend reports the bad label as an error; a kernel cannot return one, and
// NaN reaches the loss, where a training loop notices it.
#pragma once

#include "kernels/common.cuh"

namespace kiln::kernels {

// ------------------------------------------------------------------------------- kernels

// Columns kClasses.. of the chunk starting at column i read as -inf: padding, not classes.
// A compile-time no-op when every column is a class.
template <int kClasses, int kVec>
__device__ __forceinline__ void MaskPadding(int i, float (&xs)[kVec]) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    if (i + j >= kClasses) xs[j] = -CUDART_INF_F;
  }
}

// loss[n] = cross_entropy(logits, labels)[n], fp32. Launch: RowLayout's geometry.
template <typename TLogit, typename TLabel, long long kRows, int kV, int kVec, int kThreadsPerRow,
          int kRowsPerBlock, int kClasses>
__device__ __forceinline__ void CrossEntropyForward(float* loss, const TLogit* logits, const TLabel* labels) {
  static_assert(kClasses >= 0 && kClasses <= kV, "classes are a prefix of the row");
  using Layout = RowLayout<kRows, kV, kVec, kThreadsPerRow, kRowsPerBlock>;
  const long long row = Layout::Row();
  if (row >= kRows) return;  // whole warps only: a warp is one row
  const TLogit* row_logits = logits + row * kV;

  MaxExpSum stats{-CUDART_INF_F, 0.f};
#pragma unroll
  for (int k = 0; k < Layout::kChunks; ++k) {
    const int i = Layout::ChunkStart(k);
    if (i >= kV) continue;
    float xs[kVec];
    LoadFloats(row_logits + i, xs);
    MaskPadding<kClasses>(i, xs);
    stats = MaxExpSumOp()(stats, MaxExpSumOf(xs));
  }
  stats = RowReduce<kThreadsPerRow>(stats, MaxExpSumOp(), MaxExpSum{-CUDART_INF_F, 0.f});

  if (Layout::Lane() != 0) return;
  const long long label = static_cast<long long>(labels[row]);
  loss[row] = label < 0 || label >= kClasses ? CUDART_NAN_F : (stats.max - ToFloat(row_logits[label])) + logf(stats.sum);
}

// dlogits = cross_entropy_grad(logits, labels, dloss). Launch: RowLayout's geometry.
template <typename TLogit, typename TLabel, typename TGrad, long long kRows, int kV, int kVec, int kThreadsPerRow,
          int kRowsPerBlock, int kClasses>
__device__ __forceinline__ void CrossEntropyBackward(TGrad* dlogits, const TLogit* logits, const TLabel* labels,
                                                     const float* dloss) {
  using Layout = RowLayout<kRows, kV, kVec, kThreadsPerRow, kRowsPerBlock>;
  const long long row = Layout::Row();
  if (row >= kRows) return;

  float xs[Layout::kChunks][kVec];
  MaxExpSum stats{-CUDART_INF_F, 0.f};
#pragma unroll
  for (int k = 0; k < Layout::kChunks; ++k) {
    const int i = Layout::ChunkStart(k);
    if (i >= kV) continue;
    LoadFloats(logits + row * kV + i, xs[k]);
    MaskPadding<kClasses>(i, xs[k]);
    stats = MaxExpSumOp()(stats, MaxExpSumOf(xs[k]));
  }
  stats = RowReduce<kThreadsPerRow>(stats, MaxExpSumOp(), MaxExpSum{-CUDART_INF_F, 0.f});

  const long long label = static_cast<long long>(labels[row]);
  const float scale = label < 0 || label >= kClasses ? CUDART_NAN_F : dloss[row];
#pragma unroll
  for (int k = 0; k < Layout::kChunks; ++k) {
    const int i = Layout::ChunkStart(k);
    if (i >= kV) continue;
    float grads[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float onehot = i + j == label ? 1.f : 0.f;
      // A padding column (masked to -inf) gets exp(-inf) = 0 and no onehot: gradient 0.
      grads[j] = i + j >= kClasses ? 0.f : (expf(xs[k][j] - stats.max) / stats.sum - onehot) * scale;
    }
    StoreFloats(dlogits + row * kV + i, grads);
  }
}

}  // namespace kiln::kernels
