// LayerNorm over the last dim (length D) of x, as in ir/reference/norm_ops.cc, in fp32:
//   mean = sum(x) / D
//   r    = 1 / sqrtf(sum((x - mean)^2) / D + eps)   (two passes over the registers: the
//                                                    variance of the centered row, never
//                                                    E[x^2] - mean^2, which cancels)
//   y    = (x - mean) * r * w + b
// The row slice stays in registers, so x is read from memory once. Its residual form
// (add_layer_norm) reads x + branch and writes that sum too (LoadRowWithResidual).
//
// The input gradient, layer_norm_grad_input (llm.c's layernorm_backward), per row, in fp32:
//   mean = sum(x) / D;  c = x - mean;  r = 1 / sqrtf(sum(c^2) / D + eps)
//   g    = w * dy;      dx = r * (g - sum(g) / D) - c * (r^3 * sum(g * c) / D)
// which is r (g - mean(g) - xhat mean(g xhat)) with xhat = c r, computed as rms_norm's
// gradient of c with g centered. One kernel reads x, w and dy once and writes dx: it never
// materializes the centered x, rms_norm_grad_input's dx of it, nor their row means (the
// decomposition LayerNormVjp builds, which fuse-residual-norm replaces by this op). Its
// residual form adds dres and may write a narrow copy of dx, as add_rms_norm_grad_input's;
// with {weight_grad=1} the same row kernel sums dw = dy * c * r and db = dy of its rows per
// block (LayerNormGradInputAndWeight), and LayerNormWeightGradFold adds the blocks in order,
// as RmsNormGradInputAndWeight and RmsNormWeightGradFold do for rms_norm's dw.
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

// One row of layer_norm_grad_input (both input-gradient kernels below run it): dx of `row`,
// or with `dres` (add_layer_norm_grad_input) dx = dres + that, the input gradient rounded to
// TDX first as its own kernel would store it; with `copy`, dx again rounded to TC. Keeps c =
// x - mean and g = w * dy of its chunks in registers between the row sums and the output.
// With kWeightGrad it keeps dy too and adds dy * c * r and dy of the row to this thread's
// column sums `dw_sums` and `db_sums` (its chunks' columns); dx is computed the same either
// way. All threads of a row call it (a block-wide row reduces through shared memory).
template <typename Layout, bool kWeightGrad, typename TX, typename TW, typename TDY, typename TDX, typename TR,
          typename TC>
__device__ __forceinline__ void LayerNormGradInputRow(long long row, TDX* dx, const TX* x, const TW* w, const TDY* dy,
                                                      float eps, const TR* dres, TC* copy,
                                                      float (&dw_sums)[Layout::kChunks][Layout::kChunkWidth],
                                                      float (&db_sums)[Layout::kChunks][Layout::kChunkWidth]) {
  constexpr int kD = Layout::kRowLength, kVec = Layout::kChunkWidth;
  float cs[Layout::kChunks][kVec], gs[Layout::kChunks][kVec];
  float dys[kWeightGrad ? Layout::kChunks : 1][kVec];  // dy itself, for dw and db
  float sum = 0.f, g_sum = 0.f;  // sum(x), sum(w * dy) over this thread's chunks
#pragma unroll
  for (int k = 0; k < Layout::kChunks; ++k) {
    const int i = Layout::ChunkStart(k);
    if (i >= kD) continue;
    float ws[kVec];
    LoadFloats(x + row * kD + i, cs[k]);
    LoadFloats(dy + row * kD + i, gs[k]);
    LoadFloats(w + i, ws);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      // Explicit roundings (no contraction left to the compiler), as in rms_norm's row: the
      // kernels with and without dw must compute dx to the same bits.
      if constexpr (kWeightGrad) dys[k][j] = gs[k][j];
      gs[k][j] = __fmul_rn(gs[k][j], ws[j]);
      sum = __fadd_rn(sum, cs[k][j]);
      g_sum = __fadd_rn(g_sum, gs[k][j]);
    }
  }
  const float mean = RowReduce<Layout::kRowThreads>(sum, SumOp(), 0.f) / kD;
  const float g_mean = RowReduce<Layout::kRowThreads>(g_sum, SumOp(), 0.f) / kD;

  float sum_squares = 0.f, dot = 0.f;  // sum(c^2), sum(g * c): the centered row, two passes
#pragma unroll
  for (int k = 0; k < Layout::kChunks; ++k) {
    if (Layout::ChunkStart(k) >= kD) continue;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      cs[k][j] = __fsub_rn(cs[k][j], mean);
      sum_squares = __fmaf_rn(cs[k][j], cs[k][j], sum_squares);
      dot = __fmaf_rn(gs[k][j], cs[k][j], dot);
    }
  }
  sum_squares = RowReduce<Layout::kRowThreads>(sum_squares, SumOp(), 0.f);
  dot = RowReduce<Layout::kRowThreads>(dot, SumOp(), 0.f);
  const float r = 1.f / sqrtf(sum_squares / kD + eps);
  const float c_scale = r * r * r * dot / kD;

#pragma unroll
  for (int k = 0; k < Layout::kChunks; ++k) {
    const int i = Layout::ChunkStart(k);
    if (i >= kD) continue;
    float dxs[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      dxs[j] = __fmaf_rn(r, __fsub_rn(gs[k][j], g_mean), -__fmul_rn(cs[k][j], c_scale));
    }
    FinishInputGradientChunk<kVec>(dxs, row * kD + i, dx, dres, copy);
    if constexpr (kWeightGrad) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        dw_sums[k][j] = __fmaf_rn(__fmul_rn(dys[k][j], cs[k][j]), r, dw_sums[k][j]);
        db_sums[k][j] = __fadd_rn(db_sums[k][j], dys[k][j]);
      }
    }
  }
}

