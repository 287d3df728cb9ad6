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
//
// Not done here, and why: the backward's bias gradient from cuBLASLt's
// CUBLASLT_EPILOGUE_BGRADA/BGRADB on the weight-gradient gemm. The layouts would allow it:
// the Conv1D weight gradient is gemm(x, dy') {a_layout=km, b_layout=kn} (dW [in, out] =
// x^T dy', K = the tokens), cuBLAS's A is the IR's b (runtime/cuda/gemm.h), and BGRADA sums
// A over K into a vector of D's rows in the column-major view, which is N = out: db[j] =
// sum over tokens of A[j, t], as wanted; the bias-gradient vector is of D's type (f32 here,
// CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, cublasLt.h). What cuBLASLt cannot give is kiln's
// meaning: under the bf16 policy the gemm's operand dy' is convert(dy) to bf16
// (passes/vjp_rules.cc, DotGeneralVjp: the cotangent is rounded once for the GEMMs), while
// the bias gradient is reduce_sum(dy) of the f32 cotangent (BroadcastVjp), and kiln's policy
// computes reductions in f32 from unrounded values (DESIGN.md, mixed precision). BGRAD*
// reduces the matrix operand as stored, so it would sum bf16-rounded summands: each term
// off by up to 2^-9 relative, which for a gradient whose terms cancel is no bounded relative
// error of the sum at all. Only an f32-policy step has dy' == dy, and there the gemm runs
// CUBLAS_COMPUTE_32F_PEDANTIC, for which the bias-gradient summation order is cuBLASLt's own
// (f32, unspecified), not reduce_sum's (the reference sums in double). So the bias
// gradients stay reduce_sum nodes, and codegen's column reduction
// (codegen/reduction_lowering.cc) makes them run at memory bandwidth instead.
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
