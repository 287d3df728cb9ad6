// group-optimizer-updates: adamw_update nodes that share their four per-step scalars
// (step_size, decay, sqrt_bc2, grad_scale: the same nodes) and their attributes become one
// grouped adamw_update, one kernel for many parameters, as torch's fused/foreach AdamW does.
// The training step has one update per parameter (passes/training_step.h); most of a model's
// tensors are small (768-element norm weights, 0.6M-element projections), so llama-S's 147
// one-tensor launches spend about twice their bytes' time at bandwidth on launches, partial
// last waves and each kernel's ramp; grouped, the step has three.
//
// Before (two parameters, their updates sharing the scalars; results read by the return):
//   %w1.new, %m.w1.new, %v.w1.new = adamw_update(%w1, %g1, %m.w1, %v.w1, %lr, %decay, %bc2, %scale) {beta1=0.9, beta2=0.95, eps=1e-08} : (f32[64], f32[64], f32[64]) @adamw
//   %w2.new, %m.w2.new, %v.w2.new = adamw_update(%w2, %g2, %m.w2, %v.w2, %lr, %decay, %bc2, %scale) {beta1=0.9, beta2=0.95, eps=1e-08} : (f32[6], f32[6], f32[6]) @adamw
// After (one node, the groups in the order their tensors become ready; each result keeps
// its name, so the step's outputs are the same values, donated to the same parameters):
//   %w1.new, %m.w1.new, %v.w1.new, %w2.new, %m.w2.new, %v.w2.new = adamw_update(%w1, %g1, %m.w1, %v.w1, %w2, %g2, %m.w2, %v.w2, %lr, %decay, %bc2, %scale) {beta1=0.9, beta2=0.95, eps=1e-08} : (f32[64], f32[64], f32[64], f32[6], f32[6], f32[6]) @adamw
//
// Which updates form a group:
//   - the same four scalar operands and the same attributes (decayed and non-decayed weights,
//     whose decay operands differ, stay in separate groups);
//   - in the order they become ready: by the last-defined of each update's own p, g, m, v;
//   - at most kMaxAdamWGroupsPerLaunch per node, so the kernel's parameters (7 pointers per
//     group: p', m', v', p, g, m, v; then the 4 scalars) stay within 4 KiB;
//   - a group is placed just after the last node it needs: every operand of every member and
//     every other reader of a member's p, m or v that came before that member (so the update
//     still runs after them and its results can take those buffers in place), and before the
//     first reader of any member's result; an update that would not fit that window starts
//     the next group.
// One-group (K = 1) nodes are the only candidates: a node the pass made is left as it is, and
// an update alone in its class stays the node it was.
//
// Meaning: group i of the grouped node is computed exactly as the one-group update of its four
// tensors (ir/op_table.h; the same reference function and device loop), so the pass changes
// no arithmetic: the step's results are bit-for-bit the same.
//
// In place: the lowering (codegen/lower_adamw.cc) promises that result 3i+j is computed
// element by element from operand 4i+{0,2,3} (group i's p, m, v) alone, and the buffer plan
// (passes/buffer_plan.h, in_place_operand_of_results) lets that result take exactly that
// operand's buffer, never another group's, which other blocks of the launch still read.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "passes/pass.h"

namespace kiln {

// The bytes of kernel parameters every CUDA version takes (12.1+ take 32764 on Volta and
// later; 4 KiB keeps the kernel portable and its parameters in one constant-bank page).
inline constexpr int64_t kKernelParamBytesLimit = 4096;
// A grouped adamw_update's kernel takes 7 pointers per group (p', m', v', p, g, m, v) and 4
// scalar pointers: (4096 - 4 * 8) / (7 * 8) = 72 groups.
inline constexpr int64_t kAdamWPointersPerGroup = 7;
inline constexpr int64_t kAdamWScalarPointers = 4;
inline constexpr int64_t kMaxAdamWGroupsPerLaunch =
    (kKernelParamBytesLimit - kAdamWScalarPointers * 8) / (kAdamWPointersPerGroup * 8);

class GroupOptimizerUpdatesPass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "group-optimizer-updates";
  // `max_groups` per node: kMaxAdamWGroupsPerLaunch, or fewer (tests).
  explicit GroupOptimizerUpdatesPass(int64_t max_groups = kMaxAdamWGroupsPerLaunch) : max_groups_(max_groups) {}
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;

 private:
  int64_t max_groups_;
};

}  // namespace kiln
