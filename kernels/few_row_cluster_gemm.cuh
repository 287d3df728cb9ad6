// A gemm of a few dozen rows on tensor cores, K split over a thread-block cluster: the decode
// step's projections at batch 9-64, D[m, n] = alpha sum_k A[m, k] B[n, k] (+ beta C[m, n]),
// A [M, K] the activations and B [N, K] a linear layer's weight, both K-inner and bf16
// (a_layout=mk, b_layout=nk), as ir/op_table.h's gemm defines it without an epilogue;
// codegen/lower_gemv.cc says when a gemm takes this kernel instead of cuBLASLt.
//
// Why: at M = 32 a projection's time is its weight's bytes over the bandwidth it reaches, and
// cuBLASLt reaches 0.7-1.9 TB/s of the H100's 3.0 on llama-M's (bench/RESULTS.md, sessions 21
// and 25): an N of 2048 in 128-row tiles is 16 blocks. Two kernels of ours lost to it before
// (session 21: A read from global memory by every warp, twice the weight's bytes through L2;
// session 25: K split over blocks whose last one adds the partials behind a fence and a
// counter, a chain too long for the 8 MB it streams). This one keeps a block streaming many
// rows and splits K without a fence:
// - A block of kWarps warps takes kRowsPerWarp = 16 kTiles consecutive rows of B each over its
//   cluster rank's slice of K; the cluster's kSplit blocks (one per slice) share the rows.
// - B goes straight from global memory to registers (16-byte evict-first loads, kUnroll
//   slabs of 32 columns in flight a lane) as mma.sync's A operand; the block's slice of A is
//   copied once into shared memory (cp.async) and read from there as the B operand, so A's
//   bytes through L2 are M / (16 kTiles kWarps) of the weight's.
// - The K order: lane (g, t) of a quad loads the 16 bytes at columns 32 s + 8 t of row g (and
//   g + 8) of B and of row g of A; elements 0-1 and 2-3 are its k pairs of the slab's first
//   m16n8k16 step, 4-5 and 6-7 of the second. Both operands take the same permutation of K,
//   so the sums are the product's; no shuffle, no ldmatrix.
// - Each block stores its f32 partial tile in shared memory; after a cluster barrier rank r
//   adds the kSplit partials of its share of the tile in rank order, reading the others'
//   through distributed shared memory (no global scratch, no fence, the same bits every run),
//   applies alpha and beta C and stores D; a second barrier keeps every block's partials alive
//   until they are read.
// Accumulation is f32 (the tensor cores' sums of bf16 products), one rounding to D's dtype at
// the store as SmallMGemm (kernels/gemv.cuh) does; Glu the same GLU form: B holds 2 kN rows,
// gate then up, and a block's first half of warps takes gate rows, its second half the
// matching up rows.
//
// Shared memory (dynamic, kSharedBytes): A's slice [kMPad][kXStride bytes], rows past M and
// columns past K zero; the partial tile [kBRowsPerBlock][kMPad + 2] f32. kXStride is 64 mod
// 128 bytes, so a quarter warp's 16-byte reads of two rows hit eight distinct bank groups.
#pragma once

#include "kernels/common.cuh"
#include "kernels/gemv.cuh"

