// fuse-residual-norm: a residual add and the norm that reads its sum become one kernel that
// writes both, and a norm's output is written in the dtype its consumers convert it to.
// In the backward, the residual gradient's add folds into the norm's input-gradient kernel,
// which also writes the narrow copy the next GEMMs read, and the norm's weight gradient
// becomes that kernel's last result; layer_norm's decomposed backward becomes one such kernel
// with dw and db. What no longer runs: the add's kernel (and its reading
// h2 back), the converts after the norm and after the gradient, and rms_norm_grad_weight's
// kernel, which read x and dy a second time (its place: a small fold of per-block partial
// rows, kernels/rms_norm.cuh).
//
// Forward, before:
//   %h = parameter() {index=0} : f32[8,64]
//   %branch = parameter() {index=1} : f32[8,64]
//   %w = parameter() {index=2} : f32[64]
//   %h2 = add(%h, %branch) : f32[8,64]
//   %y = rms_norm(%h2, %w) {eps=1e-05} : f32[8,64]
//   %yb = convert(%y) : bf16[8,64]
//   return %h2, %yb
// After:
//   %h2, %y = add_rms_norm(%h, %branch, %w) {eps=1e-05, out_dtype=bf16} : (f32[8,64], bf16[8,64])
//   return %h2, %y
//
// Backward, before (dres the gradient that reached h2 through the residual stream):
//   %gi = rms_norm_grad_input(%x, %w, %dy) {eps=1e-05} : f32[8,64]
//   %dx = add(%dres, %gi) : f32[8,64]
//   %dxb = convert(%dx) : bf16[8,64]
//   return %dx, %dxb
// After:
//   %dx, %dxb = add_rms_norm_grad_input(%dres, %x, %w, %dy) {copy_dtype=bf16, eps=1e-05} : (f32[8,64], bf16[8,64])
//   return %dx, %dxb
//
// The weight gradient, before (the final norm's backward: no residual add):
//   %gi = rms_norm_grad_input(%x, %w, %dy) {eps=1e-05} : f32[8,64]
//   %gw = rms_norm_grad_weight(%x, %w, %dy) {eps=1e-05} : f32[64]
//   return %gi, %gw
// After:
//   %gi, %gw = rms_norm_grad_input(%x, %w, %dy) {eps=1e-05, weight_grad=1} : (f32[8,64], f32[64])
//   return %gi, %gw
// (a layer's: %dx, %dxb, %gw = add_rms_norm_grad_input(...) {copy_dtype=bf16, eps=1e-05,
// weight_grad=1} : (f32[8,64], bf16[8,64], f32[64])).
//
// GPT-2's layer_norm backward, before (LayerNormVjp's decomposition, passes/vjp_rules.cc):
//   %s = reduce_sum(%x) {dims=[1]} : f32[8]
//   %sb = broadcast(%s) {dims=[0]} : f32[8,64]
//   %mean = mul(%sb, %k) : f32[8,64]                          (%k a splat of 1/64)
//   %c = sub(%x, %mean) : f32[8,64]
//   %dc = rms_norm_grad_input(%c, %w, %dy) {eps=1e-05} : f32[8,64]
//   %s2 = reduce_sum(%dc) {dims=[1]} : f32[8]
//   %s2b = broadcast(%s2) {dims=[0]} : f32[8,64]
//   %mean2 = mul(%s2b, %k) : f32[8,64]
//   %dxc = sub(%dc, %mean2) : f32[8,64]
//   %gw = rms_norm_grad_weight(%c, %w, %dy) {eps=1e-05} : f32[64]
//   %db = reduce_sum(%dy) {dims=[0]} : f32[64]
//   %dx = add(%dres, %dxc) : f32[8,64]
//   %dxb = convert(%dx) : bf16[8,64]
//   return %dx, %dxb, %gw, %db
// After:
//   %dx, %dxb, %gw, %db = add_layer_norm_grad_input(%dres, %x, %w, %dy) {copy_dtype=bf16,
//       eps=1e-05, weight_grad=1} : (f32[8,64], bf16[8,64], f32[64], f32[64])
//   return %dx, %dxb, %gw, %db
// (the final norm's, whose dx no add reads: %dxc, %gw, %db = layer_norm_grad_input(...)).
//
// Rewrites (layer_norm and add_layer_norm alike):
//   norm(add(h, b)) -> add_norm(h, b): the sum stays a result, so every other use of h2
//     (the residual stream read by the next layer, or the backward) reads it there;
//   norm(x) whose every use is a convert to one float dtype -> norm(x) {out_dtype}, the
//     converts gone (the first layer's norm, whose x is the embedding, and any norm whose
//     add another pass has taken);
//   add(dres, rms_norm_grad_input(x, w, dy)) (either order) -> add_rms_norm_grad_input,
//     with {copy_dtype} and a second result replacing the add's converts to that dtype when
//     it has some (its other uses read dx);
//   rms_norm_grad_weight(x, w, dy) {eps} beside an input gradient (plain, or the residual
//     form just made) of the same x, w, dy and eps -> that input gradient {weight_grad=1},
//     dw its last result: every norm of llama (the final one too), and GPT-2's layer_norm,
//     whose VJP takes both rms_norm gradients of the centered input. The merged node goes
//     where the earlier of the two was when the input gradient's operands are defined
//     before it, else where the input gradient was when no use of dw comes before that
//     (neither: a residual gradient that depends on dw, left alone);
//   layer_norm's backward as above (before the weight-gradient merge, which would otherwise
//     take its rms_norm gradients) -> layer_norm_grad_input, or add_layer_norm_grad_input
//     with the add's converts as the copy when the centered gradient's one use is a residual
//     add, {weight_grad=1} when both the rms_norm weight gradient of c and the reduce_sum of
//     dy over the rows are there. Matched exactly as LayerNormVjp builds it: the row sums over
//     the last dim, broadcast back over the leading dims, scaled by a splat of exactly 1/D
//     (either operand order), c and every intermediate used only inside the pattern (so all
//     of it goes). The node goes before the first of the values it replaces after which its
//     operands are defined and before which no use of those values comes. One kernel that
//     reads x, w, dy (and dres) once, against the decomposition's six (the row sum of x, the
//     centering fusion, the input gradient of c, the row sum of it, the centering and add
//     fusion, the column reduction of dy): about 225 MB instead of about 600 at gpt2-124M's
//     [16,1024,768].
// Exact but for the layer_norm backward: each other fused op is defined (ir/op_table.h) as
// the ops it replaces with every intermediate rounded as they stored it, and the reference
// backend computes it so; layer_norm_grad_input is the decomposition's value with no
// intermediate rounded to f32 (the centered x, rms_norm's dx of it, the row means), so the
// pass is marked reassociates_f32_sums (passes/pass_registry.h): `kiln check` compares
// through it with f32 values kept in double. The kernels are the same row kernels with
// optional pointers (kernels/rms_norm.cuh, layer_norm.cuh), computing in f32 and rounding
// once per stored value.
//
// Taken only where legal and a win: the add's operands are f32 (the residual stream's
// dtype; the fused kernels keep the sum f32) of the add's shape, and neither is a broadcast
// (one fuse-loops would fold into the add's kernel for free; the fused norm would read it
// materialized); the norm's weight (and bias) is defined before the add, where the fused
// node goes; the input gradient has no use but the add and is no function output (else it
// must be stored anyway).
//
// Runs after autodiff and the training step (its ops have no VJP: they are made from the
// finished step), after elide-grad-zeroing, and before fuse-loops, which would otherwise
// take the adds and converts into loop fusions. After elide-grad-zeroing on purpose: a
// residual add whose branch is a GEMM's sole use is that GEMM's C (beta=1) by then, which
// moves fewer bytes with the same launches: 12 an element besides y (the GEMM reads h as C
// and writes h2, the norm reads h2), against 16 (the GEMM writes the branch, the fused norm
// reads it and h and writes h2); the norm then still writes y narrow. (cuBLASLt with C was
// once measured slower on the H200 (issue 13): if it still is, run this pass before
// elide-grad-zeroing, and the forward adds become add_rms_norm instead.) Not done: an input
// gradient with no residual add whose uses convert it (the final norm's) keeps its convert;
// a layer_norm backward of which only one of dw and db is asked for stays decomposed.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "passes/pass.h"

namespace kiln {

class FuseResidualNormPass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "fuse-residual-norm";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;
};

}  // namespace kiln
