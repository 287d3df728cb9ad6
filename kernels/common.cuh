// What every kiln kernel template shares: fp32 loads and one-rounding stores for each float
// dtype, the Packed128 16-byte vector that makes wide loads the default, and deterministic
// warp and block reductions.
//
// Conventions of the templates in kernels/ (codegen/lower_composite.cc instantiates them):
//   - Shapes, dtypes and launch geometry are template parameters; attributes such as eps are
//     arguments of the device function, written as literals by the generated wrapper.
//   - Every value computes in fp32 and rounds once, on store, to the output dtype
//     (ir/numerics.h: nearest-even; fp8 saturates to its largest finite value).
//   - A "chunk" is kVec consecutive elements read or written in whole 16-byte accesses.
//     The wrapper picks kVec > 1 only when every row length involved is a multiple of it;
//     kiln's buffers start 16-byte aligned (the arena aligns every buffer), so every chunk
//     is aligned. kVec == 1 is the scalar path for odd row lengths.
//   - Reductions combine in a fixed order that depends only on the launch geometry, which
//     is compile-time: the same inputs give the same bits on every run.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math_constants.h>  // CUDART_INF_F, CUDART_NAN_F: NVRTC has no <cmath>

namespace kiln::kernels {

constexpr int kWarpSize = 32;

__host__ __device__ constexpr long long CeilDiv(long long a, long long b) { return (a + b - 1) / b; }

// ---------------------------------------------------------------------------------------
// Shared memory and cp.async (sm_80 and later).

__device__ __forceinline__ unsigned SharedAddress(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously (L2 only: tiles are reused across blocks).
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(SharedAddress(smem)), "l"(gmem));
}
// The same, or 16 zero bytes (and no read of gmem) where !valid.
__device__ __forceinline__ void CpAsync16OrZero(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddress(smem)), "l"(gmem),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void CpAsyncWaitAll() { CpAsyncWait<0>(); }

// ---------------------------------------------------------------------------------------
// mbarriers and bulk copies (sm_90): `bar` is the barrier's shared-memory address
// (SharedAddress), 8 bytes, 8-byte aligned.

__device__ __forceinline__ void BarrierInit(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void BarrierArrive(unsigned bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Waits until the barrier's phase of parity `parity` has completed.
__device__ __forceinline__ void BarrierWait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// Makes this thread's generic-proxy writes to shared memory (its completed cp.async copies)
// visible to the async proxy, through which wgmma reads its shared-memory operands.
__device__ __forceinline__ void FenceProxyAsync() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Arrives on the barrier and adds `bytes` to the transaction count its phase waits for (the
// bulk copies that complete on it).
__device__ __forceinline__ void BarrierArriveExpectTx(unsigned bar, unsigned bytes) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(bar),
               "r"(bytes)
               : "memory");
}
// Makes barriers this thread initialized visible to the other threads and to the async proxy.
__device__ __forceinline__ void FenceBarrierInit() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// `bytes` (a multiple of 16; both addresses 16-byte aligned) global -> shared through the
// copy engine (cp.async.bulk, no tensor map), completing `bytes` of the barrier's
// transaction count.
__device__ __forceinline__ void BulkCopyToShared(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// ---------------------------------------------------------------------------------------
// bf16 tensor cores through mma.sync (sm_80 and later): fragments loaded with ldmatrix from
// swizzled shared-memory tiles (flash attention, paged attention).

__device__ __forceinline__ void LdMatrixX4(unsigned (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(smem)));
}
__device__ __forceinline__ void LdMatrixX4Trans(unsigned (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(smem)));
}

// c (16x8, fp32) += a (16x16, bf16, row-major) * b (16x8, bf16, column-major).
__device__ __forceinline__ void Mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded once (nearest-even) to a bf16 pair; `lo` in the low half, which is
// the lower column index in mma fragments.
__device__ __forceinline__ unsigned PackBf16(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&pair);
}

