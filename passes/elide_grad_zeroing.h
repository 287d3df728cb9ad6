// elide-grad-zeroing: no gradient is a zeroed buffer plus contributions. The training step
// (passes/training_step.h) already starts each sum at its first contribution; this pass makes
// the sums themselves cuBLASLt's: a contribution computed by a GEMM accumulates into the sum
// so far (beta=1, C = that sum) instead of being written and then added by another kernel,
// and the 1/K scale of --accum K folds into the GEMM's alpha. Across the micro-batches of
// --accum K, micro-batch 0's GEMM overwrites (beta=0) and each later one accumulates.
//
// Before:
//   %g0 = gemm(%x0, %d0) {a_layout=km, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=none, k=16, m=32, n=64} : f32[32,64]
//   %h = constant() {value=0.5} : f32[32,64]
//   %s0 = mul(%g0, %h) : f32[32,64]
//   %g1 = gemm(%x1, %d1) {a_layout=km, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=none, k=16, m=32, n=64} : f32[32,64]
//   %s1 = mul(%g1, %h) : f32[32,64]
//   %sum = add(%s0, %s1) : f32[32,64]
// After:
//   %g0 = gemm(%x0, %d0) {a_layout=km, alpha=0.5, b_layout=kn, batch=1, beta=0.0, epilogue=none, k=16, m=32, n=64} : f32[32,64]
//   %g1 = gemm(%x1, %d1, %g0) {a_layout=km, alpha=0.5, b_layout=kn, batch=1, beta=1.0, epilogue=none, k=16, m=32, n=64} : f32[32,64]
//
// Rewrites, each where the gemm (beta 0, alpha 1 for the first, no FP8 slots) has no other
// use and is no function output:
//   mul(gemm(a, b), splat c)  -> gemm(a, b) {alpha=c}         c a power of two (1/K, K = 2^n)
//   add(gemm(a, b), x)        -> gemm(a, b, x) {beta=1}       x of the add's type
// Exact by the gemm's definition (ir/op_table.h), cuBLASLt's f32 epilogue with each step
// rounded to f32: t = f32(alpha acc), D = f32(t + f32(beta C)); so alpha=c is mul(gemm, c)
// and beta=1 with C = x is add(gemm, x), bit for bit. (With the exact sum rounded once, as
// the reference had it, neither would be.) c is kept to powers of two so that cuBLASLt's
// fused alpha acc + C (one fma) agrees too: c acc is then exact.
//
// Zeroed sums this pass does not remove: add(splat +0.0, g) is not g where g is -0.0, and
// canonicalize already removes x + -0.0. CountZeroInitialisedAccumulators counts what is left
// for `kiln compile --report` and `kiln train --report`. C lives in its own buffer today: the
// memory plan (passes/buffer_plan.h) does not yet let a gemm's D take C's bytes in place.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "passes/pass.h"

namespace kiln {

class ElideGradZeroingPass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "elide-grad-zeroing";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;
};

// Sums that start from zero in `module` (fusion bodies included): adds of a value that is 0
// (+0.0 or -0.0) everywhere, and gemms with beta != 0 whose C is such a value.
int64_t CountZeroInitialisedAccumulators(const Module& module);

}  // namespace kiln
