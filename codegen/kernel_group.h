// Kernel groups (passes/fusion.h) rendered as one generated kernel each.
//
// A group is its members in definition order, the last being the root: the one member
// used outside the group, and the only one stored. Its inputs are the operands of members
// that are not members, each read straight from memory where the element needs it. The
// kernel walks the root's elements; each member's value is computed at the index its
// consumer needs (a broadcast maps the index to its operand's), rounded to the member's
// dtype exactly as its own kernel would have stored it, so a group computes the same bits
// as its members run one by one:
//
//   extern "C" __global__ void k_y_convert_group(__nv_bfloat16* out, const float* in0, const float* in1) {
//     for (Index i = ...; i < 32; ...) {
//       const float v0 = in0[i];
//       const Index i1 = ((i / 1) % 8) * 1;
//       const float v1 = in1[i1];
//       const float v2 = kiln::Round<float>::From(__fadd_rn(kiln::Load(v0), kiln::Load(v1)));
//       out[i] = kiln::Round<__nv_bfloat16>::From(kiln::Load(v2));
//     }
//   }
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "codegen/kernel_spec.h"
#include "codegen/lower_node.h"
#include "ir/graph.h"

namespace kiln::codegen {

struct KernelGroup {
  const Node* root = nullptr;
  std::vector<const Node*> members;  // definition order; members.back() == root
  std::vector<const Node*> inputs;   // operands from outside, in order of first use
};

// The groups marked in `f`. InvalidArgument when the marks are not a valid grouping: a
// member (other than the root) used outside its group or returned, or a member that cannot
// be computed in a loop kernel.
absl::StatusOr<std::vector<KernelGroup>> FindKernelGroups(const Function& f);

// One kernel computing the group's root; LoweredNode::inputs lists the kernel's operand
// pointers after the output (group.inputs).
absl::StatusOr<LoweredNode> LowerKernelGroup(const KernelGroup& group, const CodegenOptions& options);

}  // namespace kiln::codegen
