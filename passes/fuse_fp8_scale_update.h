// fuse-fp8-scale-update: delayed scaling's update runs in the kernel that measured the amax.
// The FP8 policy (passes/fp8_policy.h) ends the step with one fp8_scale_update per FP8 tensor,
// each a one-block kernel of a few dozen floats: llama-M's 288 tensors spent 288 launches on
// them. Where a state's update reads the amax of the one quantize that reads that state (one
// micro-batch), the quantize computes the next state itself:
//   %x.fp8, %x.fp8.amax, %x.fp8.scale_inv = fp8_quantize(%x, %fp8.x) {out_dtype=f8e4m3}
//   ...
//   %fp8.x.next = fp8_scale_update(%fp8.x, %x.fp8.amax) {fp8_format=f8e4m3, margin=0}
// becomes
//   %x.fp8, %x.fp8.amax, %x.fp8.scale_inv, %fp8.x.next =
//       fp8_quantize(%x, %fp8.x) {out_dtype=f8e4m3, update_state=1, margin=0}
// The quantize kernel's last block to finish (kernels/fp8.cuh) has the amax once every block
// has read the scale, and writes the next state over the donated state in place.
//
// Meaning: the next state is defined as fp8_scale_update's (ir/op_table.h fp8_quantize with
// update_state=1), so the step's values are bit for bit the same.
// Taken: the update's amax is result 1 of an fp8_quantize of the same state whose out_dtype is
// the update's fp8_format, and no other fp8_quantize reads the state. Several micro-batches'
// quantizes share a state and their update reads the max of their amaxes: those keep the
// update node.
#pragma once

#include "absl/status/statusor.h"
#include "passes/pass.h"

namespace kiln {

class FuseFp8ScaleUpdatePass : public FunctionPass {
 public:
  static constexpr absl::string_view kName = "fuse-fp8-scale-update";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> RunOnFunction(Function& function) override;
};

}  // namespace kiln
