// RMSNorm over the last dim (length D) of x, and its two gradients, as in
// ir/reference/norm_ops.cc, in fp32:
//   r  = 1 / sqrtf(sum(x^2) / D + eps)                 (1/sqrtf, not rsqrtf: two correctly
//                                                       rounded ops instead of a 2-ulp one)
//   y  = x * r * w
//   dx = r * (w * dy) - x * (r^3 * sum(w * dy * x) / D)
//   dw = sum over rows of dy * x * r
// The forward and input-gradient kernels keep their row slice in registers, so each input
// is read from memory once; r is never materialized, each kernel recomputes it from x.
// Their residual forms (fuse-residual-norm's ops) are the same kernels with optional
// pointers: add_rms_norm reads x = h + branch and writes that sum too
// (LoadRowWithResidual); add_rms_norm_grad_input adds the residual gradient dres to dx
// and may write a narrow copy of dx, so neither the sum nor dx is read back by an add or a
// convert kernel. With {weight_grad=1} the input-gradient kernel also sums dw's partials
// per block of rows (RmsNormGradInputAndWeight, then RmsNormWeightGradFold), so x and dy
// are read once for both gradients instead of once more by RmsNormGradWeight.
#pragma once

#include "kernels/common.cuh"

namespace kiln::kernels {

// ------------------------------------------------------------------------------- kernels

// y = rms_norm(x, w), or with `branch` (add_rms_norm) sum = x + branch and y = rms_norm(sum,
// w). Launch: RowLayout's geometry (grid = ceil(kRows / kRowsPerBlock), block =
// kThreadsPerRow * kRowsPerBlock).
// kWeightBeforeWait (codegen, where w is step-invariant: KernelSpec::waits_itself): w is read
// before the kernel waits for the kernels ahead (GridDependencyWait, here), x after it through
// ordered loads; the read of w then overlaps the kernel ahead.
template <typename TX, typename TW, typename TY, long long kRows, int kD, int kVec, int kThreadsPerRow,
          int kRowsPerBlock, typename TB = float, typename TS = float, bool kWeightBeforeWait = false>
__device__ __forceinline__ void RmsNormForward(TY* y, const TX* x, const TW* w, float eps, const TB* branch = nullptr,
                                               TS* sum = nullptr) {
  using Layout = RowLayout<kRows, kD, kVec, kThreadsPerRow, kRowsPerBlock>;
  const long long row = Layout::Row();
  if (row >= kRows) return;  // whole warps only: a warp is one row

  // w is loaded with x, before the row's sum, so that its read (from DRAM in a decode step,
  // where the weights stream through L2) overlaps x's and the reduction instead of following
  // them: 2.9 us a norm in llama-M's decode graph (bench/RESULTS.md, session 22). Codegen gives
  // a thread at most 32 elements (composite_wrapper.h); past that w stays where it is used.
  constexpr bool kWeightFirst = Layout::kChunks * kVec <= 32;
  static_assert(!kWeightBeforeWait || (kWeightFirst && kVec > 1), "w read before the wait is held in registers");
  float early_ws[kWeightFirst ? Layout::kChunks : 1][kVec];
  if constexpr (kWeightFirst) {
#pragma unroll
    for (int k = 0; k < Layout::kChunks; ++k) {
      if (Layout::ChunkStart(k) < kD) LoadFloats(w + Layout::ChunkStart(k), early_ws[k]);
    }
  }
  if constexpr (kWeightBeforeWait) GridDependencyWait();
  float xs[Layout::kChunks][kVec];
  LoadRowWithResidual<Layout, kWeightBeforeWait ? LoadHint::kAfterWait : LoadHint::kDefault>(
      x + row * kD, branch == nullptr ? nullptr : branch + row * kD, sum == nullptr ? nullptr : sum + row * kD, xs);
  float sum_squares = 0.f;
#pragma unroll
  for (int k = 0; k < Layout::kChunks; ++k) {
    if (Layout::ChunkStart(k) >= kD) continue;
#pragma unroll
    for (int j = 0; j < kVec; ++j) sum_squares += xs[k][j] * xs[k][j];
  }
  const float r = 1.f / sqrtf(RowReduce<kThreadsPerRow>(sum_squares, SumOp(), 0.f) / kD + eps);

#pragma unroll
  for (int k = 0; k < Layout::kChunks; ++k) {
    const int i = Layout::ChunkStart(k);
    if (i >= kD) continue;
    float ws[kVec], ys[kVec];
    if constexpr (kWeightFirst) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) ws[j] = early_ws[k][j];
    } else {
      LoadFloats(w + i, ws);
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) ys[j] = xs[k][j] * r * ws[j];
    if (y != nullptr) StoreFloats(y + row * kD + i, ys);  // null: add_rms_norm's y unread
  }
}

