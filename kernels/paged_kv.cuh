// The paged KV cache on the device (DESIGN.md, "The inference lowering"): kv_cache_write
// stores token rows into pool slots, paged_attention reads K and V back through block
// tables. The pool is [L, NB, Hkv, BS, D] (layers, blocks, kv heads, block size, head dim);
// a flat slot s is offset s % BS of block s / BS. Semantics as in ir/op_table.h and
// ir/reference/paged_kv_ops.cc.
//
// These are the straightforward kernels (correct, deterministic, not yet fast): a thread
// per element for the writes, and one warp per (query, head) for attention, walking the
// keys one at a time with the dot product spread over the lanes. Attention makes two passes
// over the keys (online max and sum, then the normalized probabilities), so that P is
// rounded to the pool's dtype after normalization, as the reference rounds it; neither the
// scores nor P are ever stored.
#pragma once

#include "kernels/common.cuh"

namespace kiln::kernels {

// ------------------------------------------------------------------------------- kernels

// out = pool, element by element; nothing when out is pool (the result written in place).
// Launch: any grid of any block size (grid-stride).
template <typename TP, long long kN>
__device__ __forceinline__ void PoolCopy(TP* out, const TP* pool) {
  if (out == pool) return;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < kN; i += stride) {
    out[i] = pool[i];
  }
}

// out[layer, s / BS, h, s % BS, :] = x[i, h, :] for each row i with s = slots[i] in [0,
// NB * BS) (-1, padding, and anything out of range write nothing). Launch: one thread per
// element of x: grid = ceil(kRows * kHkv * kD / blockDim.x).
template <typename TX, typename TP, long long kRows, int kLayer, long long kBlocks, int kHkv, int kBs, int kD>
__device__ __forceinline__ void KvCacheWrite(TP* out, const TX* x, const int* slots) {
  const long long item = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= kRows * kHkv * kD) return;
  const long long row = item / (kHkv * kD);
  const int h = static_cast<int>(item / kD % kHkv);
  const int d = static_cast<int>(item % kD);
  const long long slot = slots[row];
  if (slot < 0 || slot >= kBlocks * kBs) return;
  const long long block = slot / kBs;
  const int offset = static_cast<int>(slot % kBs);
  const long long at = (((static_cast<long long>(kLayer) * kBlocks + block) * kHkv + h) * kBs + offset) * kD + d;
  out[at] = FromFloat<TP>(ToFloat(x[item]));
}

// Attention of each query q[b, t, h, :] over keys 0..positions[b, t] read through
// block_tables[b, :]; out f32 [B, T, H, D]; a negative position writes zeros. Launch: one
// warp per (b, t, h): grid = kB * kT * kH blocks of 32 threads. Lane l holds dims l, l + 32,
// ... of the query and of the output accumulator.
template <typename TP, long long kB, long long kT, int kH, int kD, int kLayer, long long kBlocks, int kHkv, int kBs,
          int kMaxBlocks>
__device__ __forceinline__ void PagedAttention(float* out, const TP* q, const TP* k_pool, const TP* v_pool,
                                               const int* block_tables, const int* positions, float scale) {
  constexpr int kPerLane = (kD + kWarpSize - 1) / kWarpSize;
  constexpr int kGroup = kH / kHkv;
  const long long item = blockIdx.x;  // (b * kT + t) * kH + h
  if (item >= kB * kT * kH) return;
  const int lane = threadIdx.x % kWarpSize;
  const int h = static_cast<int>(item % kH);
  const long long bt = item / kH;
  const long long b = bt / kT;
  const int position = positions[bt];
  float* o = out + item * kD;
  if (position < 0) {
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      if (d < kD) o[d] = 0.0f;
    }
    return;
  }
  float qv[kPerLane];
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + i * kWarpSize;
    qv[i] = d < kD ? ToFloat(q[item * kD + d]) : 0.0f;
  }
  const int* table = block_tables + b * kMaxBlocks;
  const int head = h / kGroup;
  const int keys = min(position + 1, kMaxBlocks * kBs);
  auto key_row = [&](int j) -> long long {
    const long long block = table[j / kBs];
    return (((static_cast<long long>(kLayer) * kBlocks + block) * kHkv + head) * kBs + j % kBs) * kD;
  };
  auto score = [&](long long row) -> float {
    float partial = 0.0f;
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      if (d < kD) partial += qv[i] * ToFloat(k_pool[row + d]);
    }
    return WarpReduce(partial, SumOp{}) * scale;
  };
  // Pass 1: the row's max and sum of exp, online.
  MaxExpSum state{-CUDART_INF_F, 0.0f};
  for (int j = 0; j < keys; ++j) state = MaxExpSumOp{}(state, MaxExpSum{score(key_row(j)), 1.0f});
  // Pass 2: P rounded to the pool's dtype, times V, accumulated in f32.
  float acc[kPerLane];
  for (int i = 0; i < kPerLane; ++i) acc[i] = 0.0f;
  for (int j = 0; j < keys; ++j) {
    const long long row = key_row(j);
    const float p = ToFloat(FromFloat<TP>(expf(score(row) - state.max) / state.sum));
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      if (d < kD) acc[i] += p * ToFloat(v_pool[row + d]);
    }
  }
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + i * kWarpSize;
    if (d < kD) o[d] = acc[i];
  }
}

}  // namespace kiln::kernels
