// A gemm of few rows, the decode step's: D[m, n] = alpha sum_k A[m, k] B[n, k] (+ beta C[m, n])
// for M <= 8, A [M, K] and B [N, K] both K-inner (a_layout=mk, b_layout=nk: the activations,
// one row per sequence, against a linear layer's weight; C the residual stream a projection
// adds into), as ir/op_table.h's gemm defines it without an epilogue (codegen/lower_gemv.cc
// says when a gemm takes this kernel instead of cuBLASLt). SmallMGemmMma, below, takes 9 to 64
// rows on tensor cores.
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

template <typename T, typename TD, int kM, long long kN, long long kK, int kRows, int kSplit, int kUnroll, int kGroups,
          bool kHasC = false>
struct SmallMGemm {
  static constexpr int kVec = Packed128<T>::kSize;
  static_assert(kK % kVec == 0, "K must be whole 16-byte chunks");
  static_assert(kM >= 1 && kRows >= 1 && kUnroll >= 1 && kSplit >= 1 && kGroups >= 1,
                "at least one row, one B row, one chunk in flight and one warp");
  static constexpr long long kChunks = kK / kVec;
  static constexpr long long kRowsPerBlock = static_cast<long long>(kRows) * kGroups;
  static constexpr long long kBlocks = CeilDiv(kN, kRowsPerBlock);
  static constexpr long long kRound = static_cast<long long>(kUnroll) * kSplit * kWarpSize;  // chunks a round

  // c: null unless kHasC.
  static __device__ __forceinline__ void Run(TD* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b,
                                             const TD* __restrict__ c, float alpha, float beta) {
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int group = warp / kSplit, part = warp % kSplit;
    const long long first = static_cast<long long>(blockIdx.x) * kRowsPerBlock + static_cast<long long>(group) * kRows;
    float acc[kM][kRows];
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[m][r] = 0.0f;
    }
    // A B row past N (the last block's, when its rows do not divide N) reads row N - 1 again
    // and is not stored: every warp stays in the loop, the shuffles and the barrier.
    const T* rows[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) rows[r] = b + (first + r < kN ? first + r : kN - 1) * kK;
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
    for (long long base = 0;;) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const long long chunk = base + (u * kSplit + part) * kWarpSize + lane;
        if (chunk >= kChunks) continue;
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          const Packed128<T> av = Load128(a + m * kK + chunk * kVec);
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
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[m][r] = WarpReduce(acc[m][r], SumOp{});
    }
    auto store = [&](int m, int r, float sum) {
      if (first + r >= kN) return;
      const long long at = m * kN + first + r;
      float t = __fmul_rn(alpha, sum);
      if constexpr (kHasC) t = __fadd_rn(t, __fmul_rn(beta, ToFloat(c[at])));
      out[at] = FromFloat<TD>(t);
    };
    if constexpr (kSplit == 1) {
      if (lane == 0) {
#pragma unroll
        for (int m = 0; m < kM; ++m) {
#pragma unroll
          for (int r = 0; r < kRows; ++r) store(m, r, acc[m][r]);
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
        for (int i = lane; i < kM * kRows; i += kWarpSize) {
          float sum = sums[group][0][i];
#pragma unroll
          for (int p = 1; p < kSplit; ++p) sum += sums[group][p][i];
          store(i / kRows, i % kRows, sum);
        }
      }
    }
  }
};

