// narrow-activations-bf16: a value whose every consumer rounds it to bf16 is stored bf16 by
// its producer. Four producers can: the GEMM (cuBLASLt accumulates in f32 and can write the
// result as bf16 itself), cross_entropy_grad, paged_attention and attention (their kernels
// compute in f32 and round on store; the decode step's attention output feeds only the o
// projection, as bf16, so its f32 copy and the convert kernel of every layer go; the training
// step's flash attention O feeds the o projection and attention_delta, which rounds O to bf16
// itself, so O is written and read back at half the bytes and the convert goes, as
// FlashAttention and cuDNN store bf16 O). So a gemm whose f32 result is read only by converts to bf16 (an activation about to
// be a GEMM operand, or saved for the backward) writes bf16, a cross_entropy_grad whose f32
// dlogits only feed the LM head's backward GEMMs (as bf16 operands) gets {out_dtype=bf16},
// and the converts go: no f32 copy is written, read back and kept, no convert kernel runs
// (for GPT-2's dlogits [16384, 50304]: 3.07 GiB written and read back, then 1.54 GiB more).
//
// Before:
//   %x = parameter() {index=0} : bf16[16,32]
//   %w = parameter() {index=1} : bf16[64,32]
//   %y = gemm(%x, %w) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=32, m=16, n=64} : f32[16,64]
//   %yb = convert(%y) : bf16[16,64]
//   %z = mul(%yb, %yb) : bf16[16,64]
// After:
//   %y = gemm(%x, %w) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=32, m=16, n=64} : bf16[16,64]
//   %z = mul(%y, %y) : bf16[16,64]
// and
//   %g = cross_entropy_grad(%logits, %labels, %dloss, %lse) : f32[16,64]
//   %gb = convert(%g) : bf16[16,64]
// becomes
//   %g = cross_entropy_grad(%logits, %labels, %dloss, %lse) {out_dtype=bf16} : bf16[16,64]
// and (attention has two results, O and LSE; only O narrows)
//   %o, %o.lse = attention(%q, %k, %v) {scale=0.125} : (f32[1,2,64,64], f32[1,2,64])
//   %t = transpose(%o) {perm=[0,2,1,3]} : f32[1,64,2,64]
//   %r = reshape(%t) : f32[1,64,128]
//   %rb = convert(%r) : bf16[1,64,128]
//   %delta = attention_delta(%o, %dout) : f32[1,2,64]
// becomes
//   %o, %o.lse = attention(%q, %k, %v) {out_dtype=bf16, scale=0.125} : (bf16[1,2,64,64], f32[1,2,64])
//   %t = transpose(%o) {perm=[0,2,1,3]} : bf16[1,64,2,64]
//   %r = reshape(%t) : bf16[1,64,128]
//   %delta = attention_delta(%o, %dout) : f32[1,2,64]
//
// Exact by the gemm's definition (ir/op_table.h): a narrow result is the f32 accumulator
// (after alpha and beta) rounded to the result dtype, which is what cuBLASLt does and what
// the reference backend computes; so bf16(gemm : f32) and gemm : bf16 are the same bits and
// there is no double rounding the pass would add or remove. (Had the reference rounded its
// exact sum straight to bf16, the pass would change values in rare halfway cases, which
// `kiln check` would catch; the definition follows the hardware instead.) Likewise
// cross_entropy_grad {out_dtype} is defined as its f32 gradient rounded once, and
// paged_attention {out_dtype} and attention {out_dtype=bf16} as their f32 O rounded once
// (ir/op_table.h). attention_delta rounds its O to bf16 by definition, so it gives the same
// Delta from the f32 O and from the bf16 one.
//
// A gemm with a bias epilogue narrows too when its bias is a bf16 vector widened to f32 (a
// narrow D takes a bias of its own dtype only, and the widening is exact): GPT-2's qkv and
// MLP projections, autocast's biased linear of a bf16 bias copy (frontends/nn.h Conv1D):
//   %z = gemm(%x, %w, %b32) {epilogue=bias, ...} : f32[16,1024,3072]   %b32 = convert(%b16) : f32[3072]
//   %zb = convert(%z) : bf16[16,1024,3072]
// becomes
//   %z = gemm(%x, %w, %b16) {epilogue=bias, ...} : bf16[16,1024,3072]
//
// Taken: a gemm of bf16 operands, f32 result, beta 0 (C would have to be bf16 too), no FP8
// slots, no bias or a widened bf16 one; a cross_entropy_grad of f32 logits and f32 result,
// without out_dtype (bf16 logits already give a bf16 gradient); a paged_attention or an
// attention of f32 O without out_dtype. Each only when the value is not a function output
// and every use is a convert to bf16, an attention_delta, or a reshape or transpose whose
// every use is (they only move values, so they commute with the rounding and are retyped
// bf16 too: the V projection's [B, T, H, D] -> [B, H, T, D] before attention, the dlogits'
// [B*T, V] -> [B, T, V], attention's [B, H, T, D] -> [B, T, H*D] before the o projection).
// Runs after lower-gemm and elide-grad-zeroing (a gemm that accumulates into a gradient stays
// f32) and before fuse-loops (which would hide the converts inside fusions). Not done yet:
// elementwise producers inside fusions whose every consumer converts to bf16.
#pragma once

#include "absl/status/statusor.h"
#include "passes/pass.h"

namespace kiln {

class NarrowActivationsPass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "narrow-activations-bf16";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;
};

}  // namespace kiln