// The element index of (row, col) in a tile whose rows are kD bf16 elements: 16-byte
// chunk c of row r is stored at chunk c ^ (r % 8), so the 8 rows one ldmatrix phase reads
// (consecutive rows, same logical chunk) fall in 8 distinct bank groups.
template <int kD>
__device__ __forceinline__ int Swizzle(int row, int col) {
  return row * kD + ((((col >> 3) ^ row) & 7) | ((col >> 3) & ~7)) * 8 + (col & 7);
}

// ---------------------------------------------------------------------------------------
// Element conversion: storage dtype <-> fp32.

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToFloat(__nv_fp8_e4m3 v) { return static_cast<float>(v); }
__device__ __forceinline__ float ToFloat(__nv_fp8_e5m2 v) { return static_cast<float>(v); }

// Rounds once to nearest-even; the fp8 constructors saturate (__NV_SATFINITE), as
// ir/numerics.h specifies for both fp8 formats.
template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __nv_fp8_e4m3 FromFloat<__nv_fp8_e4m3>(float v) { return __nv_fp8_e4m3(v); }
template <>
__device__ __forceinline__ __nv_fp8_e5m2 FromFloat<__nv_fp8_e5m2>(float v) { return __nv_fp8_e5m2(v); }

// ---------------------------------------------------------------------------------------
// Packed128: 16 bytes of T, loaded and stored as one int4 access.

template <typename T>
struct alignas(16) Packed128 {
  static constexpr int kSize = 16 / sizeof(T);
  T values[kSize];
  __device__ __forceinline__ T& operator[](int i) { return values[i]; }
  __device__ __forceinline__ const T& operator[](int i) const { return values[i]; }
};

template <typename T>
__device__ __forceinline__ Packed128<T> Load128(const T* p) {
  Packed128<T> packed;
  *reinterpret_cast<int4*>(&packed) = *reinterpret_cast<const int4*>(p);
  return packed;
}

template <typename T>
__device__ __forceinline__ void Store128(T* p, const Packed128<T>& packed) {
  *reinterpret_cast<int4*>(p) = *reinterpret_cast<const int4*>(&packed);
}

