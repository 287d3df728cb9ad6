// lower-gemm: every dot_general becomes a `gemm`, the backend op that says everything
// cuBLASLt needs (ir/op_table.h): one strided-batched matmul over a [batch, M, K] (or
// [batch, K, M]) a and a [batch, N, K] (or [batch, K, N]) b, each operand's bytes read as
// they lie in memory, written to the dot_general's result shape. An operand whose dims do not
// lie that way (batch dims first in order, free dims adjacent, contracting dims adjacent and
// ordered alike in both operands; dims of size 1 ignored) is first transposed by an explicit
// transpose node, which fusion may then merge into the kernel that produces it. The gemm
// keeps the dot_general's name, so reports and traces still read %name.
//
// Before:
//   %x = parameter() {index=0} : bf16[4,16,32]
//   %w = parameter() {index=1} : bf16[64,32]
//   %y = dot_general(%x, %w) {lhs_batch=[], lhs_contract=[2], out_dtype=f32, rhs_batch=[], rhs_contract=[1]} : f32[4,16,64]
// After:
//   %y = gemm(%x, %w) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=32, m=64, n=64} : f32[4,16,64]
//
// Numerics are the dot_general's: the same products, summed over K in memory order (which is
// the dot_general's listed order whenever its contracting dims are listed as they lie).
//
// fp8 operands: a gemm takes them only with its FP8 slots (ir/op_table.h), so a dot_general of
// f8e4m3/f8e5m2 operands becomes a gemm {scaled=1} whose three scales are one constant 1
// (alpha' = 1 and d_scale 1 change nothing: the same value bit for bit). The pass makes no
// layout for FP8's sake: cuBLASLt on sm_90 runs FP8 only with both operands K-inner (a mk, b
// nk), and a gemm laid out otherwise is refused when it is planned (GemmPlan::CheckSupported);
// the transposed copy belongs in the producer (issue 14's select-fp8-gemm writes it there).
//   %y = dot_general(%x, %w) {...} : bf16[64,48]     (x f8e4m3[64,32], w f8e4m3[48,32])
// ->
//   %y.unit_scale = constant() {value=1.0} : f32[]
//   %y = gemm(%x, %w, %y.unit_scale, %y.unit_scale, %y.unit_scale) {..., scaled=1} : bf16[64,48]
#pragma once

#include "absl/status/statusor.h"
#include "passes/pass.h"

namespace kiln {

class LowerGemmPass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "lower-gemm";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;
};

// How a dot_general maps onto one strided-batched GEMM, and the transposes (if any) that make
// an operand fit. Needs no GPU; InvalidArgument when `dot` is malformed.
struct GemmShape {
  int64_t batch = 1, m = 1, n = 1, k = 1;
  bool a_k_inner = true;  // a (after its permutation, if any) is [batch, M, K]; else [batch, K, M]
  bool b_k_inner = true;  // b is [batch, N, K]; else [batch, K, N]
  // Non-empty: the operand is first transposed with this `perm` (ir/op_table.h).
  std::vector<int64_t> a_permutation, b_permutation;
};
absl::StatusOr<GemmShape> AnalyzeDotGeneral(const Node& dot);

}  // namespace kiln
