// A gemm of few rows, the decode step's: D[m, n] = alpha sum_k A[m, k] B[n, k] (+ beta C[m, n])
// for M <= 8, A [M, K] and B [N, K] both K-inner (a_layout=mk, b_layout=nk: the activations,
// one row per sequence, against a linear layer's weight; C the residual stream a projection
// adds into), as ir/op_table.h's gemm defines it without an epilogue (codegen/lower_gemv.cc
// says when a gemm takes this kernel instead of cuBLASLt).
//
// Why: at M <= 8 a GEMM reads its weight once and does next to no arithmetic, so its time is
// the weight's bytes over the bandwidth it reaches; cuBLASLt's kernels reach about 1.8 TB/s
// of the H200's 4.8 there (bench/RESULTS.md, session 15: 13 us for llama-M's 23 MB MLP
// weights). This kernel streams B once with 16-byte loads that bypass L1 (evict-first: a
// weight is not read again this step), many in flight per warp, and keeps A, which every warp
// reads, in L1.
//
// Geometry: a block is kGroups groups of kSplit warps; a group computes kRows consecutive rows
// of B (columns of D) for all M rows of A, its warps splitting K: warp p of the group takes the
// 16-byte chunks p * 32 + lane, (kSplit + p) * 32 + lane, ... of each row, kUnroll of them
// loaded before any is used (a long row is split so that one round of loads covers it). Each
// warp's partial sums meet in a butterfly reduction, the group's warps' in shared memory, in
// warp order (a fixed order: the same bits every run). Each A chunk loaded serves kRows rows of
// B. Accumulation is f32 with fmaf, one rounding to D's dtype at the store, alpha applied to
// the f32 sum and then beta C, each rounded to f32 as the reference does. K must be a
// multiple of the 16-byte vector (the lowering checks). C may not be D's buffer (the plan
// gives it none).
#pragma once

#include "kernels/common.cuh"

namespace kiln::kernels {

// silu(g) * u of a gemm's gate and up sums, rounded where the ops it replaces round (ir/fusion.h,
// kGemvGlu): the gemm's D (TG), then sigmoid(g), g * sigmoid(g) and that times u, each to TG;
// sigmoid as codegen's elementwise kernels compute it (codegen/elementwise_lowering.cc).
template <typename TG>
struct SwiGlu {
  static __device__ __forceinline__ TG Apply(float gate_sum, float up_sum) {
    const float g = ToFloat(FromFloat<TG>(gate_sum)), u = ToFloat(FromFloat<TG>(up_sum));
    float s;
    if constexpr (sizeof(TG) < sizeof(float)) {
      s = __fdividef(1.0f, 1.0f + __expf(-g));
    } else {
      s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g)));
    }
    s = ToFloat(FromFloat<TG>(s));
    const float t = ToFloat(FromFloat<TG>(__fmul_rn(g, s)));
    return FromFloat<TG>(__fmul_rn(t, u));
  }
};

// The plain form's Glu: none.
struct NoGlu {};
template <typename G>
struct IsGlu {
  static constexpr bool kValue = true;
};
template <>
struct IsGlu<NoGlu> {
  static constexpr bool kValue = false;
};

// kWeightsBeforeWait (codegen, where B is step-invariant: a decode step's weight): the first
// round of B's loads is issued before the kernel waits for the kernels ahead
// (GridDependencyWait, here), and A and C are read after it through ordered loads
// (common.cuh: a `const __restrict__` read may become ld.global.nc, which the compiler may
// schedule ahead of the wait). Its blocks become resident while the kernel ahead runs (paged
// attention, a norm), so their first bytes of B stream then instead of after it.
// Glu (not NoGlu: SwiGlu<TD>): the GLU form (passes/fuse_gemv_glu.h). B holds 2 kN rows, the
// gate rows then the up rows; a group computes output column j from rows j and kN + j
// (kRows 2) and stores Glu::Apply of the two sums: D [M, kN].
template <typename T, typename TD, int kM, long long kN, long long kK, int kRows, int kSplit, int kUnroll, int kGroups,
          bool kHasC = false, bool kWeightsBeforeWait = false, typename Glu = NoGlu>
struct SmallMGemm {
  static constexpr int kVec = Packed128<T>::kSize;
  static constexpr bool kGlu = IsGlu<Glu>::kValue;
  static_assert(kK % kVec == 0, "K must be whole 16-byte chunks");
  static_assert(kM >= 1 && kRows >= 1 && kUnroll >= 1 && kSplit >= 1 && kGroups >= 1,
                "at least one row, one B row, one chunk in flight and one warp");
  static_assert(!kGlu || (kRows == 2 && !kHasC), "a GLU group sums a gate row and an up row, and adds no C");
  static constexpr long long kChunks = kK / kVec;
  // Columns of D a block computes (a GLU group computes one from its two rows).
  static constexpr long long kRowsPerBlock = static_cast<long long>(kGlu ? 1 : kRows) * kGroups;
  static constexpr long long kBlocks = CeilDiv(kN, kRowsPerBlock);
  static constexpr long long kRound = static_cast<long long>(kUnroll) * kSplit * kWarpSize;  // chunks a round

