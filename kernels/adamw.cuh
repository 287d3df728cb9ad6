// One AdamW step on f32 master weights and state, as in ir/reference/optimizer_ops.cc:
//   m' = beta1 m + (1 - beta1) g
//   v' = beta2 v + (1 - beta2) g^2
//   p' = p decay - step_size m' / (sqrt(v') / sqrt_bc2 + eps)
// with g scaled by grad_scale (global-norm clipping's factor, or 1) as it is read.
// step_size = lr / (1 - beta1^t), decay = 1 - lr wd (or 1), sqrt_bc2 = sqrt(1 - beta2^t) and
// grad_scale change every step, so they are read from device memory (an f32[] each, computed by the
// step's IR); beta1, beta2, eps and the 1 - beta constants are literals of the wrapper,
// the latter computed in double there. One adamw_update node gives p', m' and v' (its three
// results), written by one kernel in place; a grouped node (K parameter groups sharing the
// scalars) gives K such triples from one launch, its blocks split among the groups in
// proportion to their sizes (AdamWUpdateGroups), each block running the same loop.
#pragma once

#include "kernels/common.cuh"

namespace kiln::kernels {

// ------------------------------------------------------------------------------- kernels

// The update itself, over chunks first, first + stride, ... below `chunks` of kVec elements
// (the one loop both forms below run): p, g, m and v are read once per element and the three
// results are written at that same element, so each output may be the very buffer of its
// input (the update runs in place). A null output is not stored.
template <int kVec>
__device__ __forceinline__ void AdamWChunks(long long chunks, long long first, long long stride, float* p_out,
                                            float* m_out, float* v_out, const float* p, const float* g,
                                            const float* m, const float* v, float lr, float keep, float bc2,
                                            float scale, float beta1, float one_minus_beta1, float beta2,
                                            float one_minus_beta2, float eps) {
  static_assert(kVec == 1 || kVec == Packed128<float>::kSize, "a chunk is one float or one 16-byte access");
  for (long long chunk = first; chunk < chunks; chunk += stride) {
    const long long at = chunk * kVec;
    float grad[kVec], param[kVec], moment[kVec], second[kVec];
    LoadFloats(g + at, grad);
    LoadFloats(p + at, param);
    LoadFloats(m + at, moment);
    LoadFloats(v + at, second);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      grad[j] = __fmul_rn(grad[j], scale);  // the clipped gradient, rounded as a stored f32
      moment[j] = beta1 * moment[j] + one_minus_beta1 * grad[j];
      second[j] = beta2 * second[j] + one_minus_beta2 * grad[j] * grad[j];
      const float denom = sqrtf(second[j]) / bc2 + eps;
      param[j] = param[j] * keep - lr * moment[j] / denom;
    }
    if (p_out != nullptr) StoreFloats(p_out + at, param);
    if (m_out != nullptr) StoreFloats(m_out + at, moment);
    if (v_out != nullptr) StoreFloats(v_out + at, second);
  }
}

// p', m' and v' of one AdamW step over kN elements. Launch: any grid and block size; a
// grid-stride loop over chunks of kVec elements (kVec = 4, one 16-byte access per tensor,
// needs kN % 4 == 0; kVec = 1 otherwise).
template <long long kN, int kVec>
__device__ __forceinline__ void AdamWUpdate(float* p_out, float* m_out, float* v_out, const float* p,
                                            const float* g, const float* m, const float* v,
                                            const float* step_size, const float* decay, const float* sqrt_bc2,
                                            const float* grad_scale, float beta1, float one_minus_beta1, float beta2, float one_minus_beta2,
                                            float eps) {
  static_assert(kN % kVec == 0, "chunks never straddle the end");
  AdamWChunks<kVec>(kN / kVec, static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x,
                    static_cast<long long>(gridDim.x) * blockDim.x, p_out, m_out, v_out, p, g, m, v, *step_size,
                    *decay, *sqrt_bc2, *grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, eps);
}

// ------------------------------------------------------------- grouped (multi-tensor) form

// One parameter group of a grouped adamw_update (group-optimizer-updates): its seven tensors.
struct AdamWGroupTensors {
  float* p_out;
  float* m_out;
  float* v_out;
  const float* p;
  const float* g;
  const float* m;
  const float* v;
};

// A group's size and its share of the grid: blocks [first_block, next group's first_block).
// The table (in constant memory, written by the generated wrapper: sizes are static) has one
// entry per group and a last one whose first_block is the grid size.
struct AdamWGroupSlice {
  long long n;      // elements
  int vec;          // 4 (16-byte accesses, n % 4 == 0) or 1
  int first_block;
};

// Every group of a grouped update in one launch: block b runs the group whose blocks hold b
// (the last entry of `slices` with first_block <= b; a group of no blocks holds none), a
// grid-stride loop over that group's chunks by that group's blocks alone. `tensors(i)` gives
// group i's pointers (a switch over the kernel's parameters, so no pointer table is copied
// to local memory). Launch: slices[kGroups].first_block blocks of any size; pointers aligned
// to 16 bytes where vec is 4 (every arena buffer is, at 256).
template <int kGroups, typename Tensors>
__device__ __forceinline__ void AdamWUpdateGroups(const AdamWGroupSlice (&slices)[kGroups + 1], Tensors tensors,
                                                  const float* step_size, const float* decay,
                                                  const float* sqrt_bc2, const float* grad_scale, float beta1,
                                                  float one_minus_beta1, float beta2, float one_minus_beta2,
                                                  float eps) {
  const int block = blockIdx.x;
  int lo = 0, hi = kGroups - 1;  // the group whose blocks hold this block
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (slices[mid].first_block <= block) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const AdamWGroupSlice slice = slices[lo];
  const AdamWGroupTensors t = tensors(lo);
  const long long first = static_cast<long long>(block - slice.first_block) * blockDim.x + threadIdx.x;
  const long long stride = static_cast<long long>(slices[lo + 1].first_block - slice.first_block) * blockDim.x;
  const float lr = *step_size, keep = *decay, bc2 = *sqrt_bc2, scale = *grad_scale;
  if (slice.vec == Packed128<float>::kSize) {
    AdamWChunks<Packed128<float>::kSize>(slice.n / Packed128<float>::kSize, first, stride, t.p_out, t.m_out,
                                         t.v_out, t.p, t.g, t.m, t.v, lr, keep, bc2, scale, beta1, one_minus_beta1,
                                         beta2, one_minus_beta2, eps);
  } else {
    AdamWChunks<1>(slice.n, first, stride, t.p_out, t.m_out, t.v_out, t.p, t.g, t.m, t.v, lr, keep, bc2, scale,
                   beta1, one_minus_beta1, beta2, one_minus_beta2, eps);
  }
}

}  // namespace kiln::kernels