// griddepcontrol.wait (sm_90 on; nothing before): for a kernel that waits for the kernels ahead
// of it itself, after reading what none of them writes (codegen: KernelSpec::waits_itself).
__device__ __forceinline__ void GridDependencyWait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// 16 bytes at p in a volatile asm statement with a memory clobber, which the compiler keeps
// after GridDependencyWait: a plain load of `const __restrict__` data may become ld.global.nc,
// which the compiler treats as unchanging and may schedule ahead of the wait (architecture.md:
// reading a weight before the wait made A's .nc reads stale). Through L2 (ld.global.cg), or
// with kThroughL1 through L1 as well (ld.global.ca: for data every warp of the SM reads, a
// GEMV's A, which the wait makes as current as a load after a kernel's first instruction is).
template <bool kThroughL1 = false, typename T>
__device__ __forceinline__ Packed128<T> Load128AfterWait(const T* p) {
  int4 v;
  if constexpr (kThroughL1) {
    asm volatile("ld.global.ca.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
  } else {
    asm volatile("ld.global.cg.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
  }
  Packed128<T> packed;
  *reinterpret_cast<int4*>(&packed) = v;
  return packed;
}

// One f32 or 16-bit element, ordered after GridDependencyWait as the loads above.
__device__ __forceinline__ float ToFloatAfterWait(const float* p) {
  float v;
  asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}
template <typename T>
__device__ __forceinline__ float ToFloatAfterWait(const T* p) {
  static_assert(sizeof(T) == 2, "16-bit elements");
  unsigned short bits;
  asm volatile("ld.global.u16 %0, [%1];" : "=h"(bits) : "l"(p) : "memory");
  T v;
  *reinterpret_cast<unsigned short*>(&v) = bits;
  return ToFloat(v);
}

// How a 16-byte load may be cached: as usual, with the evict-first hint (ld.global.cs) for
// data read for the last time, so that it does not push out of L2 what the next kernel reads,
// or kAfterWait (Load128AfterWait) for what the kernels ahead wrote, in a kernel that read
// something before its own GridDependencyWait.
enum class LoadHint { kDefault, kEvictFirst, kAfterWait };

// N consecutive elements at p as floats: whole Packed128 accesses when N > 1 (N * sizeof(T)
// is then a multiple of 16 and p is 16-byte aligned), one scalar access when N == 1.
template <LoadHint kHint = LoadHint::kDefault, int N, typename T>
__device__ __forceinline__ void LoadFloats(const T* p, float (&out)[N]) {
  static_assert(kHint != LoadHint::kAfterWait || N > 1, "ordered loads are 16-byte ones");
  if constexpr (N == 1) {
    out[0] = ToFloat(*p);
  } else {
    constexpr int kPer = Packed128<T>::kSize;
    static_assert(N % kPer == 0, "a chunk must be whole 16-byte accesses of every dtype");
#pragma unroll
    for (int j = 0; j < N; j += kPer) {
      Packed128<T> packed;
      if constexpr (kHint == LoadHint::kEvictFirst) {
        *reinterpret_cast<int4*>(&packed) = __ldcs(reinterpret_cast<const int4*>(p + j));
      } else if constexpr (kHint == LoadHint::kAfterWait) {
        packed = Load128AfterWait(p + j);
      } else {
        packed = Load128(p + j);
      }
#pragma unroll
      for (int k = 0; k < kPer; ++k) out[j + k] = ToFloat(packed[k]);
    }
  }
}

// N floats at p, read through L2 only (ld.global.cg): for data other blocks of this launch
// wrote, which this SM's L1 may hold stale. 16-byte accesses when N > 1 (then N % 4 == 0).
template <int N>
__device__ __forceinline__ void LoadFloatsFromL2(const float* p, float (&out)[N]) {
  if constexpr (N == 1) {
    out[0] = __ldcg(p);
  } else {
    static_assert(N % 4 == 0, "whole float4 accesses");
#pragma unroll
    for (int j = 0; j < N; j += 4) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(p + j));
      out[j] = v.x, out[j + 1] = v.y, out[j + 2] = v.z, out[j + 3] = v.w;
    }
  }
}

