// The lowerings LowerNode (lower_node.cc) dispatches to, one per op family. Each returns
// a LoweredNode of kind kKernels; shapes and attributes have been checked by the verifier,
// so errors here are only malformed attributes.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codegen/kernel_spec.h"
#include "codegen/lower_node.h"
#include "ir/graph.h"

namespace kiln::codegen {

// leaf_lowering.cc: constant (splat or dense values), iota.
absl::StatusOr<LoweredNode> LowerConstant(const Node& node, const CodegenOptions& options);
absl::StatusOr<LoweredNode> LowerIota(const Node& node, const CodegenOptions& options);
// A splat constant's value as an expression of its storage type, with the exact bits the
// reference rounds it to (f32, bf16, f16, integers, pred).
absl::StatusOr<std::string> SplatStorageExpression(const Node& constant);

// elementwise_lowering.cc: unary, binary, compare, select, convert.
absl::StatusOr<LoweredNode> LowerElementwise(const Node& node, const CodegenOptions& options);
// The value of one element of an elementwise `node` as a C++ expression of its operands'
// storage values, named by `operands` (variables already in registers); the result is in
// the node's storage type, rounded once. Also what fusion kernels (lower_fusion.cc) compose.
absl::StatusOr<std::string> ElementExpression(const Node& node, const std::vector<std::string>& operands);

// data_movement_lowering.cc: broadcast, transpose, slice (strided copies), concatenate.
absl::StatusOr<LoweredNode> LowerStridedCopy(const Node& node, const CodegenOptions& options);
absl::StatusOr<LoweredNode> LowerConcatenate(const Node& node, const CodegenOptions& options);

// reduction_lowering.cc: reduce_sum, reduce_max. With `fused`, the operand is not read from
// a buffer but computed element by element (a reduction fusion).
struct FusedReduceInput {
  std::string kernel_name;
  std::string opening;     // the source's opening (comments, headers, device library)
  std::string definition;  // module-scope code defining GroupInput: operator[](i) and + offset
  std::string params;      // the kernel's parameters after `out`, each with its leading ", "
  std::string construct;   // the kernel's first statement, defining `const GroupInput in`
};
absl::StatusOr<LoweredNode> LowerReduce(const Node& node, const CodegenOptions& options,
                                        const FusedReduceInput* fused = nullptr);

}  // namespace kiln::codegen
