// fuse-gemv-norm: the rms_norm of a few-row gemm's result (a decode step's residual stream
// after the o and down projections, normalized for the next projection) is computed by the
// GEMV that makes it (kernels/gemv.cuh, SmallMGemm::RunWithNorm): its last block to finish
// normalizes the rows the blocks stored, so the norm's own launch, and the boundary between
// it and the GEMV, go (llama-M's decode step: two launches a layer).
//
// Before (m at most 8, the rows SmallMGemm takes; D f32, the residual stream):
//   %h = gemm(%x, %w_o, %residual) {m=1, beta=1, ...} : f32[1,1,D]
//   %n = rms_norm(%h, %w_norm) {eps=1e-05, out_dtype=bf16} : bf16[1,1,D]
// After:
//   %h, %n = fusion(%x, %w_o, %residual, %w_norm) {kind=gemv_norm} { the gemm, the norm }
//
// Exact: the body holds the very ops it replaced (the reference backend evaluates it as it
// evaluated them), and the kernel rounds where they round (the gemm's D, then the norm's
// x r w to its out_dtype). Only a norm whose weight is a function parameter is taken (the
// fusion's operand). After fuse-gemv-glu; prefill's GEMMs (more rows) are left alone.
#pragma once

#include "absl/status/statusor.h"
#include "ir/graph.h"
#include "passes/pass.h"

namespace kiln {

class FuseGemvNormPass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "fuse-gemv-norm";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;
};

}  // namespace kiln
