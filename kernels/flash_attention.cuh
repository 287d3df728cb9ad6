// Causal flash attention, forward and backward, on bf16 tensor cores (mma.sync m16n8k16,
// fp32 accumulation), computing the `attention` op of ir/op_table.h without ever
// materializing the [T, T] scores:
//
//   S     = (q · kᵀ) * scale                       bf16 operands, fp32 accumulation
//   S_ij  = -inf where key j > query i             causal mask
//   m_i   = ceil(max_j S_ij * log2 e)              the row max, rounded up to a whole power of 2
//   P̃_ij  = bf16(2^(S_ij * log2 e - m_i))          unnormalized, rounded to bf16 once
//   l_i   = sum_j 2^(S_ij * log2 e - m_i)          fp32, of the unrounded terms
//   O_i   = (sum_j P̃_ij v_j) / l_i                 fp32 accumulation, one division
//   LSE_i = (m_i + log2 l_i) * ln 2 = log sum_j exp(S_ij)
//
// and, given dO (the cotangent of O), with dO_b = bf16(dO) as kiln's autocast VJP rounds it:
//
//   Delta = rowsum(dO_b * bf16(O))                 (FlashAttentionBackwardDelta)
//   dP    = dO_b · vᵀ
//   dS    = P * (dP - Delta) * scale               P recomputed in fp32 from q, k and LSE
//   dq    = bf16(dS) · k
//   dk    = bf16(dS)ᵀ · q,    dv = bf16(P)ᵀ · dO_b  summed over the query heads of a kv head
//
// Layouts: q [B, H, T, D], k and v [B, Hkv, T, D] bf16, row-major; O, dO, dq [B, H, T, D];
// dk, dv [B, Hkv, T, D]; LSE and Delta fp32 [B, H, T]. GQA: query head h reads kv head
// h / (H / Hkv). T must be a multiple of 64 and D 64 or 128 (larger D would spill the
// registers that hold a warp's accumulators; FlashAttentionUnsupportedReason says which).
//
// P is rounded to bf16 before normalization, so the forward is one pass over the keys with
// an online softmax (FlashAttention-2's), 2 GEMMs of the causal half. Because bf16 rounding
// commutes with scaling by a power of two, bf16(2^(x - m)) 2^(m - m') = bf16(2^(x - m')): a
// running max kept at whole powers of two makes every rescaling of O and l exact, and O
// does not depend on which tile raised the max, nor on the tile sizes (the wgmma kernel,
// kernels/flash_attention_wgmma.cuh, uses other tiles and gets the same O up to fp32
// accumulation order). The offset m_i only keeps the terms in range: the definition is
// O_i = sum_j bf16(e^S_ij) v_j / sum_j e^S_ij with bf16 rounding to 8 significant bits.
// This differs from the unfused IR's bf16(softmax(S)) v by bf16 rounding noise of P
// (relative 2^-9 per term) and from it only: select-flash-attention's proof allows for it.
// The backward recomputes the normalized P = exp(S - LSE) from the stored LSE, in fp32, as
// the IR's softmax gradient does.
// A second departure, in the backward: Delta here is rowsum(dO_b * bf16(O)), where O was
// computed with bf16(P) and is rounded to bf16 (as FlashAttention and cuDNN compute Delta from
// their bf16 O; the attention_delta op's definition, so an fp32 O and the bf16 O that
// attention {out_dtype=bf16} stores give the same Delta); the IR's softmax gradient sums
// dP * P with P in fp32. The two differ by sum_j dP_ij (bf16(P_ij) - P_ij), bf16 rounding
// noise of P (relative 2^-9 per term), and by rowsum(dO_b * (bf16(O) - O)), bf16 rounding
// noise of O (relative 2^-9 per term).
//
// dO may be fp32 or bf16: fp32 is rounded to bf16 as it is loaded (synchronously); bf16,
// which kiln's VJP already produces (convert(dO, bf16) before the products), streams in
// with cp.async and is the faster choice. Outputs (O, dq, dk, dv) are fp32 or bf16,
// rounded once on store.
//
// Tiling, in FlashAttention-2's manner: a block is 4 warps; each warp owns 16 rows (query
// rows, or key rows in dk/dv) of the block's tile and keeps its fp32 accumulators and its
// A operands in registers; B operands stream through shared memory (cp.async, double
// buffered, XOR-swizzled 16-byte chunks so that ldmatrix is free of bank conflicts).
// Determinism: no atomics; every sum runs in an order fixed by the template arguments.
//   - dk/dv: one block per (batch, kv head, 64 keys) walks the query heads of its group and
//     the query tiles at or after its keys, in order.
//   - dq: one block per (batch, head, 64 queries) walks the key tiles at or before them.
//   The backward thus recomputes S and dP twice (7 GEMMs of the causal half instead of
//   FlashAttention-2's 5 with float atomics on dq).
// Blocks are ordered heaviest first (most tiles under the causal mask) to balance the tail.
//
// Launch (per kernel): grid (grid_x, 1, 1), block (block_threads, 1, 1) and shared_bytes
// of dynamic shared memory, from the constexpr host-and-device functions below
// (FlashAttentionForwardLaunch and friends, callable by codegen with run-time shapes) or,
// in device code, the Config structs' constants:
//   forward   FlashAttentionForward        FlashAttentionForwardLaunch        (o and lse)
//   delta     FlashAttentionBackwardDelta  FlashAttentionBackwardDeltaLaunch  (delta)
//   dq        FlashAttentionBackwardDq     FlashAttentionBackwardDqLaunch     (dq)
//   dk, dv    FlashAttentionBackwardDkDv   FlashAttentionBackwardDkDvLaunch   (dk and dv)
// The attention kernels need more than the default 48 KiB of dynamic shared memory for
// D = 128, which runtime/cuda/kernel_launch.cc's PrepareLaunch grants from
// KernelSpec::shared_bytes. A wrapper declares __launch_bounds__(block_threads). The delta
// kernel runs before dq and dk/dv; those two are independent of each other.
#pragma once

