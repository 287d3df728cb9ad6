// fuse-norm-gemv: an rms_norm of at most 8 KB (decode batch 1 and 2 at llama-M's 2048) whose
// one reader is a few-row gemm's A (a decode step's qkv projection or LM head) or a gemv_glu
// fusion's A (its gate/up projection) is computed by that GEMV: every block sums x's rows
// itself and forms A from x and the norm's weight in shared memory before its loop
// (kernels/gemv.cuh, RmsNormA), so the norm's kernel, its store and the GEMV's wait for it
// leave the step (llama-M's decode at batch 1: 33 launches).
//
// Before (after fuse-gemv-glu; m at most 8):
//   %h = rms_norm(%x, %w) {eps=1e-05, out_dtype=bf16} : bf16[1,1,2048]
//   %qkv = gemm(%h, %w_qkv) {m=1, ...} : f32[1,1,4096]
// After:
//   %qkv = fusion(%x, %w, %w_qkv) {kind=gemv_norm} : f32[1,1,4096] {
//     %h = rms_norm(%x.p, %w.p) {...};  %qkv = gemm(%h, %w_qkv.p) {...}
//   }
// and a gemv_glu fusion of the norm becomes a gemv_norm fusion whose body is the norm, the gemm
// and the SwiGLU.
//
// Exact on the reference backend (the body holds the very ops it replaced). On the GPU the
// row's sum of squares is added in the GEMV block's order, not the norm kernel's: the last bits
// of the norm's scale may differ, within the policy's tolerance. After fuse-gemv-glu, whose
// fusion it extends; norms read by more than the one GEMV keep their kernel.
#pragma once

#include "absl/status/statusor.h"
#include "passes/pass.h"

namespace kiln {

class FuseNormGemvPass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "fuse-norm-gemv";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;
};

}  // namespace kiln
