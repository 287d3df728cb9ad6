// The table of vector-Jacobian product (VJP) rules, one row per op of ir/op_table.h.
// passes/autodiff.cc walks a function backwards and calls the row of each node on the way;
// a rule only builds nodes, it never decides what is differentiated.
//
// Conventions every rule follows:
//   - a multi-result node's rule receives one cotangent per result (get_result nodes have
//     no rule of their own: their cotangents are their node's);
//   - the cotangent it receives is typed like its node (except for `convert`, which sees the
//     cotangent as accumulated: an f32 cotangent of a bf16 autocast copy stays f32, so the
//     convert back to the f32 master weight is a no-op);
//   - it returns one entry per operand: the contribution to that operand's cotangent, with
//     the operand's dims, or nullptr for "none" (an unwanted, integer or pred operand, or an
//     operand the result does not depend on). A contribution may be wider than the operand
//     (dot_general of bf16 operands gives f32 contributions); the caller accumulates in the
//     widest float type and narrows only when a gradient leaves the backward pass.
//   - non-differentiable ops (parameter, constant, iota, compare, adamw_update: an optimizer
//     step is applied to gradients, never differentiated) have a row whose rule returns no
//     contributions, so "every op has a row" is a complete check.
// Ties: max/min send the cotangent to the first operand where a == b; reduce_max sends the
// full cotangent to every element equal to the maximum (not split).
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "ir/builder.h"
#include "ir/graph.h"

namespace kiln {

struct VjpArgs {
  Builder* builder;          // appends to the node's function, already in the node's scope
  Node* node;                // the forward node
  Node* cotangent;           // dL/d(node); for a multi-result node, dL/d(result 0) or null
  std::vector<bool> wanted;  // wanted[i]: operand i needs a contribution
  // One per result of the node, each typed like its result, null where that result has no
  // cotangent (at least one has). For a single-result node, {cotangent}.
  std::vector<Node*> cotangents;
};

using VjpRule = absl::StatusOr<std::vector<Node*>> (*)(const VjpArgs&);

enum class CotangentType {
  kNodeType,       // converted to the node's dtype before the rule runs
  kAsAccumulated,  // passed as accumulated (possibly wider); only `convert` uses this
};

struct VjpRow {
  Opcode op;
  VjpRule rule;
  CotangentType cotangent_type;
};

// The row for `op`, or nullptr when the table has none.
const VjpRow* FindVjpRow(Opcode op);

}  // namespace kiln
