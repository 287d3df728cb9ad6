// sum_of_squares(x_0, ..., x_{n-1}): the sum of the squares of every element of every operand,
// f32[], as ir/reference/optimizer_ops.cc defines it (the global gradient norm's square).
//
// Two kernels over one table of chunks, deterministic (no atomics):
//   Partials: one block per chunk of kChunk elements of one operand (the operands' chunks
//             numbered one after the other); the block's sum of squares goes to
//             partials[block].
//   Finish:   one block sums the partials in a fixed order into out[0].
// One launch pair for all of a model's gradients replaces a reduction launch per gradient
// (147 for llama-S, each a few microseconds of fixed cost for a tensor that takes one).
// Operand pointers must be aligned to 16 bytes (every arena buffer is, at 256).
#pragma once

#include "kernels/common.cuh"

namespace kiln::kernels {

// The first chunk of each operand, and the total, for operands of kSizes elements.
template <long long kChunk, long long... kSizes>
struct ChunkTable {
  static constexpr int kCount = sizeof...(kSizes);
  long long size[kCount];
  long long first[kCount + 1];
  __host__ __device__ constexpr ChunkTable() : size{kSizes...}, first{} {
    for (int i = 0; i < kCount; ++i) first[i + 1] = first[i] + (size[i] + kChunk - 1) / kChunk;
  }
};

// The table in constant memory: blocks read entries at a run-time index (a constexpr local
// would be copied to each thread's local memory).
template <long long kChunk, long long... kSizes>
__constant__ ChunkTable<kChunk, kSizes...> kChunkTable{};

// Operand t of the pack (a block picks its operand once: no per-element cost).
template <typename T, typename... P>
__device__ __forceinline__ const T* PickOperand(int t, P... operands) {
  const T* picked = nullptr;
  int i = 0;
  ((picked = (i++ == t) ? operands : picked), ...);
  return picked;
}

template <typename T, int kThreads, long long kChunk, long long... kSizes>
struct SumOfSquares {
  static constexpr int kCount = sizeof...(kSizes);
  // Launch geometry of Partials: one block per chunk.
  static constexpr long long kBlocks = ChunkTable<kChunk, kSizes...>().first[kCount];
  static constexpr int kVec = 16 / sizeof(T);
  static_assert(kChunk % kVec == 0, "chunks start on 16-byte boundaries");

  template <typename... P>
  static __device__ __forceinline__ void Partials(float* partials, P... operands) {
    static_assert(sizeof...(P) == kCount, "one pointer per operand");
    const ChunkTable<kChunk, kSizes...>& table = kChunkTable<kChunk, kSizes...>;
    const long long block = blockIdx.x;
    if (block >= kBlocks) return;
    int lo = 0, hi = kCount - 1;  // the operand whose chunks hold this block
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (table.first[mid] <= block) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const T* x = PickOperand<T>(lo, operands...);
    const long long begin = (block - table.first[lo]) * kChunk;
    const long long end = begin + kChunk < table.size[lo] ? begin + kChunk : table.size[lo];
    const long long vectors = (end - begin) / kVec;
    float sum = 0.f;
    for (long long v = threadIdx.x; v < vectors; v += kThreads) {
      float values[kVec];
      LoadFloats(x + begin + v * kVec, values);
#pragma unroll
      for (int j = 0; j < kVec; ++j) sum = fmaf(values[j], values[j], sum);
    }
    for (long long i = begin + vectors * kVec + threadIdx.x; i < end; i += kThreads) {
      float value[1];
      LoadFloats(x + i, value);
      sum = fmaf(value[0], value[0], sum);
    }
    sum = BlockReduce<kThreads>(sum, SumOp(), 0.f);
    if (threadIdx.x == 0) partials[block] = sum;
  }

  // One block of kThreads: thread i sums partials i, i + kThreads, ... in order.
  static __device__ __forceinline__ void Finish(float* out, const float* partials) {
    float sum = 0.f;
    for (long long b = threadIdx.x; b < kBlocks; b += kThreads) sum += partials[b];
    sum = BlockReduce<kThreads>(sum, SumOp(), 0.f);
    if (threadIdx.x == 0) out[0] = sum;
  }
};

}  // namespace kiln::kernels