// The geometry below is plain C++ as well, so that host code (codegen) can include this
// header and compute launches from run-time shapes; the kernels need a CUDA compiler.
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define KILN_FLASH_ATTENTION_HD __host__ __device__
#else
#define KILN_FLASH_ATTENTION_HD
#endif

namespace kiln::kernels {

// --------------------------------------------------------------------------- geometry

// What a launch of one of the kernels below needs: grid (kGridX, 1, 1), block
// (block_threads, 1, 1), dynamic shared memory bytes; block_m / block_n are its tile sizes
// (rows of queries / keys), for comments.
struct FlashAttentionLaunch {
  unsigned grid_x = 0, block_threads = 0, shared_bytes = 0;
  int block_m = 0, block_n = 0;
};

namespace flash_attention {
constexpr int kWarps = 4;
constexpr unsigned kBlockThreads = kWarps * 32;
constexpr unsigned kBf16Bytes = 2;
}  // namespace flash_attention

// Why the kernels cannot take this shape, or nullptr when they can (each reason is also a
// static_assert of the kernels).
KILN_FLASH_ATTENTION_HD constexpr const char* FlashAttentionUnsupportedReason(long long batch, long long heads,
                                                                              long long kv_heads, long long seq_len,
                                                                              long long head_dim) {
  if (batch <= 0 || heads <= 0 || kv_heads <= 0) return "batch and heads must be positive";
  if (heads % kv_heads != 0) return "query heads must be a multiple of kv heads (GQA)";
  if (seq_len <= 0 || seq_len % 64 != 0) return "T must be a positive multiple of 64 (the tile sizes)";
  if (head_dim != 64 && head_dim != 128) return "D must be 64 or 128";
  if (batch * heads * (seq_len / 64) > 0x7fffffffLL) return "too many blocks for one launch";
  return nullptr;
}

// Forward: one block per (64 queries, batch * head), key tiles of 64; shared memory holds
// the q tile and double-buffered k and v tiles.
KILN_FLASH_ATTENTION_HD constexpr FlashAttentionLaunch FlashAttentionForwardLaunch(long long batch, long long heads,
                                                                                  long long seq_len,
                                                                                  long long head_dim) {
  FlashAttentionLaunch l;
  l.block_m = 64;
  l.block_n = 64;
  l.block_threads = flash_attention::kBlockThreads;
  l.grid_x = static_cast<unsigned>(seq_len / l.block_m * batch * heads);
  l.shared_bytes = static_cast<unsigned>((l.block_m + 4 * l.block_n) * head_dim * flash_attention::kBf16Bytes);
  return l;
}

// Delta: rows of D split among D / 8 threads (8 elements each), 256 threads per block.
KILN_FLASH_ATTENTION_HD constexpr FlashAttentionLaunch FlashAttentionBackwardDeltaLaunch(long long rows,
                                                                                        long long head_dim) {
  FlashAttentionLaunch l;
  l.block_threads = 256;
  l.block_m = static_cast<int>(l.block_threads / (head_dim / 8));  // rows per block
  l.grid_x = static_cast<unsigned>((rows + l.block_m - 1) / l.block_m);
  l.shared_bytes = 0;
  return l;
}

// dq: one block per (64 queries, batch * head), key tiles of 64 (32 for D > 64, so that q,
// dO and dq of a warp's 16 rows stay in registers); shared memory holds the q and dO tiles
// and double-buffered k and v tiles.
KILN_FLASH_ATTENTION_HD constexpr FlashAttentionLaunch FlashAttentionBackwardDqLaunch(long long batch, long long heads,
                                                                                     long long seq_len,
                                                                                     long long head_dim) {
  FlashAttentionLaunch l;
  l.block_m = 64;
  l.block_n = head_dim <= 64 ? 64 : 32;
  l.block_threads = flash_attention::kBlockThreads;
  l.grid_x = static_cast<unsigned>(seq_len / l.block_m * batch * heads);
  l.shared_bytes = static_cast<unsigned>((2 * l.block_m + 4 * l.block_n) * head_dim * flash_attention::kBf16Bytes);
  return l;
}

// dk/dv: one block per (64 keys, batch * kv head), query tiles of 64 (32 for D > 64);
// shared memory holds the k and v tiles and double-buffered q and dO tiles with the LSE
// and Delta of their rows.
KILN_FLASH_ATTENTION_HD constexpr FlashAttentionLaunch FlashAttentionBackwardDkDvLaunch(long long batch,
                                                                                       long long kv_heads,
                                                                                       long long seq_len,
                                                                                       long long head_dim) {
  FlashAttentionLaunch l;
  l.block_n = 64;
  l.block_m = head_dim <= 64 ? 64 : 32;
  l.block_threads = flash_attention::kBlockThreads;
  l.grid_x = static_cast<unsigned>(seq_len / l.block_n * batch * kv_heads);
  l.shared_bytes = static_cast<unsigned>((2 * l.block_n + 4 * l.block_m) * head_dim * flash_attention::kBf16Bytes +
                                         4 * l.block_m * sizeof(float));
  return l;
}

}  // namespace kiln::kernels

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#include "kernels/common.cuh"

