// Rebuilding an fp8_quantize with more results: select-fp8-gemm adds the transposed copy
// ({transposed=1}), fuse-fp8-scale-update the next state ({update_state=1}). Both keep every
// result the node had, by role (ir/fp8_scaling.h Fp8QuantizeResults: q, amax, scale_inv, q_t,
// next_state), and its names.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "ir/attributes.h"
#include "ir/graph.h"

namespace kiln {

// Replaces `quantize` (an fp8_quantize of `f`) by one of `attrs`, placed where it was, whose
// results are a superset of its results: each old result's uses move to the new result of the
// same role, which takes its name. A result the old node lacked is named after q (`<q>.t`,
// `<q>.next_state`, made unique). Returns the new node's get_result nodes in result order.
absl::StatusOr<std::vector<Node*>> RebuildFp8Quantize(Function& f, Node* quantize, AttrMap attrs);

}  // namespace kiln