// One row of rms_norm_grad_input (both input-gradient kernels below run it): dx of `row`,
// or with `dres` (add_rms_norm_grad_input) dx = dres + that, the input gradient rounded to
// TDX first as its own kernel would store it; with `copy`, dx again rounded to TC. Keeps x
// and w * dy of its chunks in registers between the two row sums and the output. With
// kWeightGrad it keeps dy too and adds dy * x * r of the row to this thread's column sums
// `dw_sums` (its chunks' columns); dx is computed the same either way. All threads of a
// row call it (a block-wide row reduces through shared memory).
template <typename Layout, bool kWeightGrad, typename TX, typename TW, typename TDY, typename TDX, typename TR,
          typename TC>
__device__ __forceinline__ void RmsNormGradInputRow(long long row, TDX* dx, const TX* x, const TW* w, const TDY* dy,
                                                    float eps, const TR* dres, TC* copy,
                                                    float (&dw_sums)[Layout::kChunks][Layout::kChunkWidth]) {
  constexpr int kD = Layout::kRowLength, kVec = Layout::kChunkWidth;
  float xs[Layout::kChunks][kVec], wdys[Layout::kChunks][kVec];
  float dys[kWeightGrad ? Layout::kChunks : 1][kVec];  // dy itself, for dw
  float sum_squares = 0.f, dot = 0.f;  // sum(x^2), sum(w * dy * x) over this thread's chunks
#pragma unroll
  for (int k = 0; k < Layout::kChunks; ++k) {
    const int i = Layout::ChunkStart(k);
    if (i >= kD) continue;
    float ws[kVec];
    LoadFloats(x + row * kD + i, xs[k]);
    LoadFloats(dy + row * kD + i, wdys[k]);
    LoadFloats(w + i, ws);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      // Explicit roundings (no contraction left to the compiler): the kernels that share this
      // row code, with and without dw, differ in register pressure and would otherwise fuse
      // different multiply-adds, and dx must be the same bits from each.
      if constexpr (kWeightGrad) dys[k][j] = wdys[k][j];
      wdys[k][j] = __fmul_rn(wdys[k][j], ws[j]);
      sum_squares = __fmaf_rn(xs[k][j], xs[k][j], sum_squares);
      dot = __fmaf_rn(wdys[k][j], xs[k][j], dot);
    }
  }
  sum_squares = RowReduce<Layout::kRowThreads>(sum_squares, SumOp(), 0.f);
  dot = RowReduce<Layout::kRowThreads>(dot, SumOp(), 0.f);
  const float r = 1.f / sqrtf(sum_squares / kD + eps);
  const float x_scale = r * r * r * dot / kD;

#pragma unroll
  for (int k = 0; k < Layout::kChunks; ++k) {
    const int i = Layout::ChunkStart(k);
    if (i >= kD) continue;
    float dxs[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) dxs[j] = __fmaf_rn(r, wdys[k][j], -__fmul_rn(xs[k][j], x_scale));
    FinishInputGradientChunk<kVec>(dxs, row * kD + i, dx, dres, copy);
    if constexpr (kWeightGrad) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) dw_sums[k][j] = __fmaf_rn(__fmul_rn(dys[k][j], xs[k][j]), r, dw_sums[k][j]);
    }
  }
}

// dx = rms_norm_grad_input(x, w, dy), or add_rms_norm_grad_input's dx and copy (the row
// above). Same geometry as the forward: a row per warp or per block.
template <typename TX, typename TW, typename TDY, typename TDX, long long kRows, int kD, int kVec,
          int kThreadsPerRow, int kRowsPerBlock, typename TR = float, typename TC = float>
__device__ __forceinline__ void RmsNormGradInput(TDX* dx, const TX* x, const TW* w, const TDY* dy, float eps,
                                                 const TR* dres = nullptr, TC* copy = nullptr) {
  using Layout = RowLayout<kRows, kD, kVec, kThreadsPerRow, kRowsPerBlock>;
  const long long row = Layout::Row();
  if (row >= kRows) return;
  float unused[Layout::kChunks][kVec];
  RmsNormGradInputRow<Layout, false>(row, dx, x, w, dy, eps, dres, copy, unused);
}

