// Lowering of the composite ops (rms_norm and its gradients, softmax and its gradient,
// cross_entropy and its gradient, rope, gather, scatter_add, adamw_update, attention and its
// gradient, the fp8 quantize, dequantize and scale update) to instantiations
// of the hand-written templates in kernels/*.cuh, one file per family (codegen/lower_<family>.cc,
// sharing codegen/composite_wrapper.h). Called by LowerNode for these ops only.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "codegen/kernel_spec.h"
#include "codegen/lower_node.h"
#include "ir/graph.h"

namespace kiln {

absl::StatusOr<LoweredNode> LowerCompositeNode(const Node& node, const CodegenOptions& options);

}  // namespace kiln