namespace kiln::kernels {

template <int kM, long long kK, int kTiles, int kWarps, int kSplit, bool kGlu>
struct FewRowClusterGemmLayout {
  static constexpr int kNTiles = (kM + 7) / 8;  // n8 tiles of A's rows
  static constexpr int kMPad = kNTiles * 8;
  static constexpr int kRowsPerWarp = 16 * kTiles;
  static constexpr long long kBRowsPerBlock = static_cast<long long>(kRowsPerWarp) * kWarps;
  static constexpr long long kColumnsPerBlock = kGlu ? kBRowsPerBlock / 2 : kBRowsPerBlock;  // of D
  static constexpr long long kSlabs = CeilDiv(kK, 32);  // 32 columns of K: 64 bytes a row
  static constexpr long long kSlabsPerSplit = CeilDiv(kSlabs, kSplit);
  static constexpr long long kXStride = kSlabsPerSplit * 64 + ((kSlabsPerSplit % 2 == 0) ? 64 : 0);  // bytes
  static constexpr long long kXBytes = kMPad * kXStride;
  static constexpr int kPartialStride = kMPad + 2;  // floats
  static constexpr long long kPartialBytes = kBRowsPerBlock * kPartialStride * 4;
  static constexpr long long kSharedBytes = kXBytes + kPartialBytes;
};

template <typename TD, int kM, long long kN, long long kK, int kTiles, int kWarps, int kSplit, int kUnroll,
          bool kHasC = false, bool kWeightsBeforeWait = false, typename Glu = NoGlu>
struct FewRowClusterGemm {
  using T = __nv_bfloat16;
  static constexpr bool kGlu = IsGlu<Glu>::kValue;
  using Layout = FewRowClusterGemmLayout<kM, kK, kTiles, kWarps, kSplit, kGlu>;
  static constexpr int kNTiles = Layout::kNTiles, kMPad = Layout::kMPad, kRowsPerWarp = Layout::kRowsPerWarp;
  static constexpr long long kBRowsPerBlock = Layout::kBRowsPerBlock, kColumnsPerBlock = Layout::kColumnsPerBlock;
  static constexpr long long kSlabs = Layout::kSlabs, kSlabsPerSplit = Layout::kSlabsPerSplit;
  static constexpr long long kXStride = Layout::kXStride;
  static constexpr int kPartialStride = Layout::kPartialStride;
  static constexpr long long kRowTiles = CeilDiv(kN, kColumnsPerBlock);
  static constexpr long long kBlocks = kRowTiles * kSplit;
  static constexpr int kThreads = kWarps * kWarpSize;
  static_assert(kK % 8 == 0, "K must be whole 16-byte chunks");
  static_assert(kM >= 1 && kTiles >= 1 && kWarps >= 1 && kUnroll >= 1, "at least one row, tile, warp and slab");
  static_assert(kSplit >= 1 && kSplit <= 8, "a portable cluster: at most 8 blocks");
  static_assert(!kGlu || (kWarps % 2 == 0 && !kHasC), "a GLU block's warps are half gate, half up; no C");
  static_assert(kColumnsPerBlock % kSplit == 0, "each rank adds an equal share of the tile");

  static __device__ __forceinline__ unsigned ClusterRank() {
    unsigned r = 0;
    if constexpr (kSplit > 1) asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
  }
  static __device__ __forceinline__ void ClusterSync() {
    if constexpr (kSplit > 1) {
      asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    } else {
      __syncthreads();
    }
  }

  // c: null unless kHasC. The caller launches kBlocks blocks of kThreads threads, clusters of
  // kSplit blocks along x (the wrapper's __cluster_dims__), with Layout::kSharedBytes of
  // dynamic shared memory.
  static __device__ __forceinline__ void Run(TD* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b,
                                             const TD* __restrict__ c, float alpha, float beta) {
    extern __shared__ __align__(16) unsigned char shared[];
    // The lowering sizes the launch's shared memory by the same layout (codegen/lower_gemv.cc).
    unsigned given;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(given));
    if (given < Layout::kSharedBytes) __trap();
    unsigned char* x_tile = shared;
    float* partial = reinterpret_cast<float*>(shared + Layout::kXBytes);
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int g = lane / 4, t = lane % 4;
    const unsigned rank = ClusterRank();
    const long long tile = blockIdx.x / kSplit;
    const long long slab_begin = static_cast<long long>(rank) * kSlabsPerSplit;
    const long long slab_count = slab_begin >= kSlabs ? 0
                                 : (kSlabs - slab_begin < kSlabsPerSplit ? kSlabs - slab_begin : kSlabsPerSplit);

    // This lane's B rows: tile i's rows g and g + 8 of the warp's 16 i. A row past N (the last
    // tile's) reads row N - 1 again and is not stored.
    const T* rows[kTiles][2];
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const long long in_block = static_cast<long long>(warp) * kRowsPerWarp + 16 * i + 8 * h + g;
        long long row;
        if constexpr (kGlu) {
          const long long half = kBRowsPerBlock / 2, column = tile * kColumnsPerBlock + in_block % half;
          row = (column < kN ? column : kN - 1) + (in_block >= half ? kN : 0);
        } else {
          const long long r = tile * kColumnsPerBlock + in_block;
          row = r < kN ? r : kN - 1;
        }
        rows[i][h] = b + row * kK;
      }
    }
    uint4 bv[kUnroll][kTiles][2];
    auto load_round = [&](long long local) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const long long column = (slab_begin + local + u) * 32 + 8 * t;
        const bool valid = local + u < slab_count && column < kK;