// ---------------------------------------------------------------------------------------
// SmallMGemmMma: the same gemm for 9 <= M <= 64, bf16 or f16 operands, on tensor cores.
//
// Why: at M = 32 a gemm still reads each weight element once (it is bandwidth-bound), but it
// makes 32 FMAs of each, more than SmallMGemm's CUDA-core FMAs keep up with; cuBLASLt's
// kernels reach about 1.9 TB/s there (llama-M decode at batch 32: 46% of the step). This
// kernel computes D^T = B A^T with mma.sync m16n8k16 (f32 accumulators): the weight's rows
// are the mma's A operand (16 rows of N a tile, K contiguous: the "row" layout), A's rows its
// B operand (8 rows of M an n-tile, K contiguous: the "col" layout), both loaded straight
// from global memory into fragments, no shared-memory staging.
//
// Fragments: a sum over K does not depend on the order of K when both operands use the same
// order, so a lane loads whole 16-byte pieces and the mma steps take their halves. With
// g = lane / 4 and t = lane % 4, chunk c (K elements 32c .. 32c + 31) has the lane load
// W[row g][32c + 8t .. + 7] and W[row g + 8][same] (its tile's rows) and, for each n-tile j,
// A[8j + g][32c + 8t .. + 7]: 4 registers of 2 elements each, register q holding elements
// 8t + 2q, 8t + 2q + 1. Step s of the chunk's two then passes W registers 2s (a0a1 of row g,
// a2a3 of row g + 8) and 2s + 1 (a4a5, a6a7), and A registers 2s (b0b1) and 2s + 1 (b2b3):
// in the PTX ISA's m16n8k16 layouts a0a1 and b0b1 are both the tile's k 2t, 2t + 1, a4a5
// and b2b3 both k 2t + 8, 2t + 9, so every logical k of the step pairs the same physical
// element 32c + 8t + 4s + {0, 1, 2, 3} of W and A, and the 8 (t, s) pairs cover the chunk's
// 32 elements once. The accumulator's c0c1 are (W row g, A rows 2t, 2t + 1), c2c3 W row
// g + 8: D[m][n] transposed, stored with 2-byte stores (D is M/K of the weight's bytes).
//
// Memory: a load instruction reads 64 contiguous bytes (two whole 32-byte sectors) of each
// of the warp's 16 rows, and a lane's kUnroll chunks of a round are consecutive in K, so the
// warp's back-to-back loads of a round read kUnroll * 64 contiguous bytes of every row (the
// whole 128-byte line from kUnroll 2 on). That is the line a 32-byte-a-lane layout (a
// 64-element chunk, 4 mma steps) would read, without its cost: sm_90 has no 32-byte load, so
// that layout is two 16-byte loads whose lanes stride 32 bytes, each touching 4 sectors of a
// row half and asking for every sector twice. The weight stream is evict-first (__ldcs, read
// once); A, which every warp reads, loads as usual and stays in L1/L2; a warp's rows of A past
// M read row M - 1 (their columns of D are not stored).
//
// Geometry: a block is kGroups groups of kSplit warps; a group computes kRowTiles tiles of
// 16 consecutive weight rows for all M rows of A (ceil(M / 8) n-tiles), its warps splitting
// K: warp p takes rounds of kUnroll consecutive chunks, p * kUnroll + u, (kSplit + p) *
// kUnroll + u, ...; the first round is loaded before any is used, and each chunk, once used,
// is replaced by the lane's chunk of the next round, so that kUnroll chunks stay in flight.
// The split warps' f32 fragments are added in shared memory in warp order (a fixed order:
// the same bits every run). A weight row past N (the last group's, when its rows do not
// divide N) reads row N - 1 and is not stored. K must be a multiple of the 32-element chunk
// (the lowering checks). Numerics: the tensor cores' f32 accumulation of exact bf16/f16
// products (its order and intermediate rounding are the hardware's, not SmallMGemm's fmaf
// chain), then as SmallMGemm: alpha times the sum and beta times C each rounded to f32 and
// added, one rounding to D's dtype. C may not be D's buffer.