// dx = layer_norm_grad_input(x, w, dy), or add_layer_norm_grad_input's dx and copy (the row
// above). Same geometry as the forward: a row per warp or per block.
template <typename TX, typename TW, typename TDY, typename TDX, long long kRows, int kD, int kVec,
          int kThreadsPerRow, int kRowsPerBlock, typename TR = float, typename TC = float>
__device__ __forceinline__ void LayerNormGradInput(TDX* dx, const TX* x, const TW* w, const TDY* dy, float eps,
                                                   const TR* dres = nullptr, TC* copy = nullptr) {
  using Layout = RowLayout<kRows, kD, kVec, kThreadsPerRow, kRowsPerBlock>;
  const long long row = Layout::Row();
  if (row >= kRows) return;
  float unused_dw[Layout::kChunks][kVec], unused_db[Layout::kChunks][kVec];
  LayerNormGradInputRow<Layout, false>(row, dx, x, w, dy, eps, dres, copy, unused_dw, unused_db);
}

// The input gradient, the weight gradient and the bias gradient of one layer_norm,
// {weight_grad=1}: stage 1 of 2. dx (and dres, copy) exactly as LayerNormGradInput, with the
// same row geometry (so dx is the same bits), but each block runs kRowGroups consecutive
// groups of kRowsPerBlock rows (block b: rows [b kRowGroups kRowsPerBlock, (b + 1) kRowGroups
// kRowsPerBlock)), each thread adding dy * c * r and dy of its rows, in row order, to
// registers for its columns. x and dy are read once for the three gradients. The block's
// column sums then go to partials[b][:] (the node's scratch, gridDim.x x 2 kD floats: dw's
// kD columns, then db's): a row per block writes its threads' sums directly; a warp per row
// folds its warps' sums in warp order through shared memory first, the last warp writing
// the result. LayerNormWeightGradFold (stage 2) sums the partials in block order.
// Deterministic: every sum runs in an order fixed at compile time; no atomics.
template <typename TX, typename TW, typename TDY, typename TDX, long long kRows, int kD, int kVec,
          int kThreadsPerRow, int kRowsPerBlock, int kRowGroups, typename TR, typename TC>
__device__ __forceinline__ void LayerNormGradInputAndWeight(TDX* dx, const TX* x, const TW* w, const TDY* dy,
                                                            float eps, const TR* dres, TC* copy, float* partials) {
  using Layout = RowLayout<kRows, kD, kVec, kThreadsPerRow, kRowsPerBlock>;
  float dw_sums[Layout::kChunks][kVec], db_sums[Layout::kChunks][kVec];
#pragma unroll
  for (int k = 0; k < Layout::kChunks; ++k) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) dw_sums[k][j] = db_sums[k][j] = 0.f;
  }
  const long long first_row = static_cast<long long>(blockIdx.x) * kRowGroups * kRowsPerBlock +
                              threadIdx.x / kThreadsPerRow;
  for (int group = 0; group < kRowGroups; ++group) {
    const long long row = first_row + static_cast<long long>(group) * kRowsPerBlock;
    if (row < kRows) LayerNormGradInputRow<Layout, true>(row, dx, x, w, dy, eps, dres, copy, dw_sums, db_sums);
  }

  float* block_partials = partials + blockIdx.x * static_cast<long long>(2 * kD);
  if constexpr (kRowsPerBlock == 1) {
#pragma unroll
    for (int k = 0; k < Layout::kChunks; ++k) {
      const int i = Layout::ChunkStart(k);
      if (i >= kD) continue;
      StoreFloats(block_partials + i, dw_sums[k]);
      StoreFloats(block_partials + kD + i, db_sums[k]);
    }
  } else {
    __shared__ float block_sums[2 * kD];
    const int warp = threadIdx.x / kThreadsPerRow;
    for (int w_turn = 0; w_turn < kRowsPerBlock; ++w_turn) {
      if (warp == w_turn) {
#pragma unroll
        for (int k = 0; k < Layout::kChunks; ++k) {
          const int i = Layout::ChunkStart(k);
          if (i >= kD) continue;
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            if (w_turn > 0) {
              dw_sums[k][j] = block_sums[i + j] + dw_sums[k][j];
              db_sums[k][j] = block_sums[kD + i + j] + db_sums[k][j];
            }
            if (w_turn < kRowsPerBlock - 1) {
              block_sums[i + j] = dw_sums[k][j];
              block_sums[kD + i + j] = db_sums[k][j];
            }
          }
          if (w_turn == kRowsPerBlock - 1) {
            StoreFloats(block_partials + i, dw_sums[k]);
            StoreFloats(block_partials + kD + i, db_sums[k]);
          }
        }
      }
      __syncthreads();
    }
  }
}

// Stage 2 of 2: column c of the 2 kD partial columns (dw's, then db's) is the sum of
// partials[0..kBlocks)[c] (stage 1's), in FoldColumnPartials's fixed order (kernels/common.cuh,
// rms_norm's too); columns below kD go to dw, the rest to db. Launch: ceil(2 kD / 32) blocks of
// kThreads.
template <typename TDW, int kD, int kBlocks, int kThreads>
__device__ __forceinline__ void LayerNormWeightGradFold(TDW* dw, TDW* db, const float* partials) {
  FoldColumnPartials<2 * kD, kBlocks, kThreads>(partials, [&](int col, float total) {
    TDW* out = col < kD ? dw : db;
    if (out != nullptr) out[col < kD ? col : col - kD] = FromFloat<TDW>(total);
  });
}

}  // namespace kiln::kernels