namespace kiln::kernels {

namespace flash_attention {

constexpr int kRowsPerWarp = 16;  // the M of mma.m16n8k16
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int kBatch, int kHeads, int kKvHeads, int kSeqLen, int kHeadDim>
struct Shape {
  static_assert(kBatch > 0 && kHeads > 0 && kKvHeads > 0, "batch and heads must be positive");
  static_assert(kHeads % kKvHeads == 0, "query heads must be a multiple of kv heads (GQA)");
  static_assert(kSeqLen > 0 && kSeqLen % 64 == 0, "T must be a positive multiple of 64 (the tile sizes)");
  static_assert(kHeadDim == 64 || kHeadDim == 128, "D must be 64 or 128");
  static constexpr int kGroup = kHeads / kKvHeads;  // query heads per kv head
};

}  // namespace flash_attention

// The launches above as compile-time constants of one shape, for the kernels (and for a
// wrapper's __launch_bounds__).
template <int kBatch, int kHeads, int kKvHeads, int kSeqLen, int kHeadDim>
struct FlashAttentionForwardConfig {
  using Shape = flash_attention::Shape<kBatch, kHeads, kKvHeads, kSeqLen, kHeadDim>;
  static constexpr FlashAttentionLaunch kLaunch = FlashAttentionForwardLaunch(kBatch, kHeads, kSeqLen, kHeadDim);
  static constexpr int kBlockM = kLaunch.block_m, kBlockN = kLaunch.block_n;
  static constexpr int kQueryBlocks = kSeqLen / kBlockM;
  static constexpr unsigned kGridX = kLaunch.grid_x, kBlockThreads = kLaunch.block_threads,
                            kSharedBytes = kLaunch.shared_bytes;
};

template <long long kRows, int kHeadDim>
struct FlashAttentionBackwardDeltaConfig {
  static_assert(kHeadDim == 64 || kHeadDim == 128, "D must be 64 or 128");
  static constexpr FlashAttentionLaunch kLaunch = FlashAttentionBackwardDeltaLaunch(kRows, kHeadDim);
  static constexpr int kThreadsPerRow = kHeadDim / 8;  // within a warp: xor shuffles below it stay in the row
  static constexpr int kRowsPerBlock = kLaunch.block_m;
  static constexpr unsigned kGridX = kLaunch.grid_x, kBlockThreads = kLaunch.block_threads,
                            kSharedBytes = kLaunch.shared_bytes;
};

template <int kBatch, int kHeads, int kKvHeads, int kSeqLen, int kHeadDim>
struct FlashAttentionBackwardDqConfig {
  using Shape = flash_attention::Shape<kBatch, kHeads, kKvHeads, kSeqLen, kHeadDim>;
  static constexpr FlashAttentionLaunch kLaunch = FlashAttentionBackwardDqLaunch(kBatch, kHeads, kSeqLen, kHeadDim);
  static constexpr int kBlockM = kLaunch.block_m, kBlockN = kLaunch.block_n;
  static constexpr int kQueryBlocks = kSeqLen / kBlockM;
  static constexpr unsigned kGridX = kLaunch.grid_x, kBlockThreads = kLaunch.block_threads,
                            kSharedBytes = kLaunch.shared_bytes;
};

// For D <= 64 each warp also keeps its 16 rows of k and v in registers; above, it reads
// them from shared memory at each use.
template <int kBatch, int kHeads, int kKvHeads, int kSeqLen, int kHeadDim>
struct FlashAttentionBackwardDkDvConfig {
  using Shape = flash_attention::Shape<kBatch, kHeads, kKvHeads, kSeqLen, kHeadDim>;
  static constexpr FlashAttentionLaunch kLaunch =
      FlashAttentionBackwardDkDvLaunch(kBatch, kKvHeads, kSeqLen, kHeadDim);
  static constexpr int kBlockM = kLaunch.block_m, kBlockN = kLaunch.block_n;
  static constexpr bool kKvInRegisters = kHeadDim <= 64;
  static constexpr int kKeyBlocks = kSeqLen / kBlockN;
  static constexpr unsigned kGridX = kLaunch.grid_x, kBlockThreads = kLaunch.block_threads,
                            kSharedBytes = kLaunch.shared_bytes;
};

// ------------------------------------------------------------------- building blocks

namespace flash_attention {

// NVRTC has no <type_traits>.
template <typename A, typename B>
struct IsSame {
  static constexpr bool kValue = false;
};
template <typename A>
struct IsSame<A, A> {
  static constexpr bool kValue = true;
};

// kernels/common.cuh's shared-memory and cp.async primitives, by their names here.
using kernels::CpAsync16;
using kernels::CpAsyncCommit;
using kernels::CpAsyncWaitAll;
using kernels::SharedAddress;

using kernels::LdMatrixX4;
using kernels::LdMatrixX4Trans;
using kernels::Mma;
using kernels::PackBf16;

__device__ __forceinline__ float RoundThroughBf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

using kernels::Swizzle;

// kRows x kD bf16 from global (rows contiguous, kD apart) into a swizzled tile, with
// cp.async by all threads of the block; the caller commits and waits.
template <int kRows, int kD>
__device__ __forceinline__ void LoadTileAsync(__nv_bfloat16* tile, const __nv_bfloat16* src) {
  constexpr int kChunksPerRow = kD / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kBlockThreads == 0, "whole rounds of 16-byte chunks");
#pragma unroll
  for (int round = 0; round < kChunks / kBlockThreads; ++round) {
    const int i = round * kBlockThreads + threadIdx.x;
    const int row = i / kChunksPerRow, col = (i % kChunksPerRow) * 8;
    CpAsync16(tile + Swizzle<kD>(row, col), src + row * kD + col);
  }
}

// The same tile from fp32 (or any dtype): rounded to bf16 on the way, synchronously.
template <int kRows, int kD, typename T>
__device__ __forceinline__ void LoadTileRounded(__nv_bfloat16* tile, const T* src) {
  constexpr int kChunksPerRow = kD / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kBlockThreads == 0, "whole rounds of 16-byte chunks");
#pragma unroll
  for (int round = 0; round < kChunks / kBlockThreads; ++round) {
    const int i = round * kBlockThreads + threadIdx.x;
    const int row = i / kChunksPerRow, col = (i % kChunksPerRow) * 8;
    float values[8];
    LoadFloats(src + row * kD + col, values);
    StoreFloats(tile + Swizzle<kD>(row, col), values);
  }
}

