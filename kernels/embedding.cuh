// Row gather (embedding lookup) and its gradient, scatter-add, along dim 0, as in
// ir/reference/indexing_ops.cc:
//   gather:       out[n, :] = table[idx[n], :]
//   scatter_add:  out = 0; out[idx[n], :] += updates[n, :] for every n with idx[n] in range
// A row is copied in "units", the widest of 16/8/4/2/1 bytes that divides the row's bytes,
// whatever the dtype: a gather moves bytes and never converts.
//
// Out-of-range indices: scatter_add drops them, as the reference does. gather writes a
// zero row for them; the reference reports an error, which a kernel cannot return, and
// reading outside the table would be a memory fault.
//
// scatter_add sums with atomicAdd (16-byte float4 atomics on sm_90 when the row allows), so
// rows with repeated indices sum in a run-dependent order: bit-for-bit results across runs
// would need indices sorted first. Only f32 is supported, which is what the training step's
// embedding gradient uses.
#pragma once

#include "kernels/common.cuh"

namespace kiln::kernels {

// ------------------------------------------------------------------------------- kernels

// out = gather(table, indices). Unit is int4/int2/int/unsigned short/unsigned char. Launch:
// one thread per unit of the output: grid = ceil(kIndices * kRowUnits / blockDim.x).
template <typename Unit, typename TIndex, long long kIndices, long long kTableRows, long long kRowUnits>
__device__ __forceinline__ void Gather(Unit* out, const Unit* table, const TIndex* indices) {
  const long long unit = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (unit >= kIndices * kRowUnits) return;
  const long long n = unit / kRowUnits;
  const long long column = unit % kRowUnits;
  const long long index = static_cast<long long>(indices[n]);
  out[unit] = index >= 0 && index < kTableRows ? table[index * kRowUnits + column] : Unit{};
}

// out[0, kUnits) = 0, for the scatter-add that follows. Launch: one thread per unit.
template <typename Unit, long long kUnits>
__device__ __forceinline__ void ZeroFill(Unit* out) {
  const long long unit = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (unit < kUnits) out[unit] = Unit{};
}

// out[indices[n], :] += updates[n, :], f32, on an out that ZeroFill cleared. kVec is 4 (a
// float4 atomic) when kRowLength % 4 == 0, else 1. Launch: one thread per kVec updates:
// grid = ceil(kIndices * kRowLength / kVec / blockDim.x).
template <typename TIndex, long long kIndices, long long kOutRows, long long kRowLength, int kVec>
__device__ __forceinline__ void ScatterAdd(float* out, const TIndex* indices, const float* updates) {
  static_assert(kVec == 1 || (kVec == 4 && kRowLength % 4 == 0), "float or float4 atomics");
  constexpr long long kChunksPerRow = kRowLength / kVec;
  const long long chunk = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (chunk >= kIndices * kChunksPerRow) return;
  const long long n = chunk / kChunksPerRow;
  const long long index = static_cast<long long>(indices[n]);
  if (index < 0 || index >= kOutRows) return;
  const long long column = (chunk % kChunksPerRow) * kVec;
  float* to = out + index * kRowLength + column;
  const float* from = updates + n * kRowLength + column;
  if constexpr (kVec == 4) {
    atomicAdd(reinterpret_cast<float4*>(to), *reinterpret_cast<const float4*>(from));
  } else {
    atomicAdd(to, *from);
  }
}

}  // namespace kiln::kernels