// The input gradient and the weight gradient of one norm, {weight_grad=1}: stage 1 of 2.
// dx (and dres, copy) exactly as RmsNormGradInput, with the same row geometry (so dx is the
// same bits), but each block runs kRowGroups consecutive groups of kRowsPerBlock rows (block
// b: rows [b kRowGroups kRowsPerBlock, (b + 1) kRowGroups kRowsPerBlock)), each thread adding
// dy * x * r of its rows, in row order, to registers for its columns. x and dy are read once
// for both gradients. The block's column sums then go to partials[b][:] (the node's
// scratch, gridDim.x x kD floats): a row per block writes its threads' sums directly; a
// warp per row folds its warps' sums in warp order through shared memory first, the last
// warp writing the result. RmsNormWeightGradFold (stage 2) sums the partials in block
// order. Deterministic: every sum runs in an order fixed at compile time; no atomics.
template <typename TX, typename TW, typename TDY, typename TDX, long long kRows, int kD, int kVec,
          int kThreadsPerRow, int kRowsPerBlock, int kRowGroups, typename TR, typename TC>
__device__ __forceinline__ void RmsNormGradInputAndWeight(TDX* dx, const TX* x, const TW* w, const TDY* dy, float eps,
                                                          const TR* dres, TC* copy, float* partials) {
  using Layout = RowLayout<kRows, kD, kVec, kThreadsPerRow, kRowsPerBlock>;
  float sums[Layout::kChunks][kVec];
#pragma unroll
  for (int k = 0; k < Layout::kChunks; ++k) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) sums[k][j] = 0.f;
  }
  const long long first_row = static_cast<long long>(blockIdx.x) * kRowGroups * kRowsPerBlock +
                              threadIdx.x / kThreadsPerRow;
  for (int group = 0; group < kRowGroups; ++group) {
    const long long row = first_row + static_cast<long long>(group) * kRowsPerBlock;
    if (row < kRows) RmsNormGradInputRow<Layout, true>(row, dx, x, w, dy, eps, dres, copy, sums);
  }

  float* block_partials = partials + blockIdx.x * static_cast<long long>(kD);
  if constexpr (kRowsPerBlock == 1) {
#pragma unroll
    for (int k = 0; k < Layout::kChunks; ++k) {
      const int i = Layout::ChunkStart(k);
      if (i < kD) StoreFloats(block_partials + i, sums[k]);
    }
  } else {
    __shared__ float block_sums[kD];
    const int warp = threadIdx.x / kThreadsPerRow;
    for (int w_turn = 0; w_turn < kRowsPerBlock; ++w_turn) {
      if (warp == w_turn) {
#pragma unroll
        for (int k = 0; k < Layout::kChunks; ++k) {
          const int i = Layout::ChunkStart(k);
          if (i >= kD) continue;
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            if (w_turn > 0) sums[k][j] = block_sums[i + j] + sums[k][j];
            if (w_turn < kRowsPerBlock - 1) block_sums[i + j] = sums[k][j];
          }
          if (w_turn == kRowsPerBlock - 1) StoreFloats(block_partials + i, sums[k]);
        }
      }
      __syncthreads();
    }
  }
}

// Stage 2 of 2: dw[c] = the sum of partials[0..kBlocks)[c] (stage 1's), in
// FoldColumnPartials's fixed order (kernels/common.cuh). Launch: ceil(kD / 32) blocks of
// kThreads.
template <typename TDW, int kD, int kBlocks, int kThreads>
__device__ __forceinline__ void RmsNormWeightGradFold(TDW* dw, const float* partials) {
  FoldColumnPartials<kD, kBlocks, kThreads>(partials, [&](int col, float total) {
    if (dw != nullptr) dw[col] = FromFloat<TDW>(total);
  });
}