// A tile of bf16 rows: async copy when the source is bf16, rounding copy otherwise.
template <int kRows, int kD, typename T>
__device__ __forceinline__ void LoadTile(__nv_bfloat16* tile, const T* src) {
  if constexpr (IsSame<T, __nv_bfloat16>::kValue) {
    LoadTileAsync<kRows, kD>(tile, src);
  } else {
    LoadTileRounded<kRows, kD>(tile, src);
  }
}

// kFloats floats global -> shared with cp.async (kFloats % 4 == 0), by the first threads.
template <int kFloats>
__device__ __forceinline__ void LoadFloatsAsync(float* dst, const float* src) {
  static_assert(kFloats % 4 == 0 && kFloats / 4 <= kBlockThreads, "one 16-byte chunk per thread at most");
  if (threadIdx.x < kFloats / 4) CpAsync16(dst + threadIdx.x * 4, src + threadIdx.x * 4);
}

// The A fragments (16 rows x kK columns) of rows [row0, row0 + 16) of a swizzled tile.
template <int kK, int kD>
__device__ __forceinline__ void LoadA(unsigned (&a)[kK / 16][4], const __nv_bfloat16* tile, int row0) {
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    LdMatrixX4(a[kk], tile + Swizzle<kD>(row0 + (lane & 15), kk * 16 + (lane >> 4) * 8));
  }
}

// acc (16 x kN) += a (16 x kK) * bᵀ, where b is the kN x kK swizzled tile `tile` (rows
// of b are the columns of the product: k in S = q kᵀ).
template <int kN, int kK>
__device__ __forceinline__ void GemmABt(float (&acc)[kN / 8][4], const unsigned (&a)[kK / 16][4],
                                        const __nv_bfloat16* tile) {
  const int lane = threadIdx.x % kWarpSize;
  const int row_in_pair = (lane & 7) + ((lane >> 4) << 3), col_half = ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
#pragma unroll
    for (int nn = 0; nn < kN / 16; ++nn) {
      unsigned b[4];
      LdMatrixX4(b, tile + Swizzle<kK>(nn * 16 + row_in_pair, kk * 16 + col_half));
      Mma(acc[2 * nn], a[kk], b[0], b[1]);
      Mma(acc[2 * nn + 1], a[kk], b[2], b[3]);
    }
  }
}

// acc (16 x kN) += a (16 x kK) * bᵀ where a is this warp's 16 rows (from `row0`) of the
// swizzled tile `a_tile`: held in `a_regs` when kInRegisters (loaded once by the caller),
// else loaded from shared memory here (a k or v tile of the dk/dv kernel, which keeps them
// in registers only for small head dims).
template <bool kInRegisters, int kN, int kK, int kRegRows>
__device__ __forceinline__ void GemmWarpRowsBt(float (&acc)[kN / 8][4], const unsigned (&a_regs)[kRegRows][4],
                                               const __nv_bfloat16* a_tile, int row0, const __nv_bfloat16* tile) {
  if constexpr (kInRegisters) {
    GemmABt<kN, kK>(acc, a_regs, tile);
  } else {
    unsigned a[kK / 16][4];
    LoadA<kK, kK>(a, a_tile, row0);
    GemmABt<kN, kK>(acc, a, tile);
  }
}

// acc (16 x kN) += a (16 x kK) * b, where b is the kK x kN swizzled tile `tile` (rows of
// b are the reduction index: v in O = P v).
template <int kN, int kK>
__device__ __forceinline__ void GemmAB(float (&acc)[kN / 8][4], const unsigned (&a)[kK / 16][4],
                                       const __nv_bfloat16* tile) {
  const int lane = threadIdx.x % kWarpSize;
  const int row_in_step = (lane & 7) + (((lane >> 3) & 1) << 3), col_half = (lane >> 4) * 8;
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
#pragma unroll
    for (int nn = 0; nn < kN / 16; ++nn) {
      unsigned b[4];
      LdMatrixX4Trans(b, tile + Swizzle<kN>(kk * 16 + row_in_step, nn * 16 + col_half));
      Mma(acc[2 * nn], a[kk], b[0], b[1]);
      Mma(acc[2 * nn + 1], a[kk], b[2], b[3]);
    }
  }
}

// An accumulator (16 x kN, fp32) rounded to bf16 as the A operand of the next product:
// the C fragment of columns [16k, 16k + 16) is exactly the A fragment of reduction step k.
template <int kN>
__device__ __forceinline__ void AccumulatorToA(unsigned (&a)[kN / 16][4], const float (&acc)[kN / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk) {
    a[kk][0] = PackBf16(acc[2 * kk][0], acc[2 * kk][1]);
    a[kk][1] = PackBf16(acc[2 * kk][2], acc[2 * kk][3]);
    a[kk][2] = PackBf16(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
    a[kk][3] = PackBf16(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
  }
}

template <int kN>
__device__ __forceinline__ void Zero(float (&acc)[kN][4]) {
#pragma unroll
  for (int j = 0; j < kN; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
}

// Stores a warp's 16 x kD accumulator at rows [0, 16) of `dst` (rows kD apart), rounded
// once to T. Each quad of lanes writes 8 consecutive elements of a row (32 bytes of fp32).
template <int kD, typename T>
__device__ __forceinline__ void StoreAccumulator(T* dst, const float (&acc)[kD / 8][4]) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = lane >> 2, col = (lane & 3) * 2;
#pragma unroll
  for (int j = 0; j < kD / 8; ++j) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      T* p = dst + (row + half * 8) * kD + j * 8 + col;
      const float x = acc[j][2 * half], y = acc[j][2 * half + 1];
      if constexpr (IsSame<T, float>::kValue) {
        *reinterpret_cast<float2*>(p) = make_float2(x, y);
      } else if constexpr (IsSame<T, __nv_bfloat16>::kValue) {
        *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
      } else {
        p[0] = FromFloat<T>(x);
        p[1] = FromFloat<T>(y);
      }
    }
  }
}

