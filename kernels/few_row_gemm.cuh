// FewRowMmaGemm: the decode step's gemm at 9 to 64 rows of A (a batch of 16, 32 or 64
// sequences), D[m, n] = alpha sum_k A[m, k] B[n, k] (+ beta C[m, n]), A [M, K] and B [N, K]
// both K-inner, bf16 or f16 operands, on tensor cores (codegen/lower_few_row_gemm.cc says when
// a gemm takes it instead of cuBLASLt).
//
// Why: at M = 32 a gemm still reads each weight element once and is bound by the weight's
// bytes, but it makes 32 FMAs of each, more than SmallMGemm's CUDA-core FMAs keep up with.
// cuBLASLt's kernels tile N in 64-128 columns and split K little: llama-M's o projection at
// batch 32 is 32 blocks on 132 SMs, 1.08 TB/s of the H100's 3.0 (bench/RESULTS.md, session 25).
//
// Work: block (r, s) takes kWarps * 16 consecutive rows of B (a warp 16 of them: the mma's
// A operand, "row") and K slice s of kSliceChunks 32-element chunks; the grid is kRowBlocks x
// kSlices, enough blocks to keep every SM streaming even where N is small. A's slice
// (kM rows, padded to whole 8-row n-tiles with zeros) is copied into shared memory once a
// block with cp.async, so the warps' A fragments are shared-memory reads (an earlier kernel
// read them from global memory through L1 and lost in the decode graph: session 21).
//
// Fragments: a sum over K does not depend on the order of K when both operands use the same
// order, so a lane loads whole 16-byte pieces and the mma steps take their halves. With
// g = lane / 4 and t = lane % 4, chunk c has the lane load B[row g][32c + 8t .. + 7] and
// B[row g + 8][same], and read A[8j + g][same] of each n-tile j from shared memory: 4
// registers of 2 elements each, register q holding elements 8t + 2q, 8t + 2q + 1. The
// chunk's first mma step takes B registers 0 (a0a1 of row g), 0 of row g + 8 (a2a3), 1 and 1
// (a4a5, a6a7), and A registers 0 (b0b1) and 1 (b2b3); the second registers 2 and 3. In the
// PTX ISA's m16n8k16 layouts a0a1 and b0b1 are both the tile's k 2t, 2t + 1 and a4a5 and
// b2b3 both k 2t + 8, 2t + 9, so every logical k pairs the same physical element of B and A,
// and the 8 (t, step) pairs cover the chunk's 32 elements once. The accumulator's c0c1 are
// (B row g, A rows 8j + 2t, + 1), c2c3 B row g + 8: D transposed, stored element by element.
//
// Memory: B streams past L1 (ld.global.nc.L1::no_allocate: a load instruction reads 64
// contiguous bytes of each of the warp's 16 rows, half of 16 lines that L1 would otherwise
// allocate, and a warp has 16 such loads in flight), kUnroll chunks of each of the lane's two
// rows in flight, each chunk refilled from the lane's next one as it is used; consecutive
// chunks continue the rows. A's rows sit kSliceChunks * 32 elements apart in shared memory,
// 32 more where that is a multiple of 128 bytes: rows g and g + 1 then start 64 bytes apart
// in the banks, so a quarter-warp's 16-byte reads (rows g, g + 1, lanes t 0..3) fall in 32
// distinct banks.
//
// Slices: with kSlices > 1 each block stores its f32 fragments to `partials` ([block][warp]
// [float][lane]); the last slice of a row block to finish (a count in `slices_done`, the
// module's, zero when it loads) adds the slices' fragments in slice order (the same bits
// every run) and stores D, then sets the count back to zero for the next launch.
// Epilogue: alpha times the f32 sum, plus beta C, each rounded to f32, one rounding to TD, as
// SmallMGemm and the reference (the tensor cores' f32 accumulation orders its additions as
// the hardware does). A row of B past N (the last block's) reads row N - 1 and is not stored.
//
// kWeightsBeforeWait (codegen, where B is step-invariant): the first round of B's loads is
// issued before the kernel waits for the kernels ahead (GridDependencyWait); A's copy and C
// follow the wait. The next kernel may launch once the main loop is done.
//
// Launch: grid kBlocks = kRowBlocks * kSlices blocks of kWarps * 32 threads, kSharedBytes of
// dynamic shared memory; partials of kScratchFloats floats where kSlices > 1.
#pragma once

