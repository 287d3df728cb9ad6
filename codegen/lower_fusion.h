// Fusion nodes (ir/fusion.h) rendered as one generated kernel each.
//
// The kernel walks the fusion's result elements; each body node's value is computed at the
// index its consumer needs (a broadcast maps the index to its operand's), rounded to the
// node's dtype exactly as its own kernel would have stored it, so a fusion computes the same
// bits as its body's ops run one by one. Body parameter i is read from kernel input i (the
// fusion's operand i), straight from memory where an element needs it:
//
//   extern "C" __global__ void k_y_convert_fusion(__nv_bfloat16* out, const float* in0, const float* in1) {
//     for (Index i = ...; i < 32; ...) {
//       const Index i1 = ((i / 1) % 8) * 1;
//       const float v0 = in0[i1];
//       const float v1 = in1[i];
//       const float v2 = kiln::Round<float>::From(__fadd_rn(kiln::Load(v1), kiln::Load(v0)));
//       out[i] = kiln::Round<__nv_bfloat16>::From(kiln::Load(v2));
//     }
//   }
//
// A reduction fusion is the reduction's kernel (codegen/reduction_lowering.cc) reading its
// operand through a functor that computes each element from the fusion's inputs.
#pragma once

#include "absl/status/statusor.h"
#include "codegen/kernel_spec.h"
#include "codegen/lower_node.h"
#include "ir/graph.h"

namespace kiln::codegen {

// The kernel computing `fusion`, whose kernel parameters are its result's buffer, then one
// per operand.
absl::StatusOr<LoweredNode> LowerFusion(const Node& fusion, const CodegenOptions& options);

}  // namespace kiln::codegen