// d (16x8, f32) += a (16x16, row-major) b (16x8, column-major), T bf16 or f16; a0..a3 and
// b0, b1 the PTX ISA's m16n8k16 fragment registers, 2 elements each.
template <typename T>
__device__ __forceinline__ void MmaM16N8K16(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                            unsigned b0, unsigned b1);
template <>
__device__ __forceinline__ void MmaM16N8K16<__nv_bfloat16>(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                                           unsigned a3, unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void MmaM16N8K16<__half>(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                                    unsigned a3, unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <typename T>
inline constexpr bool kIsMmaOperand = false;
template <>
inline constexpr bool kIsMmaOperand<__nv_bfloat16> = true;
template <>
inline constexpr bool kIsMmaOperand<__half> = true;

template <typename T, typename TD, int kM, long long kN, long long kK, int kRowTiles, int kSplit, int kUnroll,
          int kGroups, bool kHasC = false>
struct SmallMGemmMma {
  static_assert(kIsMmaOperand<T>, "bf16 or f16 operands: the mma's");
  static constexpr int kChunk = 32;  // K elements: 8 a lane (16 bytes) x the 4 lanes of a row
  static_assert(kK % kChunk == 0, "K must be whole 32-element chunks");
  static_assert(kM >= 1 && kM <= 64, "at most 8 n-tiles of A rows");
  static_assert(kRowTiles >= 1 && kUnroll >= 1 && kSplit >= 1 && kGroups >= 1,
                "at least one weight tile, one chunk in flight and one warp");
  static constexpr int kNTiles = (kM + 7) / 8;
  static constexpr long long kChunks = kK / kChunk;
  static constexpr long long kRowsPerGroup = 16LL * kRowTiles;
  static constexpr long long kRowsPerBlock = kRowsPerGroup * kGroups;
  static constexpr long long kBlocks = CeilDiv(kN, kRowsPerBlock);
  static constexpr long long kRound = static_cast<long long>(kSplit) * kUnroll;  // chunks a round of the group
  static constexpr int kFloats = kRowTiles * kNTiles * 4;                        // a lane's accumulators
  static_assert(kSplit == 1 || kGroups * (kSplit - 1) * kFloats * kWarpSize * 4 <= 48 * 1024,
                "the split warps' fragments fit static shared memory");

  // c: null unless kHasC.
  static __device__ __forceinline__ void Run(TD* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b,
                                             const TD* __restrict__ c, float alpha, float beta) {
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int group = warp / kSplit, part = warp % kSplit;
    const int g = lane / 4, t = lane % 4;
    const long long first = static_cast<long long>(blockIdx.x) * kRowsPerBlock + group * kRowsPerGroup;
    // The lane's rows (g and g + 8 of each tile; row N - 1 for those past N) and A's (8j + g of
    // n-tile j), each at its 16-byte piece of the warp's first chunk and moved on a round at a
    // time, so that every load of a round is at a constant offset of one pointer a row. A's
    // n-tiles are constant offsets of one pointer, but for a last n-tile partly past M (its
    // rows past M read row M - 1).
    const long long start = static_cast<long long>(part) * kUnroll;  // the warp's first chunk
    const T* rows[kRowTiles][2];
#pragma unroll
    for (int i = 0; i < kRowTiles; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const long long r = first + 16 * i + 8 * h + g;
        rows[i][h] = b + (r < kN ? r : kN - 1) * kK + 8 * t + start * kChunk;
      }
    }
    const T* a_full = a + g * kK + 8 * t + start * kChunk;
    const int last_row = 8 * (kNTiles - 1) + g;
    const T* a_last = a + (last_row < kM ? last_row : kM - 1) * kK + 8 * t + start * kChunk;
    auto a_piece = [&](int j, int u) {
      const T* p = 8 * j + 8 <= kM ? a_full + 8LL * j * kK : a_last;
      return *reinterpret_cast<const int4*>(p + u * kChunk);
    };
    float acc[kRowTiles][kNTiles][4];
#pragma unroll
    for (int i = 0; i < kRowTiles; ++i) {
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
      }
    }
    int4 bv[kUnroll][kRowTiles][2];
    auto load = [&](int u, long long offset) {
#pragma unroll
      for (int i = 0; i < kRowTiles; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) bv[u][i][h] = __ldcs(reinterpret_cast<const int4*>(rows[i][h] + offset));
      }
    };
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (start + u < kChunks) load(u, u * kChunk);
    }
    // chunk: the round's first chunk of this warp, the same in every lane (the mma's are warp-wide).
#pragma unroll 1
    for (long long chunk = start; chunk < kChunks; chunk += kRound) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (chunk + u >= kChunks) continue;
        int4 av[kNTiles];
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) av[j] = a_piece(j, u);
#pragma unroll
        for (int i = 0; i < kRowTiles; ++i) {
          const int4 lo = bv[u][i][0], hi = bv[u][i][1];
#pragma unroll
          for (int j = 0; j < kNTiles; ++j) {
            MmaM16N8K16<T>(acc[i][j], lo.x, hi.x, lo.y, hi.y, av[j].x, av[j].y);  // elements 8t + {0..3}
            MmaM16N8K16<T>(acc[i][j], lo.z, hi.z, lo.w, hi.w, av[j].z, av[j].w);  // 8t + {4..7}
          }
        }
        if (chunk + u + kRound < kChunks) load(u, (u + kRound) * kChunk);
      }
#pragma unroll
      for (int i = 0; i < kRowTiles; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) rows[i][h] += kRound * kChunk;
      }
      a_full += kRound * kChunk;
      a_last += kRound * kChunk;
    }
    if constexpr (kSplit > 1) {
      // The group's warps' fragments, added in warp order by the group's first warp; [lane]
      // innermost, so that a warp's accesses fall in 32 distinct banks.
      __shared__ float partials[kGroups][kSplit - 1][kFloats][kWarpSize];
      if (part > 0) {
#pragma unroll
        for (int i = 0; i < kRowTiles; ++i) {
#pragma unroll
          for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
            for (int q = 0; q < 4; ++q) partials[group][part - 1][(i * kNTiles + j) * 4 + q][lane] = acc[i][j][q];
          }
        }
      }
      __syncthreads();
      if (part > 0) return;
#pragma unroll
      for (int p = 0; p < kSplit - 1; ++p) {
#pragma unroll
        for (int i = 0; i < kRowTiles; ++i) {
#pragma unroll
          for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] += partials[group][p][(i * kNTiles + j) * 4 + q][lane];
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kRowTiles; ++i) {
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const long long n = first + 16 * i + g + (q >= 2 ? 8 : 0);
          const int m = 8 * j + 2 * t + q % 2;
          if (n >= kN || m >= kM) continue;
          const long long at = m * kN + n;
          float v = __fmul_rn(alpha, acc[i][j][q]);
          if constexpr (kHasC) v = __fadd_rn(v, __fmul_rn(beta, ToFloat(c[at])));
          out[at] = FromFloat<TD>(v);
        }
      }
    }
  }
};

}  // namespace kiln::kernels