#include "kernels/common.cuh"

namespace kiln::kernels {

// d (16x8, f32) += a (16x16, row-major) b (16x8, column-major), T bf16 or f16; a0..a3 and
// b0, b1 the PTX ISA's m16n8k16 fragment registers, 2 elements each.
template <typename T>
__device__ __forceinline__ void MmaM16N8K16(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                            unsigned b0, unsigned b1);
template <>
__device__ __forceinline__ void MmaM16N8K16<__nv_bfloat16>(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                                           unsigned a3, unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void MmaM16N8K16<__half>(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                                    unsigned a3, unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 16 bytes of a stream read once (a weight), past L1: no line allocated for it.
__device__ __forceinline__ int4 LoadStreamNoL1(const void* p) {
  int4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <typename T, typename TD, int kM, long long kN, long long kK, int kWarps, int kUnroll, int kSlices,
          bool kHasC = false, bool kWeightsBeforeWait = false>
struct FewRowMmaGemm {
  static constexpr int kChunk = 32;  // K elements: 8 a lane (16 bytes) x the 4 lanes of a row
  static_assert(sizeof(T) == 2, "bf16 or f16 operands: the mma's");
  static_assert(kK % kChunk == 0, "K must be whole 32-element chunks");
  static_assert(kM >= 1 && kM <= 64, "at most 8 n-tiles of A rows");
  static_assert(kWarps >= 1 && kUnroll >= 1 && kSlices >= 1, "a warp, a chunk in flight and a slice at least");
  static constexpr int kNTiles = (kM + 7) / 8;
  static constexpr int kPaddedM = kNTiles * 8;
  static constexpr long long kChunks = kK / kChunk;
  static constexpr long long kSliceChunks = CeilDiv(kChunks, kSlices);
  static_assert((kSlices - 1) * kSliceChunks < kChunks, "every slice has a chunk");
  static constexpr long long kRowsPerBlock = 16LL * kWarps;
  static constexpr long long kRowBlocks = CeilDiv(kN, kRowsPerBlock);
  static constexpr long long kBlocks = kRowBlocks * kSlices;
  // Elements of a row of A in shared memory: rows g and g + 1 start 64 bytes apart in the banks.
  static constexpr long long kRowStride = kSliceChunks * kChunk + (kSliceChunks % 2 == 0 ? 32 : 0);
  static constexpr long long kSharedBytes = kPaddedM * kRowStride * 2;
  static constexpr int kFloats = kNTiles * 4;  // a lane's accumulators
  static constexpr long long kScratchFloats = kSlices > 1 ? kBlocks * kWarps * kFloats * kWarpSize : 0;

  // c: null unless kHasC; partials and slices_done: null unless kSlices > 1.
  static __device__ __forceinline__ void Run(TD* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b,
                                             const TD* __restrict__ c, float alpha, float beta, float* partials,
                                             unsigned int* slices_done) {
    extern __shared__ __align__(16) unsigned char shared_bytes[];
    T* a_shared = reinterpret_cast<T*>(shared_bytes);
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int g = lane / 4, t = lane % 4;
    const long long row_block = blockIdx.x / kSlices;
    const int slice = static_cast<int>(blockIdx.x % kSlices);
    const long long chunk0 = slice * kSliceChunks;
    const int chunks = static_cast<int>(kChunks - chunk0 < kSliceChunks ? kChunks - chunk0 : kSliceChunks);
    const long long first = row_block * kRowsPerBlock + 16LL * warp;
    const T* rows[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const long long r = first + 8 * h + g;
      rows[h] = b + (r < kN ? r : kN - 1) * kK + chunk0 * kChunk + 8 * t;
    }
    int4 bv[kUnroll][2];
    auto load = [&](int u, int chunk) {
#pragma unroll
      for (int h = 0; h < 2; ++h) bv[u][h] = LoadStreamNoL1(rows[h] + chunk * kChunk);
    };
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (u < chunks) load(u, u);
    }
    if constexpr (kWeightsBeforeWait) GridDependencyWait();
    // A's slice into shared memory; the padding rows (past M) and a short last slice's tail
    // are zeros.
    constexpr int kPieces = static_cast<int>(kSliceChunks * kChunk / 8);  // 16-byte pieces of a row
    for (int i = threadIdx.x; i < kPaddedM * kPieces; i += kWarps * kWarpSize) {
      const int m = i / kPieces, p = i % kPieces;
      const bool valid = m < kM && p < chunks * (kChunk / 8);
      CpAsync16OrZero(a_shared + m * kRowStride + p * 8, a + (valid ? m * kK + chunk0 * kChunk + p * 8 : 0), valid);
    }
    CpAsyncCommit();
    CpAsyncWaitAll();
    __syncthreads();

    float acc[kNTiles][4];
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[j][q] = 0.0f;
    }
    const T* a_lane = a_shared + g * kRowStride + 8 * t;
#pragma unroll 1
    for (int base = 0; base < chunks; base += kUnroll) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int chunk = base + u;
        if (chunk >= chunks) break;  // the same in every lane: the mma's are warp-wide
        const int4 lo = bv[u][0], hi = bv[u][1];
        if (chunk + kUnroll < chunks) load(u, chunk + kUnroll);
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
          const int4 av = *reinterpret_cast<const int4*>(a_lane + 8 * j * kRowStride + chunk * kChunk);
          MmaM16N8K16<T>(acc[j], lo.x, hi.x, lo.y, hi.y, av.x, av.y);  // elements 8t + {0..3}
          MmaM16N8K16<T>(acc[j], lo.z, hi.z, lo.w, hi.w, av.z, av.w);  // 8t + {4..7}
        }
      }
    }
#if __CUDA_ARCH__ >= 900
    // The next kernel may launch now that B has streamed (codegen opens this kernel with the
    // wait alone: KernelSpec::launches_dependents_itself).
    asm volatile("griddepcontrol.launch_dependents;");
#endif
    if constexpr (kSlices > 1) {
      float* mine = partials + (static_cast<long long>(blockIdx.x) * kWarps + warp) * kFloats * kWarpSize + lane;
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
        for (int q = 0; q < 4; ++q) __stcg(mine + (j * 4 + q) * kWarpSize, acc[j][q]);
      }
      __shared__ bool last;
      __threadfence();
      __syncthreads();
      if (threadIdx.x == 0) last = atomicAdd(slices_done + row_block, 1u) == kSlices - 1;
      __syncthreads();
      if (!last) return;
      __threadfence();
      const float* row_partials = partials + (row_block * kSlices * kWarps + warp) * kFloats * kWarpSize + lane;
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[j][q] = __ldcg(row_partials + (j * 4 + q) * kWarpSize);
      }
      for (int s = 1; s < kSlices; ++s) {
        const float* p = row_partials + static_cast<long long>(s) * kWarps * kFloats * kWarpSize;
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
          for (int q = 0; q < 4; ++q) acc[j][q] += __ldcg(p + (j * 4 + q) * kWarpSize);
        }
      }
      if (threadIdx.x == 0) slices_done[row_block] = 0;
    }
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const long long n = first + g + (q >= 2 ? 8 : 0);
        const int m = 8 * j + 2 * t + q % 2;
        if (n >= kN || m >= kM) continue;
        const long long at = m * kN + n;
        float v = __fmul_rn(alpha, acc[j][q]);
        if constexpr (kHasC) {
          v = __fadd_rn(v, __fmul_rn(beta, kWeightsBeforeWait ? ToFloatAfterWait(c + at) : ToFloat(c[at])));
        }
        out[at] = FromFloat<TD>(v);
      }
    }
  }
};

}  // namespace kiln::kernels