// The block's dynamic shared memory (one declaration for every kernel of this header).
__device__ __forceinline__ __nv_bfloat16* SharedTiles() {
  extern __shared__ __align__(128) unsigned char flash_attention_shared[];
  return reinterpret_cast<__nv_bfloat16*>(flash_attention_shared);
}

// 2^x as one MUFU.EX2 (ex2.approx.ftz: exp2f's 2 ulp, with results below 2^-126 flushed to
// 0). exp2f itself is ex2.approx without .ftz, which ptxas expands into three more
// instructions per call to keep subnormal results: in the attention kernels, whose softmax
// is a large share of their non-tensor-core work, a P under 2^-126 (next to a row max of 1)
// is far below any tolerance its bf16 rounding leaves.
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// P of an S accumulator whose rows are `rows` (per thread: rows r and r + 8 of the warp's
// 16) and columns `cols` : P = exp2(S * scale_log2 - lse2[row]), 0 where key > query.
// Every kernel computes P with this one expression, so forward and backward agree bit for
// bit. `lse2` is LSE * log2(e) of the element's query.
__device__ __forceinline__ float Probability(float s, float scale_log2, float lse2) {
  return Exp2(fmaf(s, scale_log2, -lse2));
}

// 2^e for an integer-valued e <= 0 (or -inf), exactly: the factor that moves a forward's
// running sums from one whole-power-of-two row max to a larger one. Below 2^-126 it is 0
// (the rescaled terms are then under fp32's normal range relative to the new max).
__device__ __forceinline__ float Pow2(float e) {
  return !(e >= -126.f) ? 0.f : __int_as_float((static_cast<int>(e) + 127) << 23);
}

}  // namespace flash_attention

// ------------------------------------------------------------------------------- kernels

// o = attention(q, k, v) and lse (fp32 [B, H, T], natural log), for `scale` (1/sqrt(D)
// in a Llama). Launch: FlashAttentionForwardConfig.
template <typename TO, int kBatch, int kHeads, int kKvHeads, int kSeqLen, int kHeadDim>
__device__ __forceinline__ void FlashAttentionForward(TO* __restrict__ o, float* __restrict__ lse,
                                                      const __nv_bfloat16* __restrict__ q,
                                                      const __nv_bfloat16* __restrict__ k,
                                                      const __nv_bfloat16* __restrict__ v, float scale) {
  namespace fa = flash_attention;
  using Config = FlashAttentionForwardConfig<kBatch, kHeads, kKvHeads, kSeqLen, kHeadDim>;
  constexpr int kM = Config::kBlockM, kN = Config::kBlockN, kD = kHeadDim;
  constexpr int kBH = kBatch * kHeads;

  const int bh = blockIdx.x % kBH;
  const int query_block = Config::kQueryBlocks - 1 - static_cast<int>(blockIdx.x / kBH);  // heaviest first
  const int kv_head = (bh / kHeads) * kKvHeads + (bh % kHeads) / Config::Shape::kGroup;
  const int q0 = query_block * kM;
  const long long row_base = static_cast<long long>(bh) * kSeqLen;  // of q, o, lse
  const __nv_bfloat16* k_head = k + static_cast<long long>(kv_head) * kSeqLen * kD;
  const __nv_bfloat16* v_head = v + static_cast<long long>(kv_head) * kSeqLen * kD;

  __nv_bfloat16* const q_tile = fa::SharedTiles();
  __nv_bfloat16* const k_tiles = q_tile + kM * kD;  // [2][kN][kD]
  __nv_bfloat16* const v_tiles = k_tiles + 2 * kN * kD;

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int warp_row0 = q0 + warp * fa::kRowsPerWarp;
  const int row = warp_row0 + (lane >> 2);  // this thread's rows: row and row + 8
  const int col_in_tile = (lane & 3) * 2;   // and columns col, col + 1 of each 8-wide slice

  // One pass over the key tiles at or before the block's last query. With o null (only
  // the LSE wanted) v is neither loaded nor multiplied.
  const int key_tiles = (q0 + kM + kN - 1) / kN;
  auto issue = [&](int tile) {
    const int buffer = tile & 1;
    fa::LoadTileAsync<kN, kD>(k_tiles + buffer * kN * kD, k_head + static_cast<long long>(tile) * kN * kD);
    if (o != nullptr) {
      fa::LoadTileAsync<kN, kD>(v_tiles + buffer * kN * kD, v_head + static_cast<long long>(tile) * kN * kD);
    }
  };
  fa::LoadTileAsync<kM, kD>(q_tile, q + (row_base + q0) * kD);
  issue(0);
  fa::CpAsyncCommit();

  const float scale_log2 = scale * fa::kLog2e;
  unsigned qa[kD / 16][4];
  float max2[2] = {-CUDART_INF_F, -CUDART_INF_F};  // running row max of S * scale_log2, rounded up to an integer
  float sum[2] = {0.f, 0.f};                      // this thread's part of sum(exp2(S * scale_log2 - max2))
  float acc_o[kD / 8][4];
  fa::Zero(acc_o);

  for (int tile = 0; tile < key_tiles; ++tile) {
    fa::CpAsyncWaitAll();
    __syncthreads();  // tile's k and v landed; every warp is done with the other buffer
    if (tile + 1 < key_tiles) {
      issue(tile + 1);
      fa::CpAsyncCommit();
    }
    if (tile == 0) fa::LoadA<kD, kD>(qa, q_tile, warp * fa::kRowsPerWarp);
    const int k0 = tile * kN;
    if (k0 > warp_row0 + fa::kRowsPerWarp - 1) continue;  // every key after every row of this warp
    const bool masked = k0 + kN - 1 > warp_row0;          // some key after some row

    float acc_s[kN / 8][4];
    fa::Zero(acc_s);
    fa::GemmABt<kN, kD>(acc_s, qa, k_tiles + (tile & 1) * kN * kD);
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc_s[j][e] *= scale_log2;
        if (masked && k0 + j * 8 + col_in_tile + (e & 1) > row + (e >> 1) * 8) acc_s[j][e] = -CUDART_INF_F;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = -CUDART_INF_F;
#pragma unroll
      for (int j = 0; j < kN / 8; ++j) tile_max = fmaxf(tile_max, fmaxf(acc_s[j][2 * r], acc_s[j][2 * r + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      // Tile 0 holds key 0, which every row sees: the max is finite from then on, and a row
      // whose keys in a later tile are all masked keeps it (max with -inf).
      const float new_max2 = fmaxf(max2[r], ceilf(tile_max));
      const float rescale = fa::Pow2(max2[r] - new_max2);
      max2[r] = new_max2;
      float row_sum = sum[r] * rescale;
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        acc_o[j][2 * r] *= rescale;
        acc_o[j][2 * r + 1] *= rescale;
      }
#pragma unroll
      for (int j = 0; j < kN / 8; ++j) {
        acc_s[j][2 * r] = fa::Exp2(acc_s[j][2 * r] - new_max2);
        acc_s[j][2 * r + 1] = fa::Exp2(acc_s[j][2 * r + 1] - new_max2);
        row_sum += acc_s[j][2 * r] + acc_s[j][2 * r + 1];
      }
      sum[r] = row_sum;
    }
    if (o != nullptr) {
      unsigned pa[kN / 16][4];
      fa::AccumulatorToA<kN>(pa, acc_s);
      fa::GemmAB<kD, kN>(acc_o, pa, v_tiles + (tile & 1) * kN * kD);
    }
  }
  // O = (sum_j bf16(exp2(S_ij * scale_log2 - max2)) v_j) / sum_j exp2(S_ij * scale_log2 - max2);
  // LSE = ln(sum_j exp(S_ij)) = (max2 + log2(sum)) * ln 2.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float total = sum[r];
    total += __shfl_xor_sync(0xffffffffu, total, 1);
    total += __shfl_xor_sync(0xffffffffu, total, 2);
    if ((lane & 3) == 0 && lse != nullptr) lse[row_base + row + r * 8] = (max2[r] + log2f(total)) * fa::kLn2;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      acc_o[j][2 * r] /= total;
      acc_o[j][2 * r + 1] /= total;
    }
  }
  if (o != nullptr) fa::StoreAccumulator<kD>(o + (row_base + warp_row0) * kD, acc_o);
}

