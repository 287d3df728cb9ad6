// A CPU double-precision reference for causal attention under kiln's bf16 precision policy
// (kernels/flash_attention.cuh states the semantics), with a tolerance for every output
// element derived from what the GPU computes differently:
//
//   - fp32 accumulation in another order: each output may differ by a small multiple of
//     the sum of its terms' magnitudes (kAccumulation below);
//   - values rounded to bf16 before a product (P, and dS in the backward): the GPU's
//     pre-rounding value is within a bound `err` of the reference's (its fp32 dot products,
//     exp2 approximation, LSE), so where a rounding boundary lies within `err` of the
//     reference value the GPU may have rounded to the neighbouring bf16 value. Such a
//     product term then differs by that neighbour's distance times the other factor, and
//     the output's tolerance grows by exactly that much. Elsewhere both round identically.
// The tolerances are therefore tight (an output differs only by accumulation order unless
// one of its terms sits at a rounding boundary) and each is stated per element.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::testing {

struct AttentionShape {
  int64_t batch = 1, heads = 1, kv_heads = 1, seq_len = 1, head_dim = 1;
  double scale = 1.0;
  int64_t group() const { return heads / kv_heads; }
  int64_t q_elements() const { return batch * heads * seq_len * head_dim; }
  int64_t kv_elements() const { return batch * kv_heads * seq_len * head_dim; }
  int64_t rows() const { return batch * heads * seq_len; }
};

// A reference value and the largest |gpu - value| to accept, per element.
struct ToleratedValues {
  std::vector<double> value, tolerance;
};

struct AttentionForwardReference {
  ToleratedValues o;    // [B, H, T, D]
  ToleratedValues lse;  // [B, H, T]
};

// q [B, H, T, D], k and v [B, Hkv, T, D]: values already representable in bf16.
// `o_is_bf16`: the kernel rounds O to bf16 on store (its tolerance then allows that rounding).
AttentionForwardReference AttentionForward(const AttentionShape& s, const std::vector<double>& q,
                                           const std::vector<double>& k, const std::vector<double>& v,
                                           bool o_is_bf16);

// How the backward's per-row constant Delta is defined:
//   kFromOutput  rowsum(bf16(dO) * bf16(O)), as the flash kernels compute it (O as given,
//                rounded to bf16: a no-op for a bf16 O)
//   kIr          sum_j dP_ij * P_ij with P in fp32, as the unfused IR's softmax gradient;
//                the tolerance then also covers the kernels' departure from it.
enum class DeltaDefinition { kFromOutput, kIr };

struct AttentionBackwardReference {
  ToleratedValues dq;  // [B, H, T, D]
  ToleratedValues dk;  // [B, Hkv, T, D]
  ToleratedValues dv;  // [B, Hkv, T, D]
};

// dout [B, H, T, D] (rounded to bf16 here, as the kernels and kiln's VJP do); o is the
// forward output the kernels were given (the GPU's), used for Delta in kFromOutput.
AttentionBackwardReference AttentionBackward(const AttentionShape& s, const std::vector<double>& q,
                                             const std::vector<double>& k, const std::vector<double>& v,
                                             const std::vector<double>& dout, const std::vector<double>& o,
                                             DeltaDefinition delta);

}  // namespace kiln::testing
