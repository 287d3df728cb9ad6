// fuse-norm-gemm: an rms_norm {out_dtype} read only as the A of one gemm that the backend's
// few-row GEMM kernel takes (BackendCapabilities::NormGemmUnsupportedReason: the decode step's
// projections, m <= 8) becomes one norm_gemm fusion (ir/fusion.h): the GEMM kernel normalizes
// A's rows as it reads them (kernels/gemv.cuh's SmallMGemm::RunNormalized), so the norm is
// neither a launch of its own nor a row stored to be read back. A decode step of llama-M loses
// 32 of its launches (each layer's two norms).
//
// Before:
//   %n = rms_norm(%x, %w) {eps=1e-05, out_dtype=bf16} : bf16[1,1,2048]
//   %y = gemm(%n, %W) {m=1, n=4096, k=2048, ...} : f32[1,1,4096]
// After:
//   %y = fusion(%x, %w, %W) {kind=norm_gemm} : f32[1,1,4096] {
//     %x = parameter() {index=0} ...
//     %n = rms_norm(%x, %w) {eps=1e-05, out_dtype=bf16}
//     %y = gemm(%n, %W) {...}
//   }
//
// Exact: the body holds the very ops it replaced, which the reference backend evaluates as
// before. After fuse-loops (the fusion's operands may be loop fusions' results) and
// fuse-cache-write.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "passes/backend_capabilities.h"
#include "passes/pass.h"
#include "passes/target.h"

namespace kiln {

class FuseNormGemmPass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "fuse-norm-gemm";
  // `capabilities` may be null: nothing is fused.
  FuseNormGemmPass(const BackendCapabilities* capabilities, Target target)
      : capabilities_(capabilities), target_(std::move(target)) {}
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;

 private:
  const BackendCapabilities* capabilities_;
  Target target_;
};

}  // namespace kiln
