// fuse-gemv-glu: the SwiGLU of a decode step's MLP, silu(gate) * up of a few-row gemm's two
// halves, is computed by the GEMV that makes them (kernels/gemv.cuh, SmallMGemm's GLU form): a
// group of warps streams the gate row j and the up row F + j of the joined weight and stores
// silu(g) * u once, so the [M, 2F] gate/up result is never stored and the loop kernel that read
// it back goes (llama-M's decode step: a launch a layer).
//
// Before (after fuse-loops; m at most 8, the rows SmallMGemm takes):
//   %gu = gemm(%x, %w_gate_up) {m=1, n=2F, ...} : bf16[1,1,2F]
//   %h = fusion(%gu) {kind=loop} : bf16[1,1,F] {
//     %g = slice(%gu) [.., 0:F];  %u = slice(%gu) [.., F:2F]
//     %s = sigmoid(%g);  %t = mul(%g, %s);  %h = mul(%t, %u)
//   }
// After:
//   %h = fusion(%x, %w_gate_up) {kind=gemv_glu} : bf16[1,1,F] { the gemm, then the same ops }
//
// Exact: the body holds the very ops it replaced (the reference backend evaluates it as it
// evaluated them), and the kernel rounds where they round (the gemm's D, then each op's
// result). Only this form of the body is matched; any other keeps its two kernels. After
// fuse-loops, whose fusion it extends; cuBLASLt GEMMs (more rows) are left alone.
#pragma once

#include "absl/status/statusor.h"
#include "ir/fusion.h"
#include "ir/graph.h"
#include "passes/pass.h"

namespace kiln {

// Whether a gemm is one SmallMGemm takes, as far as the IR says (codegen/lower_gemv.h decides):
// batch 1, at most 8 rows, a_layout=mk, b_layout=nk, no epilogue, scales or amax, and here
// no C (a GLU's halves are the product alone).
bool IsGluGemmCandidate(const Node& gemm);

class FuseGemvGluPass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "fuse-gemv-glu";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;
};

}  // namespace kiln
