// Cross-entropy of logits [N, V] against integer labels [N], and its gradient, as in
// ir/reference/softmax_ops.cc, in fp32 (logits of any float dtype, widened on load):
//   (m, s)   = (max(row), sum(exp(row - m)))     merged online across threads (MaxExpSumOp)
//   loss     = (m - row[label]) + log(s)         = logsumexp(row) - row[label]; m - row[label]
//                                                  first, so a large m cancels exactly
//   lse      = m + log(s)                        the row's log-sum-exp, for the gradient
//   dlogits  = (exp(row - lse) - onehot(label)) * dloss
// Neither kernel materializes the softmax. The loss kernel reads each row once and writes two
// floats per row; given those, the gradient is elementwise: its kernel reads each logit once
// and writes each gradient once (rounded once to the gradient's dtype), with no reduction,
// no second pass over the row and nothing held in registers across the row.
// kClasses <= kV: only a row's first kClasses columns are classes; the rest are padding (a
// vocabulary padded for the GEMMs), read as -inf (exp gives 0) and given gradient 0, so the
// padded logits need no slice before the loss and no zero columns after its gradient.
//
// llm.c's fused classifier does both in one kernel and writes dlogits over the logits, since
// its dloss is a known constant; here dloss is a value of the backward graph, computed after
// the loss, so the two kernels meet through the 8 bytes per row of (loss, lse) instead.
//
// A label outside [0, V) makes that row's loss (or every element of its gradient row) NaN.
// The reference backend reports the bad label as an error; a kernel cannot return one, and
// NaN reaches the loss, where a training loop notices it.
#pragma once

#include "kernels/common.cuh"

namespace kiln::kernels {

// ------------------------------------------------------------------------------- kernels

namespace cross_entropy {
constexpr float kLog2e = 1.4426950408889634f;
}  // namespace cross_entropy

// Columns kClasses.. of the chunk starting at column i read as -inf: padding, not classes.
// A compile-time no-op when every column is a class.
template <int kClasses, int kVec>
__device__ __forceinline__ void MaskPadding(int i, float (&xs)[kVec]) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    if (i + j >= kClasses) xs[j] = -CUDART_INF_F;
  }
}

// loss[n] = cross_entropy(logits, labels)[n] and lse[n] its row's log-sum-exp, fp32. Either
// output may be null: a result no one reads (a multi-result node's unneeded result) is not
// written. Launch: RowLayout's geometry.
template <typename TLogit, typename TLabel, long long kRows, int kV, int kVec, int kThreadsPerRow,
          int kRowsPerBlock, int kClasses>
__device__ __forceinline__ void CrossEntropyForward(float* loss, float* lse, const TLogit* logits,
                                                    const TLabel* labels) {
  static_assert(kClasses >= 0 && kClasses <= kV, "classes are a prefix of the row");
  using Layout = RowLayout<kRows, kV, kVec, kThreadsPerRow, kRowsPerBlock>;
  const long long row = Layout::Row();
  if (row >= kRows) return;  // whole warps only: a warp is one row
  const TLogit* row_logits = logits + row * kV;

  // A thread's running (max, sum of exp(x - max)), rescaled once per chunk rather than merged
  // chunk by chunk through MaxExpSumOp (two more exps per chunk), and exp as exp2 of the
  // difference times log2(e): the accurate expf is ~10 instructions, which made this kernel
  // compute-bound on the H200 (91% SM throughput, 1.5 TB/s under ncu for GPT-2's [16384,
  // 50304] bf16 logits). exp2f's 2-ulp error per term is far below the loss's f32 tolerance.
  MaxExpSum stats{-CUDART_INF_F, 0.f};
#pragma unroll
  for (int k = 0; k < Layout::kChunks; ++k) {
    const int i = Layout::ChunkStart(k);
    if (i >= kV) continue;
    float xs[kVec];
    LoadFloats(row_logits + i, xs);
    MaskPadding<kClasses>(i, xs);
    float max = stats.max;
#pragma unroll
    for (int j = 0; j < kVec; ++j) max = fmaxf(max, xs[j]);
    if (max == -CUDART_INF_F) continue;  // only padding (-inf) so far: nothing to add
    float sum = max == stats.max ? stats.sum : stats.sum * exp2f((stats.max - max) * cross_entropy::kLog2e);
#pragma unroll
    for (int j = 0; j < kVec; ++j) sum += exp2f((xs[j] - max) * cross_entropy::kLog2e);  // -inf -> 0; NaN stays NaN
    stats = {max, sum};
  }
  stats = RowReduce<kThreadsPerRow>(stats, MaxExpSumOp(), MaxExpSum{-CUDART_INF_F, 0.f});

  if (Layout::Lane() != 0) return;
  const float log_sum = logf(stats.sum);
  if (lse != nullptr) lse[row] = stats.max + log_sum;
  if (loss != nullptr) {
    const long long label = static_cast<long long>(labels[row]);
    loss[row] = label < 0 || label >= kClasses ? CUDART_NAN_F : (stats.max - ToFloat(row_logits[label])) + log_sum;
  }
}

// dlogits = cross_entropy_grad(logits, labels, dloss, lse), rounded once to TGrad. Launch:
// RowLayout's geometry (a row's threads share its label, dloss and lse; the chunks are
// independent). The logits are read for the last time here, so they are loaded with the
// evict-first hint (__ldcs) and leave L2 to the dlogits that the GEMMs read next.
template <typename TLogit, typename TLabel, typename TGrad, long long kRows, int kV, int kVec, int kThreadsPerRow,
          int kRowsPerBlock, int kClasses>
__device__ __forceinline__ void CrossEntropyBackward(TGrad* dlogits, const TLogit* logits, const TLabel* labels,
                                                     const float* dloss, const float* lse) {
  static_assert(kClasses >= 0 && kClasses <= kV, "classes are a prefix of the row");
  using Layout = RowLayout<kRows, kV, kVec, kThreadsPerRow, kRowsPerBlock>;
  const long long row = Layout::Row();
  if (row >= kRows) return;

  const long long label = static_cast<long long>(labels[row]);
  const float scale = label < 0 || label >= kClasses ? CUDART_NAN_F : dloss[row];
  const float row_lse = lse[row];
  const TLogit* row_logits = logits + row * kV;
  TGrad* row_dlogits = dlogits + row * kV;
#pragma unroll 4
  for (int k = 0; k < Layout::kChunks; ++k) {
    const int i = Layout::ChunkStart(k);
    if (i >= kV) break;  // chunks ascend: none after this one exists either
    float xs[kVec];
    LoadFloats<LoadHint::kEvictFirst>(row_logits + i, xs);
    float grads[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float onehot = i + j == label ? 1.f : 0.f;
      // A padding column gets no gradient, whatever it holds.
      grads[j] = i + j >= kClasses ? 0.f : (exp2f((xs[j] - row_lse) * cross_entropy::kLog2e) - onehot) * scale;
    }
    StoreFloats(row_dlogits + i, grads);
  }
}

}  // namespace kiln::kernels
