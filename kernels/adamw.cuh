// One AdamW step on f32 master weights and state, as in ir/reference/optimizer_ops.cc:
//   m' = beta1 m + (1 - beta1) g
//   v' = beta2 v + (1 - beta2) g^2
//   p' = p decay - step_size m' / (sqrt(v') / sqrt_bc2 + eps)
// with g scaled by grad_scale (global-norm clipping's factor, or 1) as it is read.
// step_size = lr / (1 - beta1^t), decay = 1 - lr wd (or 1), sqrt_bc2 = sqrt(1 - beta2^t) and
// grad_scale change every step, so they are read from device memory (an f32[] each, computed by the
// step's IR); beta1, beta2, eps and the 1 - beta constants are literals of the wrapper,
// the latter computed in double there. One adamw_update node gives p', m' and v' (its three
// results), written by one kernel in place.
#pragma once

#include "kernels/common.cuh"

namespace kiln::kernels {

// ------------------------------------------------------------------------------- kernels

// p', m' and v' of one AdamW step over kN elements: p, g, m and v are read once per element
// and the three results are written at that same element, so each output may be the very
// buffer of its input (the update runs in place). A null output is not stored. Launch: any
// grid and block size; a grid-stride loop over chunks of kVec elements (kVec = 4, one
// 16-byte access per tensor, needs kN % 4 == 0; kVec = 1 otherwise).
template <long long kN, int kVec>
__device__ __forceinline__ void AdamWUpdate(float* p_out, float* m_out, float* v_out, const float* p,
                                            const float* g, const float* m, const float* v,
                                            const float* step_size, const float* decay, const float* sqrt_bc2,
                                            const float* grad_scale, float beta1, float one_minus_beta1, float beta2, float one_minus_beta2,
                                            float eps) {
  static_assert(kVec == 1 || kVec == Packed128<float>::kSize, "a chunk is one float or one 16-byte access");
  static_assert(kN % kVec == 0, "chunks never straddle the end");
  constexpr long long kChunks = kN / kVec;
  const float lr = *step_size, keep = *decay, bc2 = *sqrt_bc2, scale = *grad_scale;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long chunk = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; chunk < kChunks;
       chunk += stride) {
    const long long first = chunk * kVec;
    float grad[kVec], param[kVec], moment[kVec], second[kVec];
    LoadFloats(g + first, grad);
    LoadFloats(p + first, param);
    LoadFloats(m + first, moment);
    LoadFloats(v + first, second);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      grad[j] = __fmul_rn(grad[j], scale);  // the clipped gradient, rounded as a stored f32
      moment[j] = beta1 * moment[j] + one_minus_beta1 * grad[j];
      second[j] = beta2 * second[j] + one_minus_beta2 * grad[j] * grad[j];
      const float denom = sqrtf(second[j]) / bc2 + eps;
      param[j] = param[j] * keep - lr * moment[j] / denom;
    }
    if (p_out != nullptr) StoreFloats(p_out + first, param);
    if (m_out != nullptr) StoreFloats(m_out + first, moment);
    if (v_out != nullptr) StoreFloats(v_out + first, second);
  }
}

}  // namespace kiln::kernels