#pragma unroll
        for (int i = 0; i < kTiles; ++i) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if (valid) {
              const int4 v = __ldcs(reinterpret_cast<const int4*>(rows[i][h] + column));
              bv[u][i][h] = make_uint4(v.x, v.y, v.z, v.w);
            } else {
              bv[u][i][h] = make_uint4(0, 0, 0, 0);
            }
          }
        }
      }
    };
    load_round(0);
    if constexpr (kWeightsBeforeWait) GridDependencyWait();

    // A's slice into shared memory: rows past M and columns past K as zeros.
    constexpr long long kChunksPerRow = kSlabsPerSplit * 4;  // 16-byte chunks
    for (long long i = threadIdx.x; i < kMPad * kChunksPerRow; i += kThreads) {
      const long long m = i / kChunksPerRow, chunk = i % kChunksPerRow;
      const long long column = slab_begin * 32 + chunk * 8;
      const bool valid = m < kM && chunk < slab_count * 4 && column < kK;
      CpAsync16OrZero(x_tile + m * kXStride + chunk * 16, valid ? a + m * kK + column : a, valid);
    }
    CpAsyncCommit();
    CpAsyncWaitAll();
    __syncthreads();

    float acc[kTiles][kNTiles][4];
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
      }
    }
    for (long long local = 0; local < slab_count;) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (local + u >= slab_count) continue;
        uint4 xv[kNTiles];
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
          xv[j] = *reinterpret_cast<const uint4*>(x_tile + (8 * j + g) * kXStride + (local + u) * 64 + 16 * t);
        }
#pragma unroll
        for (int i = 0; i < kTiles; ++i) {
          const unsigned first[4] = {bv[u][i][0].x, bv[u][i][1].x, bv[u][i][0].y, bv[u][i][1].y};
          const unsigned second[4] = {bv[u][i][0].z, bv[u][i][1].z, bv[u][i][0].w, bv[u][i][1].w};
#pragma unroll
          for (int j = 0; j < kNTiles; ++j) {
            Mma(acc[i][j], first, xv[j].x, xv[j].y);
            Mma(acc[i][j], second, xv[j].z, xv[j].w);
          }
        }
      }
      local += kUnroll;
      if (local >= slab_count) break;
      load_round(local);
    }
#if __CUDA_ARCH__ >= 900
    // As SmallMGemm: the next kernel's blocks become resident once the weight has streamed.
    asm volatile("griddepcontrol.launch_dependents;");
#endif

    // The partial tile: partial[row of B in the block][row of A].
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      const int row = warp * kRowsPerWarp + 16 * i + g;
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        const int m = 8 * j + 2 * t;
        *reinterpret_cast<float2*>(partial + row * kPartialStride + m) = make_float2(acc[i][j][0], acc[i][j][1]);
        *reinterpret_cast<float2*>(partial + (row + 8) * kPartialStride + m) = make_float2(acc[i][j][2], acc[i][j][3]);
      }
    }
    ClusterSync();

    // Rank r's share of the tile's columns, each the sum of the kSplit partials in rank order.
    constexpr long long kShare = kColumnsPerBlock / kSplit;
    auto partial_sum = [&](long long row, int m) {
      float sum = 0.0f;
      const unsigned local_address = SharedAddress(partial + row * kPartialStride + m);
#pragma unroll
      for (int p = 0; p < kSplit; ++p) {
        float v;
        if constexpr (kSplit > 1) {
          unsigned remote;
          asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local_address), "r"(p));
          asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
        } else {
          v = partial[row * kPartialStride + m];
        }
        sum = p == 0 ? v : sum + v;
      }
      return sum;
    };
    for (long long i = threadIdx.x; i < kShare * kM; i += kThreads) {
      const long long in_share = i % kShare;
      const int m = static_cast<int>(i / kShare);
      const long long column_in_block = static_cast<long long>(rank) * kShare + in_share;
      const long long n = tile * kColumnsPerBlock + column_in_block;
      if (n >= kN) continue;
      if constexpr (kGlu) {
        const float gate = partial_sum(column_in_block, m), up = partial_sum(kColumnsPerBlock + column_in_block, m);
        out[m * kN + n] = Glu::Apply(__fmul_rn(alpha, gate), __fmul_rn(alpha, up));
      } else {
        float v = __fmul_rn(alpha, partial_sum(column_in_block, m));
        if constexpr (kHasC) {
          v = __fadd_rn(v, __fmul_rn(beta, kWeightsBeforeWait ? ToFloatAfterWait(c + m * kN + n) : ToFloat(c[m * kN + n])));
        }
        out[m * kN + n] = FromFloat<TD>(v);
      }
    }
    // No block leaves while another may still read its partials.
    if constexpr (kSplit > 1) ClusterSync();
  }
};

}  // namespace kiln::kernels
