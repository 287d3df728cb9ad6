// select-flash-attention: the decomposed causal attention that frontends/nn.cc builds
//
//   %s  = dot_general(%q, %k) {batch [0,1], contract [3] x [3]} : f32[B,H,T,T]
//   %ss = mul(%s, broadcast(constant scale))
//   %m  = select(broadcast(compare(iota dim 0, iota dim 1, ge)), %ss, broadcast(-inf))
//   %p  = convert(softmax(%m)) : bf16
//   %o  = dot_general(%p, %v) {batch [0,1], contract [3] x [2]} : f32[B,H,T,D]
//
// becomes %o = attention(%q, %k0, %v0) {scale}: one flash kernel (kernels/flash_attention.cuh)
// that never stores the T x T scores, with its own backward (the attention row of
// passes/vjp_rules.cc). A GQA repeat of k and v (broadcast + reshape of [B,Hkv,T,D]) is
// undone: the kernels read each kv head once for its group of query heads.
//
// It runs on the forward function before autodiff (BuildForwardPipeline), so that the
// backward is attention's, not the decomposed pattern's. Meaning: exact in the forward up to
// rounding order (P is bf16(softmax) in both); the backward's Delta is rowsum(bf16(dO) O)
// instead of rowsum(dP P), a difference of bf16 rounding noise of P (ir/op_table.h).
// Shapes the kernels cannot take (head dim not 64 or 128, T not a multiple of 64) are left
// decomposed, and the reason is recorded in `last_decisions()`; so is, for a P·V-shaped GEMM
// that is not the whole pattern, which part of it failed on which node (the pattern matcher's
// explanation, ir/pattern_match.h).
#pragma once

#include <string>
#include <vector>

#include "passes/backend_capabilities.h"
#include "passes/pass.h"
#include "passes/target.h"

namespace kiln {

class SelectFlashAttentionPass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "select-flash-attention";
  // `capabilities` (may be null: nothing is selected) says which shapes `target`'s kernels take.
  SelectFlashAttentionPass(const BackendCapabilities* capabilities, Target target)
      : capabilities_(capabilities), target_(std::move(target)) {}
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;
  // One line per candidate of the last Run (a GEMM shaped like P·V): "%o in @forward:
  // attention, ..." or why not.
  const std::vector<std::string>& last_decisions() const { return decisions_; }

 private:
  void StartRun() override;
  const BackendCapabilities* capabilities_;
  Target target_;
  std::vector<std::string> decisions_;
};

}  // namespace kiln