// delta = rowsum(bf16(dout) * bf16(o)), fp32 [kRows]: the backward's per-row constant, from
// O as a bf16 store of it holds it (the attention_delta op's definition), so an fp32 O and
// the forward's bf16 O give the same Delta. Launch: FlashAttentionBackwardDeltaConfig.
template <typename TDO, typename TO, long long kRows, int kHeadDim>
__device__ __forceinline__ void FlashAttentionBackwardDelta(float* __restrict__ delta, const TDO* __restrict__ dout,
                                                            const TO* __restrict__ o) {
  using Config = FlashAttentionBackwardDeltaConfig<kRows, kHeadDim>;
  constexpr int kThreadsPerRow = Config::kThreadsPerRow;
  const long long row = static_cast<long long>(blockIdx.x) * Config::kRowsPerBlock + threadIdx.x / kThreadsPerRow;
  const int col = (threadIdx.x % kThreadsPerRow) * 8;
  float dos[8], os[8];
  float dot = 0.f;
  if (row < kRows) {
    LoadFloats(dout + row * kHeadDim + col, dos);
    LoadFloats(o + row * kHeadDim + col, os);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      // A bf16 O is already rounded: no conversion round trip for it.
      float ob = os[j];
      if constexpr (!flash_attention::IsSame<TO, __nv_bfloat16>::kValue) ob = flash_attention::RoundThroughBf16(ob);
      dot += flash_attention::RoundThroughBf16(dos[j]) * ob;
    }
  }
  // Groups of kThreadsPerRow aligned lanes: xor masks below kThreadsPerRow stay in a group.
#pragma unroll
  for (int mask = kThreadsPerRow / 2; mask > 0; mask /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, mask);
  if (row < kRows && threadIdx.x % kThreadsPerRow == 0) delta[row] = dot;
}

