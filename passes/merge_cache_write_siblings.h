// merge-cache-write-siblings: the cache_write fusions and loop fusions that read one value
// become one cache_write fusion of several results, computed by one kernel (horizontal
// fusion): each thread computes an element of one of them. In a decode step these are a
// layer's K write, V write and q RoPE, all three reading the qkv projection; one launch
// instead of three, two fewer kernel boundaries between the projection and the attention on
// the step's critical path at every layer.
//
// Before (after fuse-cache-write):
//   %k_pool1 = fusion(%qkv, %table, %k_pool, %slots) {kind=cache_write} : ... { ...K rope...; kv_cache_write }
//   %v_pool1 = fusion(%qkv, %v_pool, %slots) {kind=cache_write} : ... { ...V slice...; kv_cache_write }
//   %q = fusion(%qkv, %table) {kind=loop} : bf16[B,1,H,D] { ...q rope... }
// After:
//   %k_pool1, %v_pool1, %q = fusion(%qkv, %table, %k_pool, %slots, %v_pool) {kind=cache_write} {
//     ...the three bodies' ops, each parameter once...
//     return %k_write, %v_write, %q
//   }
//
// Exact: the body holds the very ops it replaced. The siblings merge only when none reads
// another's result (directly or through other nodes), no two write one pool, and no sibling
// reads a pool another writes (each write stays in place, passes/buffer_plan.h); the merged
// node stands where the last of them stood. Groups without a cache_write are left alone (a
// training step's loop fusions keep their own kernels). After fuse-cache-write.
#pragma once

#include "absl/status/statusor.h"
#include "passes/pass.h"

namespace kiln {

class MergeCacheWriteSiblingsPass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "merge-cache-write-siblings";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;
};

}  // namespace kiln
