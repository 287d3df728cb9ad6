// Result-type inference, one case per op of ir/op_table.h. The builder calls it to type
// new nodes; the verifier calls it to re-check every node of a parsed or loaded module.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ir/attributes.h"
#include "ir/graph.h"
#include "ir/op_table.h"
#include "ir/types.h"

namespace kiln {

// The type of each result of a node of `op` (one for most ops; GetOpInfo(op).num_results).
// `operands` are the operand types as OperandTypes gives them. `declared` is the node's
// written type (for a node of several results, its first result's); it must be given for ops
// whose ResultRule is kDeclared and is ignored otherwise. Errors say what is wrong with the operands or attributes; the caller adds the
// op name, operand types and location.
absl::StatusOr<std::vector<TensorType>> InferResultTypes(Opcode op, absl::Span<const TensorType> operands,
                                                         const AttrMap& attrs, const TensorType* declared);
// InferResultTypes for an op of one result.
absl::StatusOr<TensorType> InferResultType(Opcode op, absl::Span<const TensorType> operands,
                                           const AttrMap& attrs, const TensorType* declared);

// The result types of `node` from its operands' types, its attributes, its written type
// where the op declares it, and, for a fusion, its body (ir/fusion.h). The errors are
// InferResultTypes's (or OperandTypes's), without the node's name.
absl::StatusOr<std::vector<TensorType>> InferNodeResultTypes(const Node& node);

// The operand types inference takes for a node of `op` over `operands`: each operand's type,
// except that get_result takes every result type of its multi-result operand. Fails when a
// multi-result node is used by anything but get_result, or get_result reads a plain node.
absl::StatusOr<std::vector<TensorType>> OperandTypes(Opcode op, absl::Span<Node* const> operands);

// The comparison directions accepted by `compare`.
bool IsCompareDirection(absl::string_view dir);

}  // namespace kiln
