// The CPU reference backend: evaluates any kiln IR function on host tensors, with the
// semantics written at the top of ir/op_table.h. It is the oracle that passes (before vs
// after, DESIGN.md principle 3) and GPU kernels are checked against.
//
// Numerics: each op computes in double from its operands as stored (already rounded to
// their dtypes) and rounds its result to the result dtype (ir/numerics.h). So a
// dot_general of bf16 operands with f32 out is the exact product of the rounded operands,
// accumulated in double and rounded once to f32: what the GPU is asked to compute, up to
// accumulation order. max/min/reduce_max propagate NaN. Integer div truncates toward
// zero; integer division by zero is an error.
//
// Only nodes that an output depends on are evaluated, and each intermediate tensor is
// freed as soon as its last user has run.
#pragma once

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ir/graph.h"
#include "ir/host_tensor.h"

namespace kiln {

// Called right after a node of the evaluated function is computed (and its result rounded),
// before any of its users reads it: `results` holds one tensor per result of the node (one for
// a get_result, which sees what its multi-result node's hook left). The hook may change the
// values in place, e.g. runtime/distributed/reference_data_parallel.h all-reduces a gradient
// across ranks there, so the step's clipping and AdamW read the averaged gradient. The
// shapes and dtypes must stay: the evaluator checks them after the hook and fails naming the
// node otherwise, since the users' kernels trust them. A non-OK status stops the evaluation
// with that error, prefixed by the node. Only the function's own nodes are reported, not the
// nodes inside a fusion's body (those are the fusion's internals, not values of the function),
// and only nodes that an output depends on (the others never run). The tensors in `results`
// stay where they are until the node's last user has run (the evaluator frees a value then),
// so a hook may keep pointers to them and change them from a later node's call: the
// data-parallel runner averages a bucket's earlier gradients at its last one. The one
// exception: a get_result moves its result out of its multi-result node, so keep the
// get_result's tensor, not the multi-result node's.
using AfterNodeHook = std::function<absl::Status(const Node& node, absl::Span<HostTensor> results)>;

struct ReferenceOptions {
  int num_threads = 0;      // 0: std::thread::hardware_concurrency()
  bool f32_as_f64 = false;  // keep f32 results in double precision (for float64
                            // finite-difference tests); narrow types still round
  AfterNodeHook after_node;  // unset: evaluation as without it
};

// Bad arguments (count, types) -> InvalidArgument naming the parameter; an op that fails
// (an index out of range, ...) -> an error naming the function, the node and the reason.
absl::StatusOr<std::vector<HostTensor>> EvaluateFunction(const Function& f, absl::Span<const HostTensor> args,
                                                         const ReferenceOptions& options = {});

// Whether the evaluator has semantics for `op`; driven by the dispatch switch itself, so
// tests/op_table_test.cc fails for any op of the table that lacks them.
bool ReferenceSupports(Opcode op);

}  // namespace kiln
