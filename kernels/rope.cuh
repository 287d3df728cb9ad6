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
// rotated value, above f32 tolerances. The double work is amortized: a thread computes its
// cos/sin once for a (b, t, frequency chunk) and applies them to all H heads.
// No cos/sin table is materialized. (Splitting the heads over more threads, 2 of llama-S's 12
// per thread, made the kernel 1.8x slower on the H200: the double pow and sincos, repeated
// per thread, then dominate at FP64's rate.)
#pragma once

#include "kernels/common.cuh"

namespace kiln::kernels {

// ------------------------------------------------------------------------------- kernels

// out = rope(x, positions). Launch: one thread per (b, t, chunk of kVec frequencies):
// grid = ceil(kB * kT * (kD / 2 / kVec) / blockDim.x), any block size. kVec > 1 needs
// (kD / 2) % kVec == 0, so that both halves of a chunk are whole 16-byte accesses.
template <typename TX, typename TY, long long kB, long long kT, int kH, int kD, int kVec, bool kInverse>
__device__ __forceinline__ void Rope(TY* out, const TX* x, const int* positions, double theta) {
  constexpr int kHalf = kD / 2;
  static_assert(kD % 2 == 0 && (kVec == 1 || kHalf % kVec == 0), "chunks never straddle the halves");
  constexpr int kChunksPerHalf = kHalf / kVec;
  const long long item = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= kB * kT * kChunksPerHalf) return;
  const long long bt = item / kChunksPerHalf;  // b * kT + t
  const int first = static_cast<int>(item % kChunksPerHalf) * kVec;
  const double pos = static_cast<double>(positions[bt % kT]);

  float cosines[kVec], sines[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const double freq = pow(theta, -2.0 * static_cast<double>(first + j) / static_cast<double>(kD));
    double s, c;
    sincos((kInverse ? -pos : pos) * freq, &s, &c);
    cosines[j] = static_cast<float>(c);
    sines[j] = static_cast<float>(s);
  }

#pragma unroll 4
  for (int h = 0; h < kH; ++h) {
    const long long base = (bt * kH + h) * kD + first;
    float lo[kVec], hi[kVec], out_lo[kVec], out_hi[kVec];
    LoadFloats(x + base, lo);
    LoadFloats(x + base + kHalf, hi);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      out_lo[j] = lo[j] * cosines[j] - hi[j] * sines[j];
      out_hi[j] = hi[j] * cosines[j] + lo[j] * sines[j];
    }
    StoreFloats(out + base, out_lo);
    StoreFloats(out + base + kHalf, out_hi);
  }
}

}  // namespace kiln::kernels