// dw = rms_norm_grad_weight(x, w, dy), deterministic and without float atomics.
//
// Launch: kBlocks = ceil(kRows / kRowsPerBlock) blocks of kThreads threads. Block b owns
// rows [b * kRowsPerBlock, (b + 1) * kRowsPerBlock) and walks them in groups of one row per
// warp:
//   1. warp w computes r of row (group + w) with a warp reduction; r goes to shared memory;
//   2. every thread adds dy * x * r of the group's rows, in row order, into registers for
//      its own column chunks (thread t owns chunks t, t + kThreads, ...).
// The block then writes its column sums to partials[b][:]; the last block to finish (an
// atomic counter) sums partials[0..kBlocks)[:] in block order and writes dw. Every sum
// thus runs in an order fixed at compile time, and the counter is reset for the next launch.
// `partials` (kBlocks * kD floats) and `blocks_done` (zero at module load) are __device__
// variables of the generated module, which every node of the same shapes shares (equal
// kernel bodies compile once, codegen/compile_function.h): launches of the module must be
// stream-ordered, never concurrent.
// x is read twice (the second read of a group's rows is an L1/L2 hit), dy once.
template <typename TX, typename TDY, typename TDW, long long kRows, int kD, int kVec, int kThreads,
          int kRowsPerBlock>
__device__ __forceinline__ void RmsNormGradWeight(TDW* dw, const TX* x, const TDY* dy, float eps, float* partials,
                                                  unsigned int* blocks_done) {
  constexpr int kWarps = kThreads / kWarpSize;
  static_assert(kThreads % kWarpSize == 0 && kRowsPerBlock % kWarps == 0, "rows come in groups of one per warp");
  using WarpRow = RowLayout<kRows, kD, kVec, kWarpSize, kWarps>;  // a row read by one warp (step 1)
  using Columns = RowLayout<kRows, kD, kVec, kThreads, 1>;        // a row read by the block (step 2)
  __shared__ float inv_rms[kWarps];
  const int warp = threadIdx.x / kWarpSize;
  const long long first_row = static_cast<long long>(blockIdx.x) * kRowsPerBlock;

  float sums[Columns::kChunks][kVec];
#pragma unroll
  for (int k = 0; k < Columns::kChunks; ++k) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) sums[k][j] = 0.f;
  }

  for (int group = 0; group < kRowsPerBlock; group += kWarps) {
    const long long row = first_row + group + warp;
    if (row < kRows) {
      float sum_squares = 0.f;
#pragma unroll
      for (int k = 0; k < WarpRow::kChunks; ++k) {
        const int i = WarpRow::ChunkStart(k);
        if (i >= kD) continue;
        float xs[kVec];
        LoadFloats(x + row * kD + i, xs);
#pragma unroll
        for (int j = 0; j < kVec; ++j) sum_squares += xs[j] * xs[j];
      }
      sum_squares = WarpReduce(sum_squares, SumOp());
      if (WarpRow::Lane() == 0) inv_rms[warp] = 1.f / sqrtf(sum_squares / kD + eps);
    }
    __syncthreads();
    for (int w = 0; w < kWarps && first_row + group + w < kRows; ++w) {
      const long long r_row = first_row + group + w;
      const float r = inv_rms[w];
#pragma unroll
      for (int k = 0; k < Columns::kChunks; ++k) {
        const int i = Columns::ChunkStart(k);
        if (i >= kD) continue;
        float xs[kVec], dys[kVec];
        LoadFloats(x + r_row * kD + i, xs);
        LoadFloats(dy + r_row * kD + i, dys);
#pragma unroll
        for (int j = 0; j < kVec; ++j) sums[k][j] += dys[j] * xs[j] * r;
      }
    }
    __syncthreads();  // inv_rms is rewritten by the next group
  }

#pragma unroll
  for (int k = 0; k < Columns::kChunks; ++k) {
    const int i = Columns::ChunkStart(k);
    if (i < kD) StoreFloats(partials + blockIdx.x * static_cast<long long>(kD) + i, sums[k]);
  }

  // Publish the partials before counting this block as done (the classic last-block
  // reduction: fence, then count; the last block fences again before reading).
  __shared__ bool is_last_block;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last_block = atomicAdd(blocks_done, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!is_last_block) return;
  __threadfence();

#pragma unroll
  for (int k = 0; k < Columns::kChunks; ++k) {
    const int i = Columns::ChunkStart(k);
    if (i >= kD) continue;
    float total[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) total[j] = 0.f;
#pragma unroll 4
    for (unsigned int b = 0; b < gridDim.x; ++b) {
      float partial[kVec];
      LoadFloatsFromL2(partials + b * static_cast<long long>(kD) + i, partial);  // written by other SMs
#pragma unroll
      for (int j = 0; j < kVec; ++j) total[j] += partial[j];
    }
    StoreFloats(dw + i, total);
  }
  if (threadIdx.x == 0) *blocks_done = 0;
}

}  // namespace kiln::kernels