// dq of attention(q, k, v), given dout, lse (forward) and delta. Launch:
// FlashAttentionBackwardDqConfig.
template <typename TDO, typename TDQ, int kBatch, int kHeads, int kKvHeads, int kSeqLen, int kHeadDim>
__device__ __forceinline__ void FlashAttentionBackwardDq(TDQ* __restrict__ dq, const __nv_bfloat16* __restrict__ q,
                                                         const __nv_bfloat16* __restrict__ k,
                                                         const __nv_bfloat16* __restrict__ v,
                                                         const TDO* __restrict__ dout, const float* __restrict__ lse,
                                                         const float* __restrict__ delta, float scale) {
  namespace fa = flash_attention;
  using Config = FlashAttentionBackwardDqConfig<kBatch, kHeads, kKvHeads, kSeqLen, kHeadDim>;
  constexpr int kM = Config::kBlockM, kN = Config::kBlockN, kD = kHeadDim;
  constexpr int kBH = kBatch * kHeads;

  const int bh = blockIdx.x % kBH;
  const int query_block = Config::kQueryBlocks - 1 - static_cast<int>(blockIdx.x / kBH);  // heaviest first
  const int kv_head = (bh / kHeads) * kKvHeads + (bh % kHeads) / Config::Shape::kGroup;
  const int q0 = query_block * kM;
  const long long row_base = static_cast<long long>(bh) * kSeqLen;
  const __nv_bfloat16* k_head = k + static_cast<long long>(kv_head) * kSeqLen * kD;
  const __nv_bfloat16* v_head = v + static_cast<long long>(kv_head) * kSeqLen * kD;

  __nv_bfloat16* const q_tile = fa::SharedTiles();
  __nv_bfloat16* const do_tile = q_tile + kM * kD;
  __nv_bfloat16* const k_tiles = do_tile + kM * kD;  // [2][kN][kD]
  __nv_bfloat16* const v_tiles = k_tiles + 2 * kN * kD;

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int warp_row0 = q0 + warp * fa::kRowsPerWarp;
  const int row = warp_row0 + (lane >> 2);
  const int col_in_tile = (lane & 3) * 2;

  const int key_tiles = (q0 + kM + kN - 1) / kN;
  auto issue = [&](int tile) {
    const int buffer = tile & 1;
    fa::LoadTileAsync<kN, kD>(k_tiles + buffer * kN * kD, k_head + static_cast<long long>(tile) * kN * kD);
    fa::LoadTileAsync<kN, kD>(v_tiles + buffer * kN * kD, v_head + static_cast<long long>(tile) * kN * kD);
  };
  fa::LoadTileAsync<kM, kD>(q_tile, q + (row_base + q0) * kD);
  fa::LoadTile<kM, kD>(do_tile, dout + (row_base + q0) * kD);
  issue(0);
  fa::CpAsyncCommit();

  const float scale_log2 = scale * fa::kLog2e;
  float lse2[2], row_delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lse2[r] = lse[row_base + row + r * 8] * fa::kLog2e;
    row_delta[r] = delta[row_base + row + r * 8];
  }
  unsigned qa[kD / 16][4], doa[kD / 16][4];
  float acc_dq[kD / 8][4];
  fa::Zero(acc_dq);

  for (int tile = 0; tile < key_tiles; ++tile) {
    fa::CpAsyncWaitAll();
    __syncthreads();
    if (tile + 1 < key_tiles) {
      issue(tile + 1);
      fa::CpAsyncCommit();
    }
    if (tile == 0) {
      fa::LoadA<kD, kD>(qa, q_tile, warp * fa::kRowsPerWarp);
      fa::LoadA<kD, kD>(doa, do_tile, warp * fa::kRowsPerWarp);
    }
    const int k0 = tile * kN;
    if (k0 > warp_row0 + fa::kRowsPerWarp - 1) continue;
    const bool masked = k0 + kN - 1 > warp_row0;
    const __nv_bfloat16* k_tile = k_tiles + (tile & 1) * kN * kD;

    float acc_s[kN / 8][4], acc_dp[kN / 8][4];
    fa::Zero(acc_s);
    fa::Zero(acc_dp);
    fa::GemmABt<kN, kD>(acc_s, qa, k_tile);
    fa::GemmABt<kN, kD>(acc_dp, doa, v_tiles + (tile & 1) * kN * kD);
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        float p = fa::Probability(acc_s[j][e], scale_log2, lse2[r]);
        if (masked && k0 + j * 8 + col_in_tile + (e & 1) > row + r * 8) p = 0.f;
        acc_s[j][e] = p * (acc_dp[j][e] - row_delta[r]) * scale;  // dS
      }
    }
    unsigned dsa[kN / 16][4];
    fa::AccumulatorToA<kN>(dsa, acc_s);
    fa::GemmAB<kD, kN>(acc_dq, dsa, k_tile);
  }
  fa::StoreAccumulator<kD>(dq + (row_base + warp_row0) * kD, acc_dq);
}

