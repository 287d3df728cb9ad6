// fuse-norm-between-gemvs: the rms_norm that a decode step applies to the residual stream
// between two GEMVs (the o projection and the gate/up GEMV; the down projection and the next
// layer's qkv, or the LM head) costs no kernel of its own. The GEMV that makes the residual adds
// up the sums of squares of its rows as it stores them, and the GEMV that reads the norm forms
// the norm's rows from the residual, the norm's weight and those sums as it streams its weight
// (kernels/gemv.cuh: SquareSums, SmallMGemm::RunAddingSquares and RunNormedA). llama-M's
// batch-1 step loses 32 of its 33 norm launches (the first layer's follows the embedding).
//
// Why not the two earlier folds (bench/RESULTS.md, sessions 27 and 29): a norm recomputed by
// every block of the reading GEMV cost each block 8 KB of reads and two barriers before its
// first weight byte was used; a norm computed by the last block of the making GEMV cost every
// block a fence and a count, and the step a serial tail. Here the making GEMV only adds its
// columns' squares with fire-and-forget integer atomics (their sum is the same bits in any
// order), and the reading GEMV's grid-dependency wait, which it has anyway, is the only
// synchronisation: it reads the sums (512 bytes a row) where it read the norm.
//
// Before (m at most 8, batch 1: the GEMVs SmallMGemm runs; x f32, the residual stream):
//   %x = gemm(%h, %w_o, %residual) {m=1, beta=1, ...} : f32[1,1,D]
//   %n = rms_norm(%x, %w_norm) {eps=1e-05, out_dtype=bf16} : bf16[1,1,D]
//   %y = fusion(%n, %w_gate_up) {kind=gemv_glu} : bf16[1,1,F] { gemm, SwiGLU }   (or a gemm)
// After:
//   %x, %y = fusion(%h, %w_o, %residual, %w_norm, %w_gate_up) {kind=gemv_norm_gemv} {
//     the gemm, the norm, the second gemm (and its SwiGLU) }
//
// The body holds the very ops it replaced, so the reference backend evaluates it as it
// evaluated them. On the GPU r comes from an integer sum of per-column squares where the norm's
// own kernel added floats in warp order, and the reading GEMV scales its sums by r instead of
// rounding each element of A = x r w to bf16: the result may differ from the unfused kernels'
// by that rounding (within one bf16 ulp of each element of A: tests/gpu_gemv_test.cc).
// Taken where the norm's weight and the second gemm's other operands are function parameters
// (a decode step's weights) and the norm is read by the second gemm alone. After
// fuse-gemv-glu, whose fusions it takes in; prefill's GEMMs (more rows) are left alone.
//
// Off by default (Pass::off_by_default): the pipeline runs it only under `--enable-pass
// fuse-norm-between-gemvs`. Its kernels pass their GPU test, but llama-M's batch-1 step ran
// 1.047 ms with it against 0.829 without (H100, bench/RESULTS.md session 32).
#pragma once

#include "absl/status/statusor.h"
#include "ir/graph.h"
#include "passes/pass.h"

namespace kiln {

class FuseNormBetweenGemvsPass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "fuse-norm-between-gemvs";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;
  // Off: measured 26% slower at batch 1 (above): `--enable-pass fuse-norm-between-gemvs`.
  bool off_by_default() const override { return true; }
};

}  // namespace kiln
