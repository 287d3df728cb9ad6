// fuse-cache-write: a kv_cache_write whose rows come from a loop fusion used by nothing else
// becomes one cache_write fusion (ir/fusion.h): the kernel that computes a layer's new K (rope,
// convert) or V (slice, convert) rows stores each element straight into its paged-pool slot.
// The decode step loses two launches a layer, and the rows are never stored to be copied.
//
// Before:
//   %k = fusion(%qkv, %table) {kind=loop} : bf16[B,Hkv,D] { ...rope of a slice of %qkv... }
//   %pool1 = kv_cache_write(%pool, %k, %slots) {layer=1} : bf16[L,NB,Hkv,BS,D]
// After:
//   %pool1 = fusion(%qkv, %table, %pool, %slots) {kind=cache_write} : bf16[L,NB,Hkv,BS,D] {
//     ...the same rope body...
//     %pool1 = kv_cache_write(%pool.param, %k, %slots.param) {layer=1}
//   }
//
// Exact: the body holds the very ops it replaced (the reference backend evaluates it as it
// evaluated them), and the write is in place as before (the fusion's pool operand is its
// in-place operand, codegen/lower_fusion.cc). After fuse-loops, whose fusions it extends.
#pragma once

#include "absl/status/statusor.h"
#include "passes/pass.h"

namespace kiln {

class FuseCacheWritePass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "fuse-cache-write";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;
};

}  // namespace kiln
