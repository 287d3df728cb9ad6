// Lowering of the composite ops (rms_norm and its gradients, softmax and its gradient,
// cross_entropy and its gradient, rope, gather, scatter_add, adamw_update) to instantiations
// of the hand-written templates in kernels/*.cuh. Called by LowerNode for these ops only.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "codegen/kernel_spec.h"
#include "codegen/lower_node.h"
#include "ir/graph.h"

namespace kiln {

absl::StatusOr<LoweredNode> LowerCompositeNode(const Node& node, const CodegenOptions& options);

// Multi-result ops: the IR gives each node one result, so an op with several (adamw_update's
// param/m/v, attention_grad's k/v) appears as sibling nodes with the same operands and the
// same attributes but `result`; attention_lse(q, k) is likewise the second result of an
// earlier attention(q, k, v). Each set of two or more, in definition order.
std::vector<std::vector<const Node*>> FindResultSiblings(const Function& f);
// One kernel for a set of siblings: the first node's lowering, writing the others' buffers
// as side outputs (LoweredNode::side_outputs).
absl::StatusOr<LoweredNode> LowerResultSiblings(const std::vector<const Node*>& siblings,
                                                const CodegenOptions& options);

}  // namespace kiln
