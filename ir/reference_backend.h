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

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ir/graph.h"
#include "ir/host_tensor.h"

namespace kiln {

struct ReferenceOptions {
  int num_threads = 0;      // 0: std::thread::hardware_concurrency()
  bool f32_as_f64 = false;  // keep f32 results in double precision (for float64
                            // finite-difference tests); narrow types still round
};

// Bad arguments (count, types) -> InvalidArgument naming the parameter; an op that fails
// (an index out of range, ...) -> an error naming the function, the node and the reason.
absl::StatusOr<std::vector<HostTensor>> EvaluateFunction(const Function& f, absl::Span<const HostTensor> args,
                                                         const ReferenceOptions& options = {});

// Whether the evaluator has semantics for `op`; driven by the dispatch switch itself, so
// tests/op_table_test.cc fails for any op of the table that lacks them.
bool ReferenceSupports(Opcode op);

}  // namespace kiln
