// gemm-bias-epilogue: a bias added to a GEMM's rows is added by cuBLASLt's epilogue
// (CUBLASLT_EPILOGUE_BIAS) as it writes D, instead of by a kernel that reads D back, or by a
// broadcast materialized as C. GPT-2's projections (c_attn, c_proj, c_fc) are each one.
//
// Before:
//   %y  = gemm(%x, %w) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=none, k=768, m=16384, n=3072} : f32[16,1024,3072]
//   %bb = broadcast(%b) {dims=[2]} : f32[16,1024,3072]
//   %z  = add(%y, %bb) : f32[16,1024,3072]
// After:
//   %z  = gemm(%x, %w, %b) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=bias, k=768, m=16384, n=3072} : f32[16,1024,3072]
//
// Exact by the gemm's definition (ir/op_table.h): with epilogue=bias, D = f32(D' + f32(b[j]))
// where D' is the gemm's f32 value before rounding to the result dtype, which for an f32
// result is bit for bit add(gemm, broadcast(b)) on f32 values; the reference backend
// computes that, cuBLASLt adds the bias in its f32 epilogue.
//
// Taken: add(gemm, broadcast(b)) in either order where the gemm has f32 result, epilogue
// none, no FP8 slots, is read by the add alone and is not a function output; b is a vector
// [n] of f32 broadcast along the result's last dim (dims=[rank-1]), the result's last dim
// being the gemm's n (so column j of the row-major [batch, M, N] view is element j of b).
// Runs after lower-gemm (it needs gemms) and before elide-grad-zeroing, which would
// otherwise take the add as an accumulation and materialize the broadcast as C.
#pragma once

#include "absl/status/statusor.h"
#include "passes/pass.h"

namespace kiln {

class GemmBiasEpiloguePass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "gemm-bias-epilogue";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;
};

}  // namespace kiln
