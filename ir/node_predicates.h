// Questions about a single node that several passes ask. Each has one definition here, so
// canonicalize, select-flash-attention and fusion cannot drift apart on what "a splat" is;
// the pattern matcher (ir/pattern_match.h) builds its predicates on them.
#pragma once

#include <optional>

#include "ir/graph.h"

namespace kiln {

// A constant stored as one value, `{value=...}`: it has no dense buffer, so a kernel can
// write the literal instead of reading memory. (A dense constant whose values happen to be
// equal is not one: it is still stored.)
bool IsSplatConstant(const Node& node);

// The value every element of `node` holds, when `node` is a constant whose elements are all
// the same bits (a splat, or dense values that are all equal) or a broadcast, at any depth,
// of such a node. nullopt otherwise. Bits, not numbers: dense [0.0, -0.0] is not a splat.
std::optional<double> SplatValue(const Node& node);

// Whether every element of `node` is exactly `want`, sign of zero included (-0.0 is not
// 0.0; NaN is never matched).
bool IsSplatOf(const Node& node, double want);

// Whether `node` is one of its function's outputs (so it must be stored).
bool IsFunctionOutput(const Node& node);

// The classes of a cross_entropy or cross_entropy_grad: its {classes} attribute, or all
// of the logits' columns without one (shape inference checks the attribute's range).
int64_t CrossEntropyClasses(const Node& node);

// Whether a gemm uses its FP8 slots ({scaled=1} or {amax=1}: ir/op_table.h).
bool HasFp8Slots(const Node& gemm);

}  // namespace kiln