// dk and dv of attention(q, k, v), given dout, lse (forward) and delta, each summed over
// the query heads that share the kv head. Launch: FlashAttentionBackwardDkDvConfig.
template <typename TDO, typename TDKV, int kBatch, int kHeads, int kKvHeads, int kSeqLen, int kHeadDim>
__device__ __forceinline__ void FlashAttentionBackwardDkDv(TDKV* __restrict__ dk, TDKV* __restrict__ dv,
                                                           const __nv_bfloat16* __restrict__ q,
                                                           const __nv_bfloat16* __restrict__ k,
                                                           const __nv_bfloat16* __restrict__ v,
                                                           const TDO* __restrict__ dout,
                                                           const float* __restrict__ lse,
                                                           const float* __restrict__ delta, float scale) {
  namespace fa = flash_attention;
  using Config = FlashAttentionBackwardDkDvConfig<kBatch, kHeads, kKvHeads, kSeqLen, kHeadDim>;
  constexpr int kM = Config::kBlockM, kN = Config::kBlockN, kD = kHeadDim;
  constexpr int kBKv = kBatch * kKvHeads;
  constexpr int kGroup = Config::Shape::kGroup;

  const int bkv = blockIdx.x % kBKv;  // batch * kKvHeads + kv head
  const int key_block = static_cast<int>(blockIdx.x / kBKv);  // heaviest (most queries after it) first
  const int batch = bkv / kKvHeads, kv_head = bkv % kKvHeads;
  const int k0 = key_block * kN;
  const long long kv_base = static_cast<long long>(bkv) * kSeqLen;

  __nv_bfloat16* const k_tile = fa::SharedTiles();
  __nv_bfloat16* const v_tile = k_tile + kN * kD;
  __nv_bfloat16* const q_tiles = v_tile + kN * kD;    // [2][kM][kD]
  __nv_bfloat16* const do_tiles = q_tiles + 2 * kM * kD;  // [2][kM][kD]
  float* const lse_tiles = reinterpret_cast<float*>(do_tiles + 2 * kM * kD);  // [2][kM]
  float* const delta_tiles = lse_tiles + 2 * kM;                            // [2][kM]

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int warp_key0 = k0 + warp * fa::kRowsPerWarp;
  const int key = warp_key0 + (lane >> 2);  // this thread's keys: key and key + 8
  const int col_in_tile = (lane & 3) * 2;   // its queries: q0 + 8j + col (+1)

  // Stages: for each query head of the group, the query tiles holding queries >= k0.
  const int first_tile = k0 / kM;
  const int tiles_per_head = kSeqLen / kM - first_tile;
  const int stages = kGroup * tiles_per_head;
  auto issue = [&](int stage) {
    const int head = kv_head * kGroup + stage / tiles_per_head;
    const int q0 = (first_tile + stage % tiles_per_head) * kM;
    const long long row = (static_cast<long long>(batch) * kHeads + head) * kSeqLen + q0;
    const int buffer = stage & 1;
    fa::LoadTileAsync<kM, kD>(q_tiles + buffer * kM * kD, q + row * kD);
    fa::LoadTile<kM, kD>(do_tiles + buffer * kM * kD, dout + row * kD);
    fa::LoadFloatsAsync<kM>(lse_tiles + buffer * kM, lse + row);
    fa::LoadFloatsAsync<kM>(delta_tiles + buffer * kM, delta + row);
  };
  fa::LoadTileAsync<kN, kD>(k_tile, k + (kv_base + k0) * kD);
  fa::LoadTileAsync<kN, kD>(v_tile, v + (kv_base + k0) * kD);
  issue(0);
  fa::CpAsyncCommit();

  const float scale_log2 = scale * fa::kLog2e;
  unsigned ka[Config::kKvInRegisters ? kD / 16 : 1][4], va[Config::kKvInRegisters ? kD / 16 : 1][4];
  float acc_dk[kD / 8][4], acc_dv[kD / 8][4];
  fa::Zero(acc_dk);
  fa::Zero(acc_dv);

  for (int stage = 0; stage < stages; ++stage) {
    fa::CpAsyncWaitAll();
    __syncthreads();
    if (stage + 1 < stages) {
      issue(stage + 1);
      fa::CpAsyncCommit();
    }
    if constexpr (Config::kKvInRegisters) {
      if (stage == 0) {
        fa::LoadA<kD, kD>(ka, k_tile, warp * fa::kRowsPerWarp);
        fa::LoadA<kD, kD>(va, v_tile, warp * fa::kRowsPerWarp);
      }
    }
    const int q0 = (first_tile + stage % tiles_per_head) * kM;
    if (warp_key0 > q0 + kM - 1) continue;  // every key of this warp after every query
    const bool masked = warp_key0 + fa::kRowsPerWarp - 1 > q0;
    const int buffer = stage & 1;
    const __nv_bfloat16* q_tile = q_tiles + buffer * kM * kD;
    const __nv_bfloat16* do_tile = do_tiles + buffer * kM * kD;

    // Sᵀ (16 keys x kM queries) = k qᵀ, and Pᵀ from it.
    float acc_s[kM / 8][4];
    fa::Zero(acc_s);
    fa::GemmWarpRowsBt<Config::kKvInRegisters, kM, kD>(acc_s, ka, k_tile, warp * fa::kRowsPerWarp, q_tile);
#pragma unroll
    for (int j = 0; j < kM / 8; ++j) {
      const float2 lse_pair = *reinterpret_cast<const float2*>(lse_tiles + buffer * kM + j * 8 + col_in_tile);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float lse2 = ((e & 1) ? lse_pair.y : lse_pair.x) * fa::kLog2e;
        float p = fa::Probability(acc_s[j][e], scale_log2, lse2);
        if (masked && key + (e >> 1) * 8 > q0 + j * 8 + col_in_tile + (e & 1)) p = 0.f;
        acc_s[j][e] = p;
      }
    }
    // dv += bf16(Pᵀ) dO.
    unsigned pa[kM / 16][4];
    fa::AccumulatorToA<kM>(pa, acc_s);
    fa::GemmAB<kD, kM>(acc_dv, pa, do_tile);

    // dPᵀ (16 keys x kM queries) = v dOᵀ; dSᵀ = Pᵀ (dPᵀ - Delta) scale; dk += bf16(dSᵀ) q.
    float acc_dp[kM / 8][4];
    fa::Zero(acc_dp);
    fa::GemmWarpRowsBt<Config::kKvInRegisters, kM, kD>(acc_dp, va, v_tile, warp * fa::kRowsPerWarp, do_tile);
#pragma unroll
    for (int j = 0; j < kM / 8; ++j) {
      const float2 delta_pair = *reinterpret_cast<const float2*>(delta_tiles + buffer * kM + j * 8 + col_in_tile);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float d = (e & 1) ? delta_pair.y : delta_pair.x;
        acc_s[j][e] = acc_s[j][e] * (acc_dp[j][e] - d) * scale;
      }
    }
    unsigned dsa[kM / 16][4];
    fa::AccumulatorToA<kM>(dsa, acc_s);
    fa::GemmAB<kD, kM>(acc_dk, dsa, q_tile);
  }
  // attention_grad computes dk and dv as separate nodes: each passes null for the other.
  if (dk != nullptr) fa::StoreAccumulator<kD>(dk + (kv_base + warp_key0) * kD, acc_dk);
  if (dv != nullptr) fa::StoreAccumulator<kD>(dv + (kv_base + warp_key0) * kD, acc_dv);
}

}  // namespace kiln::kernels

#endif  // __CUDACC__ || __CUDACC_RTC__