// Rounds N floats once to T and stores them at p (same access rules as LoadFloats).
template <int N, typename T>
__device__ __forceinline__ void StoreFloats(T* p, const float (&in)[N]) {
  if constexpr (N == 1) {
    *p = FromFloat<T>(in[0]);
  } else {
    constexpr int kPer = Packed128<T>::kSize;
    static_assert(N % kPer == 0, "a chunk must be whole 16-byte accesses of every dtype");
#pragma unroll
    for (int j = 0; j < N; j += kPer) {
      Packed128<T> packed;
#pragma unroll
      for (int k = 0; k < kPer; ++k) packed[k] = FromFloat<T>(in[j + k]);
      Store128(p + j, packed);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Reductions. Butterfly (xor) shuffles leave the result in every lane; since each combine
// below is commutative bit for bit, all lanes hold identical bits.

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// The running state of a stable log-sum-exp: max of the values seen, and the sum of
// exp(value - max). Two states merge exactly like two halves of one row (online softmax),
// so no exp ever overflows whatever the logits.
struct MaxExpSum {
  float max;
  float sum;
};

struct MaxExpSumOp {
  __device__ __forceinline__ MaxExpSum operator()(MaxExpSum a, MaxExpSum b) const {
    const float max = fmaxf(a.max, b.max);
    // Both sides saw only -inf (masked) values: nothing to rescale. Summing keeps a NaN
    // that a side recorded, so a NaN anywhere in the row still reaches the result.
    if (max == -CUDART_INF_F) return {max, a.sum + b.sum};
    return {max, a.sum * expf(a.max - max) + b.sum * expf(b.max - max)};
  }
};

// The state of N values. -inf values contribute exp(-inf) = 0 explicitly (a chunk that is
// all -inf must not compute exp(-inf - -inf) = NaN); a NaN value makes the sum NaN.
template <int N>
__device__ __forceinline__ MaxExpSum MaxExpSumOf(const float (&v)[N]) {
  float max = -CUDART_INF_F;
#pragma unroll
  for (int j = 0; j < N; ++j) max = fmaxf(max, v[j]);
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < N; ++j) sum += v[j] == -CUDART_INF_F ? 0.f : expf(v[j] - max);
  return {max, sum};
}

__device__ __forceinline__ float ShuffleXor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
__device__ __forceinline__ MaxExpSum ShuffleXor(MaxExpSum v, int mask) {
  return {ShuffleXor(v.max, mask), ShuffleXor(v.sum, mask)};
}

template <typename T, typename Op>
__device__ __forceinline__ T WarpReduce(T v, Op op) {
#pragma unroll
  for (int mask = kWarpSize / 2; mask > 0; mask /= 2) v = op(v, ShuffleXor(v, mask));
  return v;
}

// Every thread of a block of kThreads gets the reduction of all threads' values: warps
// reduce, warp results meet in shared memory, and every warp reduces those alike. Callable
// several times in a row (the leading barrier keeps a call's writes from overtaking the
// previous call's reads). All threads of the block must call it.
template <int kThreads, typename T, typename Op>
__device__ __forceinline__ T BlockReduce(T v, Op op, T identity) {
  static_assert(kThreads % kWarpSize == 0 && kThreads <= 1024, "block of whole warps");
  constexpr int kWarps = kThreads / kWarpSize;
  __shared__ T warp_results[kWarps];
  v = WarpReduce(v, op);
  const int lane = threadIdx.x % kWarpSize;
  __syncthreads();
  if (lane == 0) warp_results[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  return WarpReduce(lane < kWarps ? warp_results[lane] : identity, op);
}

// Reduction over the kThreadsPerRow threads that share a row: a warp (several rows per
// block, no barrier) or the whole block (one row per block).
template <int kThreadsPerRow, typename T, typename Op>
__device__ __forceinline__ T RowReduce(T v, Op op, T identity) {
  if constexpr (kThreadsPerRow == kWarpSize) {
    return WarpReduce(v, op);
  } else {
    return BlockReduce<kThreadsPerRow>(v, op, identity);
  }
}

// Where rows live in a launch: kRowsPerBlock rows of kThreadsPerRow threads each (either a
// warp per row, or one row per block), the row cut into chunks of kVec elements dealt to the
// row's threads round-robin: thread `lane` owns chunks lane, lane + kThreadsPerRow, ...
template <long long kRows, int kLength, int kVec, int kThreadsPerRow, int kRowsPerBlock>
struct RowLayout {
  static_assert(kThreadsPerRow == kWarpSize || kRowsPerBlock == 1, "a row is a warp or a whole block");
  static_assert(kVec == 1 || kLength % kVec == 0, "chunks never straddle a row's end");
  static constexpr int kChunks = static_cast<int>(CeilDiv(kLength, static_cast<long long>(kVec) * kThreadsPerRow));

  // This thread's row; may be >= kRows in the last block of a warp-per-row launch.
  static __device__ __forceinline__ long long Row() {
    return static_cast<long long>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kThreadsPerRow;
  }
  static __device__ __forceinline__ int Lane() { return threadIdx.x % kThreadsPerRow; }
  // First element of this thread's chunk k; the chunk exists when this is < kLength.
  static __device__ __forceinline__ int ChunkStart(int k) { return (k * kThreadsPerRow + Lane()) * kVec; }
  static constexpr int kRowLength = kLength;
  static constexpr int kChunkWidth = kVec;
  static constexpr int kRowThreads = kThreadsPerRow;
};

// This thread's chunks of one row of x, as floats (the row kernels keep them in registers).
// With a residual branch (non-null: the fused residual norms, add_rms_norm and
// add_layer_norm), the row is x + branch, added in fp32 and rounded once to TS as add's own
// kernel would store it, and that sum is stored to `sum_row`: the residual stream is
// written by the kernel that norms it, never written by one kernel and read back by the next.
// The wrappers pass a literal nullptr for a plain norm, so that path compiles away; a null
// `sum_row` with a branch is a sum no one reads (a multi-result node's unneeded result).
template <typename Layout, LoadHint kHint = LoadHint::kDefault, typename TX, typename TB, typename TS>
__device__ __forceinline__ void LoadRowWithResidual(const TX* x_row, const TB* branch_row, TS* sum_row,
                                                    float (&xs)[Layout::kChunks][Layout::kChunkWidth]) {
  constexpr int kVec = Layout::kChunkWidth;
#pragma unroll
  for (int k = 0; k < Layout::kChunks; ++k) {
    const int i = Layout::ChunkStart(k);
    if (i >= Layout::kRowLength) continue;
    LoadFloats<kHint>(x_row + i, xs[k]);
    if (branch_row != nullptr) {
      float bs[kVec];
      LoadFloats<kHint>(branch_row + i, bs);
#pragma unroll
      for (int j = 0; j < kVec; ++j) xs[k][j] = ToFloat(FromFloat<TS>(xs[k][j] + bs[j]));
      if (sum_row != nullptr) StoreFloats(sum_row + i, xs[k]);
    }
  }
}

// The end of a norm input gradient's chunk (rms_norm's and layer_norm's, with or without dw):
// with the residual stream's gradient dres (the fused add_*_norm_grad_input), dx is rounded to
// TDX, added in fp32 and rounded again, as the unfused add of the two stored gradients would;
// then dx is stored (null: unread) and so is its copy for the next GEMM (null: none).
template <int kVec, typename TDX, typename TR, typename TC>
__device__ __forceinline__ void FinishInputGradientChunk(float (&dxs)[kVec], long long offset, TDX* dx, const TR* dres,
                                                         TC* copy) {
  if (dres != nullptr) {
    float rs[kVec];
    LoadFloats(dres + offset, rs);
#pragma unroll
    for (int j = 0; j < kVec; ++j) dxs[j] = ToFloat(FromFloat<TDX>(ToFloat(FromFloat<TDX>(dxs[j])) + rs[j]));
  }
  if (dx != nullptr) StoreFloats(dx + offset, dxs);
  if (copy != nullptr) StoreFloats(copy + offset, dxs);
}

// Stage 2 of the norms' weight gradients: column c of kColumns partial columns is the sum of
// partials[0..kBlocks)[c] (stage 1's), in a fixed order: with kThreads = 32 x kGroups threads,
// lane x owns column blockIdx.x * 32 + x, group y sums blocks y, y + kGroups, ... in order,
// then group 0 sums the group sums in order and calls store(c, total). Launch:
// ceil(kColumns / 32) blocks of kThreads.
template <int kColumns, int kBlocks, int kThreads, typename Store>
__device__ __forceinline__ void FoldColumnPartials(const float* partials, Store store) {
  constexpr int kGroups = kThreads / kWarpSize;
  static_assert(kThreads % kWarpSize == 0, "groups of whole warps");
  const int lane = threadIdx.x % kWarpSize, group = threadIdx.x / kWarpSize;
  const int col = blockIdx.x * kWarpSize + lane;
  float acc = 0.f;
  if (col < kColumns) {
#pragma unroll 8
    for (int b = group; b < kBlocks; b += kGroups) acc += partials[static_cast<long long>(b) * kColumns + col];
  }
  __shared__ float group_sums[kGroups][kWarpSize];
  group_sums[group][lane] = acc;
  __syncthreads();
  if (group != 0 || col >= kColumns) return;
  float total = group_sums[0][lane];
  for (int y = 1; y < kGroups; ++y) total += group_sums[y][lane];
  store(col, total);
}

}  // namespace kiln::kernels
