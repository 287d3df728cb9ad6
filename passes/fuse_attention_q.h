// fuse-attention-q: a paged_attention whose q comes from a loop fusion read by nothing else (a
// decode or prefill layer's RoPE of its slice of the q/k/v projection) becomes one
// attention_q fusion (ir/fusion.h): the attention kernel computes each q element from the
// projection and the rope table as it loads it, and the q rows are never stored. A layer
// loses a launch.
//
// Before:
//   %q = fusion(%qkv, %table) {kind=loop} : bf16[B,1,H,D] { ...rope of a slice of %qkv... }
//   %o = paged_attention(%q, %k_pool, %v_pool, %tables, %positions) {layer=1, ...}
// After:
//   %o = fusion(%qkv, %table, %k_pool, %v_pool, %tables, %positions) {kind=attention_q} {
//     ...the same rope body...
//     %o = paged_attention(%q, %k_pool.param, %v_pool.param, %tables.param, %positions.param)
//   }
//
// Exact: the body holds the very ops it replaced, and the kernel computes q's elements as the
// loop fusion's kernel did (codegen's GroupEmitter), rounded to q's dtype before the
// attention reads them. After fuse-cache-write, whose pools the attention reads.
#pragma once

#include "absl/status/statusor.h"
#include "passes/pass.h"

namespace kiln {

class FuseAttentionQPass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "fuse-attention-q";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;
};

}  // namespace kiln