  // c: null unless kHasC.
  static __device__ __forceinline__ void Run(TD* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b,
                                             const TD* __restrict__ c, float alpha, float beta) {
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int group = warp / kSplit, part = warp % kSplit;
    const long long first =
        static_cast<long long>(blockIdx.x) * kRowsPerBlock + static_cast<long long>(group) * (kGlu ? 1 : kRows);
    float acc[kM][kRows];
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[m][r] = 0.0f;
    }
    // A B row past N (the last block's, when its rows do not divide N) reads row N - 1 again
    // and is not stored: every warp stays in the loop, the shuffles and the barrier.
    const T* rows[kRows];
    if constexpr (kGlu) {
      const long long column = first < kN ? first : kN - 1;
      rows[0] = b + column * kK;         // gate
      rows[1] = b + (kN + column) * kK;  // up
    } else {
#pragma unroll
      for (int r = 0; r < kRows; ++r) rows[r] = b + (first + r < kN ? first + r : kN - 1) * kK;
    }
    Packed128<T> bv[kUnroll][kRows];
    auto load_round = [&](long long base) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const long long chunk = base + (u * kSplit + part) * kWarpSize + lane;
        if (chunk < kChunks) {
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            *reinterpret_cast<int4*>(&bv[u][r]) = __ldcs(reinterpret_cast<const int4*>(rows[r] + chunk * kVec));
          }
        }
      }
    };
    load_round(0);
    if constexpr (kWeightsBeforeWait) GridDependencyWait();
    for (long long base = 0;;) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const long long chunk = base + (u * kSplit + part) * kWarpSize + lane;
        if (chunk >= kChunks) continue;
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          const Packed128<T> av =
              kWeightsBeforeWait ? Load128AfterWait<true>(a + m * kK + chunk * kVec) : Load128(a + m * kK + chunk * kVec);
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            const float x = ToFloat(av[j]);
#pragma unroll
            for (int r = 0; r < kRows; ++r) acc[m][r] = fmaf(x, ToFloat(bv[u][r][j]), acc[m][r]);
          }
        }
      }
      base += kRound;
      if (base >= kChunks) break;
      load_round(base);
    }
#if __CUDA_ARCH__ >= 900
    // The next kernel may launch now that the weight has streamed, not before: under
    // programmatic launch its blocks would become resident early and wait, and their shared
    // memory (paged attention's stages: 45 KB a block) takes L1's share of the SM, where A's
    // reads hit (codegen opens this kernel with griddepcontrol.wait alone:
    // KernelSpec::launches_dependents_itself). bench/RESULTS.md, session 21: batch 1 0.888 ms
    // a step with the trigger first, 0.845 with it here.
    asm volatile("griddepcontrol.launch_dependents;");
#endif
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[m][r] = WarpReduce(acc[m][r], SumOp{});
    }
    // A GLU group's column from its two sums.
    auto store_glu = [&](int m, float gate, float up) {
      if (first >= kN) return;
      if constexpr (kGlu) out[m * kN + first] = Glu::Apply(__fmul_rn(alpha, gate), __fmul_rn(alpha, up));
    };
    auto store = [&](int m, int r, float sum) {
      if (first + r >= kN) return;
      const long long at = m * kN + first + r;
      float t = __fmul_rn(alpha, sum);
      if constexpr (kHasC) {
        t = __fadd_rn(t, __fmul_rn(beta, kWeightsBeforeWait ? ToFloatAfterWait(c + at) : ToFloat(c[at])));
      }
      out[at] = FromFloat<TD>(t);
    };
    if constexpr (kSplit == 1) {
      if (lane == 0) {
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          if constexpr (kGlu) {
            store_glu(m, acc[m][0], acc[m][1]);
          } else {
#pragma unroll
            for (int r = 0; r < kRows; ++r) store(m, r, acc[m][r]);
          }
        }
      }
    } else {
      // The group's warps' sums, added in warp order by the group's first warp.
      __shared__ float sums[kGroups][kSplit][kM * kRows];
      if (lane == 0) {
#pragma unroll
        for (int m = 0; m < kM; ++m) {
#pragma unroll
          for (int r = 0; r < kRows; ++r) sums[group][part][m * kRows + r] = acc[m][r];
        }
      }
      __syncthreads();
      if (part == 0) {
        if constexpr (kGlu) {
          for (int m = lane; m < kM; m += kWarpSize) {
            float gate = sums[group][0][m * kRows], up = sums[group][0][m * kRows + 1];
#pragma unroll
            for (int p = 1; p < kSplit; ++p) gate += sums[group][p][m * kRows], up += sums[group][p][m * kRows + 1];
            store_glu(m, gate, up);
          }
        } else {
          for (int i = lane; i < kM * kRows; i += kWarpSize) {
            float sum = sums[group][0][i];
#pragma unroll
            for (int p = 1; p < kSplit; ++p) sum += sums[group][p][i];
            store(i / kRows, i % kRows, sum);
          }
        }
      }
    }
  }
};

}  // namespace kiln::kernels
