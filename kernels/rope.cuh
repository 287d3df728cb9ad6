// Rotary position embedding on x [B, T, H, D] with positions i32 [T], Hugging Face
// rotate-half convention, as in ir/reference/rope.cc. For i < D/2:
//   freq_i  = theta^(-2i / D)
//   angle   = (inverse ? -pos : pos) * freq_i
//   out[i]       = x[i] * cos(angle) - x[i + D/2] * sin(angle)
//   out[i + D/2] = x[i + D/2] * cos(angle) + x[i] * sin(angle)
//
// Rounding: freq, angle, cos and sin are computed in double, like the reference, then cos
// and sin round to fp32 and the rotation runs in fp32. In fp32 the angle of position 4096
// would carry an error of up to half an ulp of 4096 (2.4e-4 rad), which lands in every
// rotated value, above f32 tolerances.
//
// The double work is what a naive kernel spends its time on (FP64 runs at 1/2 of FP32 on the
// H200 but pow and sincos are long dependent chains), so it is done once per (position,
// frequency): a block owns one position t and a run of batch rows, its first D/2 threads put
// that position's cos and sin in shared memory, and then all its threads rotate every head of
// those rows with them. llama-S's q (B 16, H 12, D 64) computes 32 cos/sin pairs per 12,288
// rotated pairs. (The kernel before this computed them per (b, t, 8 frequencies) and looped
// over the heads in one thread: 64k threads, 1.25 ms for llama-S's 64 RoPE launches; splitting
// its heads over more threads made it 1.8x slower, the double work then repeated per thread.)
#pragma once

#include "kernels/common.cuh"

namespace kiln::kernels {

// ------------------------------------------------------------------------------- kernels

// out = rope(x, positions). Launch: grid = kT * ceil(kB / kBPerBlock) blocks, block b of the grid
// rotating position t = b % kT of batch rows [(b / kT) * kBPerBlock, + kBPerBlock); any block
// size. Within a block, consecutive threads take consecutive kVec-wide chunks of a head's
// halves, so a warp's loads and stores are contiguous runs of whole heads. kVec > 1 needs
// (kD / 2) % kVec == 0, so that both halves of a chunk are whole 16-byte accesses.
template <typename TX, typename TY, long long kB, long long kT, int kH, int kD, int kVec, int kBPerBlock, bool kInverse>
__device__ __forceinline__ void Rope(TY* out, const TX* x, const int* positions, double theta) {
  constexpr int kHalf = kD / 2;
  static_assert(kD % 2 == 0 && (kVec == 1 || kHalf % kVec == 0), "chunks never straddle the halves");
  constexpr int kChunksPerHalf = kHalf / kVec;
  __shared__ float cosines[kHalf];
  __shared__ float sines[kHalf];
  const long long t = blockIdx.x % kT;
  const long long first_row = (blockIdx.x / kT) * kBPerBlock;
  const int rows = static_cast<int>(kB - first_row < kBPerBlock ? kB - first_row : kBPerBlock);
  const double pos = static_cast<double>(positions[t]);
  for (int i = threadIdx.x; i < kHalf; i += blockDim.x) {
    const double freq = pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(kD));
    double s, c;
    sincos((kInverse ? -pos : pos) * freq, &s, &c);
    cosines[i] = static_cast<float>(c);
    sines[i] = static_cast<float>(s);
  }
  __syncthreads();

  const int chunks = rows * kH * kChunksPerHalf;
  for (int item = threadIdx.x; item < chunks; item += blockDim.x) {
    const int first = (item % kChunksPerHalf) * kVec;
    const int row_head = item / kChunksPerHalf;  // local_row * kH + h
    const long long bt = (first_row + row_head / kH) * kT + t;
    const long long base = (bt * kH + row_head % kH) * kD + first;
    float lo[kVec], hi[kVec], out_lo[kVec], out_hi[kVec];
    LoadFloats(x + base, lo);
    LoadFloats(x + base + kHalf, hi);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float c = cosines[first + j], s = sines[first + j];
      // Each product and sum rounded (no contraction into an FMA), as the reference and as
      // expand-rope's mul/sub/add compute it.
      out_lo[j] = __fsub_rn(__fmul_rn(lo[j], c), __fmul_rn(hi[j], s));
      out_hi[j] = __fadd_rn(__fmul_rn(hi[j], c), __fmul_rn(lo[j], s));
    }
    StoreFloats(out + base, out_lo);
    StoreFloats(out + base + kHalf, out_hi);
  }
}

// table = rope_table(positions) [kT, kD]: row t holds the f32 cos of the angles of frequencies
// 0..kD/2-1 at position t, then their sin, computed in double as Rope's. Launch: a thread per
// (t, frequency), grid = ceil(kT * kD / 2 / blockDim.x).
template <long long kT, int kD, bool kInverse>
__device__ __forceinline__ void RopeTable(float* table, const int* positions, double theta) {
  constexpr int kHalf = kD / 2;
  const long long item = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= kT * kHalf) return;
  const long long t = item / kHalf;
  const int i = static_cast<int>(item % kHalf);
  const double pos = static_cast<double>(positions[t]);
  const double freq = pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(kD));
  double s, c;
  sincos((kInverse ? -pos : pos) * freq, &s, &c);
  table[t * kD + i] = static_cast<float>(c);
  table[t * kD + kHalf + i] = static_cast<float>(s);
}

}  // namespace kiln::kernels
