// Fusion nodes: one generated kernel computing a body of ops (XLA's kFusion). The node owns
// its body, a Function whose parameter i is the node's operand i and whose outputs are the
// node's results; the body's values never exist in memory, only the results do. The text
// form writes the body under the node:
//
//   %y = fusion(%a, %b) {kind=loop} : bf16[4,8] {
//     %a = parameter() {index=0} : f32[4,8]
//     %b = parameter() {index=1} : f32[8]
//     %bb = broadcast(%b) {dims=[1]} : f32[4,8]
//     %s = add(%a, %bb) : f32[4,8]
//     %y = convert(%s) : bf16[4,8]
//     return %y
//   }
//
// The kind says what shape of kernel computes the body, and so what the body may hold (the
// verifier checks it, codegen renders each kind):
//   loop       elementwise ops, broadcasts, reshapes, transposes, iotas and splat constants,
//              computed element by element at the index the output needs;
//   reduction  the same, feeding one reduce_sum or reduce_max: the body's output.
// Room is left for the kinds the training passes add (a norm's prologue and epilogue, a
// GEMM's epilogue): a new kind is a new enumerator, a body rule here and a renderer.
//
// Fusion nodes are made by fuse-loops (passes/fusion.h) after autodiff; a pass that runs
// later sees each as one node with its operands and results, like any other op.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ir/graph.h"

namespace kiln {

// kGemvGlu: a few-row gemm of body parameters (no C) and, of its result x (2F wide), the
// SwiGLU silu(x[.., :F]) * x[.., F:] (MatchSwiGlu's ops), computed by one kernel: the GEMV
// streaming the gate and up rows of the joined weight side by side (passes/fuse_gemv_glu.h).
// kCacheWrite: a loop body that ends in a kv_cache_write of its computed rows (pool and slots
// are body parameters): the kernel that computes a layer's new K (or V) rows stores them
// straight into their paged-pool slots instead of writing them for a second kernel to copy.
// It may return several values (passes/merge_cache_write_siblings.h): kv_cache_writes, each
// of its own pool, and loop values, all computed by one kernel; a pool parameter is read by
// its write alone (the write is in place).
// kGemvNormGemv: a few-row gemm of body parameters with an f32 result x (C allowed: the
// residual stream), the rms_norm of x by a parameter's weight, and a second few-row gemm of
// that norm and a parameter, with or without the SwiGLU of its result (MatchSwiGluOf); the body
// returns x, then the second gemm (or its SwiGLU). Two kernels: the first GEMV, which adds up
// the sums of squares of x's rows as it stores them, and the second, which forms the norm's
// rows from x, the weight and those sums as it reads them (passes/fuse_norm_between_gemvs.h).
enum class FusionKind { kLoop, kReduction, kCacheWrite, kGemvGlu, kGemvNormGemv };

// "loop", "reduction", "cache_write", "gemv_glu", "gemv_norm_gemv"
absl::string_view FusionKindName(FusionKind kind);
// InvalidArgument listing the known kinds for any other name.
absl::StatusOr<FusionKind> ParseFusionKind(absl::string_view name);
// The `kind` attribute of a fusion node.
absl::StatusOr<FusionKind> FusionKindOf(const Node& fusion);

// Whether `node` can be computed element by element inside a loop kernel: what a loop body
// may hold. fp8 values are left out (no storage literal or rounding path in a body yet), and
// so are multi-result nodes and their results (their kernels store them).
bool IsLoopOp(const Node& node);
// A reduction that can end a reduction body: its operand is then computed inside the
// reduction's kernel instead of being stored (reduce_sum(mul(g, g)) reads g once).
bool IsFusibleReduction(const Node& node);

// A fusion's result types: its body's output types, once the body's parameters are checked
// against `operands` (same count, same types, in index order).
absl::StatusOr<std::vector<TensorType>> FusionResultTypes(absl::Span<const TensorType> operands,
                                                          const Function& body);

// What the verifier checks of a fusion node beyond its body being a valid function (which it
// checks too): it has a body and a known kind, the body holds no fusion, aliases nothing, and
// holds only what its kind allows. Errors say which body node breaks which rule.
absl::Status CheckFusionBody(const AttrMap& attrs, const Function* body);

// The name a fusion's body goes by (bodies are not printed with one): "<first result>.body".
std::string FusionBodyName(absl::string_view first_result);

// The SwiGLU ops of a body whose one output is silu(x[..., :F]) * x[..., F:] for the body
// value `x` (2F wide in its last dimension), every op of x's dtype: the two slices, the
// sigmoid and the two muls, and nothing else reading x or the gate. Null members: no match.
struct SwiGluOps {
  const Node* gate = nullptr;     // slice [.., 0:F]
  const Node* up = nullptr;       // slice [.., F:2F]
  const Node* sigmoid = nullptr;  // sigmoid(gate)
  const Node* gated = nullptr;    // gate * sigmoid
  const Node* out = nullptr;      // gated * up: the body's output
  int64_t half = 0;               // F
};
SwiGluOps MatchSwiGlu(const Function& body, const Node& x);
// The same ops from x's users, wherever they are (a body may hold other ops too).
SwiGluOps MatchSwiGluOf(const Node& x);

// The ops of a gemv_norm_gemv body (kGemvNormGemv), or an error saying what breaks the form.
struct GemvNormGemvOps {
  const Node* first = nullptr;   // gemm: x, f32
  const Node* norm = nullptr;    // rms_norm(x, w)
  const Node* second = nullptr;  // gemm(norm, ...)
  SwiGluOps glu;                 // of the second gemm; glu.out null when the body has none
};
absl::StatusOr<GemvNormGemvOps> MatchGemvNormGemv(const Function& body);


// Appends (or, with `before`, inserts) a fusion node of `kind` computing `body` over
// `operands`: one result per output of `body`, named `result_names` (read through get_result
// nodes when there are several, as for any multi-result node). Returns the results, or an
// empty vector when a name is taken. The caller verifies.
std::vector<Node*> AddFusionNode(Function& f, FusionKind kind, std::vector<Node*> operands,
                                 std::unique_ptr<Function> body, std::vector<std::string> result_names,
                                 std::string scope, Node* before = nullptr);

}  // namespace kiln
