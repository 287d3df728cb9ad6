// expand-rope: each rope node becomes the elementwise ops it is (ir/op_table.h): the halves of
// x times slices of one rope_table, broadcast over batch and heads, added and concatenated.
// fuse-loops then puts them in the loop kernel of the ops around them: llama's q and k go
// from the merged q/k/v GEMM's output to attention's [B, H, T, D] layout in one kernel (slice,
// rotation, transpose, convert), and their gradients from attention_grad to the merged
// GEMM's concatenated operand likewise, where the rope kernel stood between a slice copy and
// a transpose copy, each a full pass over q or k (on the H200, llama-S's 16 layers spent
// ~1.2 ms a step in those copies and 0.84 ms in RoPE itself).
//
// Before:
//   %q = rope(%x, %pos) {inverse=0, theta=10000.0} : bf16[B,T,H,D]
// After (half = D/2):
//   %q.table = rope_table(%pos) {head_dim=D, inverse=0, theta=10000.0} : f32[T,D]
//   %q.x = convert(%x) : f32[B,T,H,D]                      (when x is narrower than f32)
//   %q.lo = slice(%q.x) {start=[0,0,0,0], limit=[B,T,H,half], stride=[1,1,1,1]}
//   %q.hi = slice(%q.x) {start=[0,0,0,half], limit=[B,T,H,D], stride=[1,1,1,1]}
//   %q.cos = broadcast(slice(%q.table) [:, 0:half]) {dims=[1,3]} : f32[B,T,H,half]
//   %q.sin = broadcast(slice(%q.table) [:, half:D]) {dims=[1,3]} : f32[B,T,H,half]
//   %q.out_lo = sub(mul(%q.lo, %q.cos), mul(%q.hi, %q.sin))
//   %q.out_hi = add(mul(%q.hi, %q.cos), mul(%q.lo, %q.sin))
//   %q = convert(concatenate(%q.out_lo, %q.out_hi) {dim=3}) : bf16[B,T,H,D]
//
// Exact: rope's meaning is these ops' (f32 cos and sin from double, every product and sum
// rounded to f32, the result rounded once to rope's dtype), on the reference backend as in
// the rope kernel, so `kiln check` proves the pass bit for bit. One table serves every rope
// node of the same positions, theta, head size and direction (the forward's q and k share
// one, the backward's another). A table is T x D f32 (256 KiB for T = 1024, D = 64), computed
// by one small kernel per step.
//
// Runs before fuse-loops, which it feeds, and after narrow-activations-bf16, which has given
// each rope its result dtype.
#pragma once

#include "absl/status/statusor.h"
#include "passes/pass.h"

namespace kiln {

class ExpandRopePass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "expand-rope";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;
};

}  // namespace kiln
