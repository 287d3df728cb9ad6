// select-fp8-gemm: a gemm whose two operands are fp8_dequantize values (the FP8 policy's,
// passes/fp8_policy.h) reads the FP8 values themselves, scaled:
//   %x.fp8, %x.fp8.amax, %x.fp8.scale_inv = fp8_quantize(%x, %fp8.x) {out_dtype=f8e4m3}
//   %x.fp8.dq = fp8_dequantize(%x.fp8, %x.fp8.scale_inv) {out_dtype=bf16} : bf16[512,128]
//   %w.fp8.dq = ...                                                        : bf16[384,128]
//   %y = gemm(%x.fp8.dq, %w.fp8.dq) {a_layout=mk, b_layout=nk, m=512, n=384, k=128, ...} : bf16[512,384]
// becomes
//   %y = gemm(%x.fp8, %w.fp8, %x.fp8.scale_inv, %w.fp8.scale_inv, %one)
//            {a_layout=mk, b_layout=nk, scaled=1, ...} : bf16[512,384]
// cuBLASLt's FP8 GEMM with f32 accumulation; the dequantized bf16 copies are no longer
// written. Exact: the scales are powers of two (ir/fp8_scaling.h), so each product
// (qa 2^-ea)(qb 2^-eb) is qa qb 2^-(ea+eb) and each f32 partial sum is the FP8 GEMM's scaled
// by that power of two: the same bits (ir/op_table.h gemm: alpha' = alpha a_scale b_scale).
//
// Hopper's layout rule: FP8 cuBLASLt on sm_90 takes only TN (both operands K-inner). An
// operand the gemm reads K-outer (a km, b kn: the weight of the input gradient's GEMM, the
// activation and the gradient of the weight gradient's) takes the quantize's transposed copy
// instead ({transposed=1}, written by the same kernel as it reads the tensor: no transpose
// pass); the plan counts its bytes like any buffer's. That needs the copy to be what the
// gemm reads: a K-outer operand's last dim must be the gemm's m (for a) or n (for b).
//
// Taken: batch 1, no FP8 slots yet, both operands fp8_dequantize of fp8_quantize results,
// not e5m2 x e5m2, and a shape, dtypes and epilogue the backend's FP8 GEMM takes on the
// target (BackendCapabilities::Fp8GemmUnsupportedReason: K a multiple of 16, D bf16/f16/f32,
// a bias only for a bf16 D, ...). Anything else keeps its dequantized operands, which
// compute the same values through a bf16 GEMM, and the reason is in last_decisions().
// Runs after lower-gemm, elide-grad-zeroing (an accumulating gemm keeps its C) and
// narrow-activations-bf16 (a gemm whose result is only read as bf16 writes bf16 first).
#pragma once

#include <string>
#include <vector>

#include "passes/backend_capabilities.h"
#include "passes/pass.h"
#include "passes/target.h"

namespace kiln {

class SelectFp8GemmPass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "select-fp8-gemm";
  // `capabilities` may be null: nothing is selected, and the decisions say so.
  SelectFp8GemmPass(const BackendCapabilities* capabilities, Target target)
      : capabilities_(capabilities), target_(std::move(target)) {}
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;
  // One line per candidate gemm of the last Run: what it became, or why not.
  const std::vector<std::string>& last_decisions() const { return decisions_; }

 private:
  void StartRun() override { decisions_.clear(); }
  const BackendCapabilities* capabilities_;
  Target target_;
  std::vector<std::string> decisions_;
};

}  // namespace kiln
