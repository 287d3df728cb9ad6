// Reverse-mode automatic differentiation: appends a backward pass to a function, using the
// VJP rule of each op (passes/vjp_rules.h).
//
// Before (differentiating the loss %l with respect to %x and %w):
//   %x = parameter() {index=0} : f32[4]
//   %w = parameter() {index=1} : f32[4]
//   %y = mul(%x, %w) : f32[4] @layers.0
//   %l = reduce_sum(%y) {dims=[0]} : f32[] @head
//   return %l
// After AppendBackward(f, %l, {%x, %w}), which returns {%6, %7} (tests/autodiff_test.cc):
//   ...
//   %l.grad = constant() {value=1.0} : f32[] @head
//   %5 = broadcast(%l.grad) {dims=[]} : f32[4] @head
//   %6 = mul(%5, %w) : f32[4] @layers.0
//   %7 = mul(%5, %x) : f32[4] @layers.0
//   return %l
//
// Only nodes on a path from some wrt node to the loss are differentiated. A node used more
// than once accumulates its cotangent contributions by adding, in the widest float type
// among them (an autocast GEMM hands its bf16 operands f32 cotangents, which stay f32 through
// the convert back to the f32 master weight). Integer and pred values carry no cotangent.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ir/graph.h"

namespace kiln {

// Appends, inside `f`, the nodes computing d(loss)/d(wrt[i]) for a scalar f32 `loss` node of
// `f` (seeded with 1). Returns one gradient node per wrt entry, typed like that node (a zero
// constant when the loss does not depend on it). Backward nodes of a forward node in scope S
// get scope S; a gradient built by accumulation is named "<name>.grad". The function's
// outputs are left as they were. Errors (nothing is appended then): a loss that is not an
// f32[] node of `f`, a wrt entry that is not a float node of `f`.
absl::StatusOr<std::vector<Node*>> AppendBackward(Function& f, Node* loss, absl::Span<Node* const> wrt);

// A new function `name` in `m`: a copy of `forward` (same parameters, names, ids and scopes)
// returning (loss, d loss / d parameter p for each p in wrt_params), where the loss is
// forward's output number `loss_output`. Forward outputs other than the loss are not
// returned (their nodes stay until dead-code elimination). `m` is unchanged on error.
absl::StatusOr<Function*> BuildGradientFunction(Module& m, const Function& forward, int loss_output,
                                                absl::Span<const int64_t> wrt_params, std::string name);

// Whether the op has a VJP rule, counting ops declared non-differentiable (parameter,
// constant, iota, compare) as having one. tests/autodiff_fd_test.cc requires it of every op.
bool HasVjpRule(Opcode op);

}  // namespace kiln
