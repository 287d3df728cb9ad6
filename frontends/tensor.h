// A tensor-style front end over ir/builder.h: ops read like math, errors are never lost.
//
//   Graph g(module.AddFunction("forward"));
//   Tensor x = g.Parameter("x", {DType::kF32, {8, 128}});
//   Tensor w = g.Parameter("w", {DType::kF32, {128, 64}});
//   Tensor y = Softmax(Matmul(x, w) * 0.125);
//   absl::Status done = g.Finish({y});
//
// Errors are sticky instead of being checked after every op: the Graph keeps the first
// error (it names the op, the operand types and the caller's line, e.g.
// "add(f32[2,3], f32[3,2]) at model.cc:42: ..."), every later op returns a failed Tensor
// without adding nodes, and Finish()/status() hands the first error back. Every op takes a
// defaulted std::source_location so that the line is the user's, not this library's; the
// operators get it through TensorArg's converting constructor.
#pragma once

#include <cstdint>
#include <optional>
#include <source_location>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ir/builder.h"
#include "ir/graph.h"

namespace kiln {

class Graph;
using Loc = std::source_location;

// A value of a Graph: one IR node, or a failed value after an error. Cheap to copy.
class Tensor {
 public:
  Tensor() = default;  // empty: belongs to no graph; using it as an operand is an error
  Tensor(Graph* graph, Node* node) : graph_(graph), node_(node) {}

  bool ok() const { return node_ != nullptr; }
  Graph* graph() const { return graph_; }
  Node* node() const { return node_; }  // nullptr when failed

  // A failed tensor reports f32[] so that shape arithmetic on it never crashes.
  const TensorType& type() const;
  DType dtype() const { return type().dtype; }
  const std::vector<int64_t>& shape() const { return type().dims; }
  int rank() const { return type().rank(); }
  // Dimension `i`; negative counts from the back (-1 is the last). 0 when out of range.
  int64_t dim(int i) const;

 private:
  Graph* graph_ = nullptr;
  Node* node_ = nullptr;
};

// Builds into one Function and keeps its first error.
class Graph {
 public:
  explicit Graph(Function* function) : builder_(function) {}
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  Function* function() const { return builder_.function(); }
  Builder& builder() { return builder_; }
  bool ok() const { return status_.ok(); }
  // The first error, or OK.
  const absl::Status& status() const { return status_; }
  // Keeps `error` unless an earlier error is kept already.
  void Fail(absl::Status error);

  // Leaves. Parameters are numbered in creation order.
  Tensor Parameter(std::string name, TensorType type, Loc loc = Loc::current());
  Tensor Constant(double value, TensorType type, Loc loc = Loc::current());  // splat
  Tensor Scalar(double value, DType dtype = DType::kF32, Loc loc = Loc::current());
  Tensor Iota(TensorType type, int64_t dim, Loc loc = Loc::current());

  // Sets the function's outputs and returns the first error of the whole build.
  absl::Status Finish(const std::vector<Tensor>& outputs, Loc loc = Loc::current());
  // The same, with output i donated to parameter aliases[i] (-1: none; Function::output_aliases).
  absl::Status Finish(const std::vector<Tensor>& outputs, std::vector<int64_t> aliases, Loc loc = Loc::current());

  // Runs `build` unless the graph failed already or an operand is failed or empty, and
  // keeps its error. `op` names the op in the error for an empty operand. Every op goes
  // through here; layers may too.
  template <typename BuildFn>
  Tensor Apply(absl::string_view op, absl::Span<const Tensor> operands, Loc loc, BuildFn&& build);

 private:
  bool CheckOperands(absl::string_view op, absl::Span<const Tensor> operands, Loc loc);
  Tensor Wrap(absl::StatusOr<Node*> node);

  Builder builder_;
  absl::Status status_;
};

template <typename BuildFn>
Tensor Graph::Apply(absl::string_view op, absl::Span<const Tensor> operands, Loc loc, BuildFn&& build) {
  if (!CheckOperands(op, operands, loc)) return Tensor(this, nullptr);
  return Wrap(build(builder_));
}

// Nodes created while a ScopeGuard lives get its scope, nested with a '.':
//   ScopeGuard layer(g, "layers.3"); ScopeGuard attn(g, "attn");  // -> "layers.3.attn"
class ScopeGuard {
 public:
  ScopeGuard(Graph& graph, absl::string_view name);
  ~ScopeGuard();
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;

 private:
  Graph& graph_;
  std::string saved_scope_;
};

// Runs `build` (returning a Tensor) with its nodes in scope `name`, nested as ScopeGuard.
template <typename BuildFn>
Tensor InScope(Graph& graph, absl::string_view name, BuildFn&& build) {
  ScopeGuard scope(graph, name);
  return build();
}

// An operator operand: converting a Tensor to it captures the line of the expression.
struct TensorArg {
  TensorArg(Tensor t, Loc loc = Loc::current()) : tensor(t), loc(loc) {}  // NOLINT: implicit
  Tensor tensor;
  Loc loc;
};

// Elementwise arithmetic. Both sides have the same type; a double is a scalar constant of
// the tensor's dtype broadcast to its shape.
Tensor operator+(TensorArg a, Tensor b);
Tensor operator-(TensorArg a, Tensor b);
Tensor operator*(TensorArg a, Tensor b);
Tensor operator/(TensorArg a, Tensor b);
Tensor operator+(TensorArg a, double b);
Tensor operator-(TensorArg a, double b);
Tensor operator*(TensorArg a, double b);
Tensor operator/(TensorArg a, double b);
Tensor operator+(double a, TensorArg b);
Tensor operator-(double a, TensorArg b);
Tensor operator*(double a, TensorArg b);
Tensor operator/(double a, TensorArg b);
Tensor operator-(TensorArg x);

// The same as named functions, for code that forwards its caller's location.
Tensor Add(Tensor a, Tensor b, Loc loc = Loc::current());
Tensor Sub(Tensor a, Tensor b, Loc loc = Loc::current());
Tensor Mul(Tensor a, Tensor b, Loc loc = Loc::current());
Tensor Div(Tensor a, Tensor b, Loc loc = Loc::current());
Tensor Add(Tensor a, double b, Loc loc = Loc::current());
Tensor Mul(Tensor a, double b, Loc loc = Loc::current());

Tensor Max(Tensor a, Tensor b, Loc loc = Loc::current());
Tensor Min(Tensor a, Tensor b, Loc loc = Loc::current());
Tensor Exp(Tensor x, Loc loc = Loc::current());
Tensor Log(Tensor x, Loc loc = Loc::current());
Tensor Sqrt(Tensor x, Loc loc = Loc::current());
Tensor Rsqrt(Tensor x, Loc loc = Loc::current());
Tensor Tanh(Tensor x, Loc loc = Loc::current());
Tensor Sigmoid(Tensor x, Loc loc = Loc::current());
Tensor Gelu(Tensor x, Loc loc = Loc::current());  // the tanh approximation
Tensor Abs(Tensor x, Loc loc = Loc::current());

// `direction` is one of eq, ne, lt, le, gt, ge; the result is pred.
Tensor Compare(Tensor a, Tensor b, std::string direction, Loc loc = Loc::current());
Tensor Select(Tensor pred, Tensor on_true, Tensor on_false, Loc loc = Loc::current());
Tensor Convert(Tensor x, DType to, Loc loc = Loc::current());  // no node when already `to`

// Broadcasting. `dims[i]` is the result dim that operand dim i maps to.
Tensor Broadcast(Tensor x, std::vector<int64_t> dims, std::vector<int64_t> shape, Loc loc = Loc::current());
// A scalar (rank 0) to `shape`.
Tensor BroadcastScalar(Tensor scalar, std::vector<int64_t> shape, Loc loc = Loc::current());
// A row vector [N] along the last dim of `shape` ([..., N]), e.g. a bias.
Tensor BroadcastRow(Tensor row, std::vector<int64_t> shape, Loc loc = Loc::current());

Tensor Reshape(Tensor x, std::vector<int64_t> shape, Loc loc = Loc::current());
Tensor Transpose(Tensor x, std::vector<int64_t> perm, Loc loc = Loc::current());
Tensor Slice(Tensor x, std::vector<int64_t> start, std::vector<int64_t> limit, Loc loc = Loc::current());
Tensor Concatenate(std::vector<Tensor> xs, int64_t dim, Loc loc = Loc::current());
Tensor ReduceSum(Tensor x, std::vector<int64_t> dims, Loc loc = Loc::current());
Tensor ReduceMax(Tensor x, std::vector<int64_t> dims, Loc loc = Loc::current());

// The general contraction (see ir/op_table.h); `out_dtype` is the accumulate/result type.
Tensor DotGeneral(Tensor a, Tensor b, const DotDims& dims, std::optional<DType> out_dtype = std::nullopt,
                  Loc loc = Loc::current());
// a [..., K] · b [K, N] -> [..., N]; or batched: a [*batch, M, K] · b [*batch, K, N].
Tensor Matmul(Tensor a, Tensor b, std::optional<DType> out_dtype = std::nullopt, Loc loc = Loc::current());

Tensor Gather(Tensor table, Tensor indices, Loc loc = Loc::current());
Tensor Softmax(Tensor x, Loc loc = Loc::current());  // over the last dim
Tensor RmsNorm(Tensor x, Tensor weight, double eps, Loc loc = Loc::current());
Tensor LayerNorm(Tensor x, Tensor weight, Tensor bias, double eps, Loc loc = Loc::current());
Tensor Rope(Tensor x, Tensor positions, double theta, Loc loc = Loc::current());
// Per-row loss f32[N] of logits [N, V] against labels [N].
// classes > 0: only the first `classes` columns of logits are classes, the rest padding.
Tensor CrossEntropy(Tensor logits, Tensor labels, int64_t classes = 0, Loc loc = Loc::current());

// The paged KV cache (ir/op_table.h): `rows` [N, Hkv, D] written into layer `layer` of
// `pool` [L, NB, Hkv, BS, D] at flat `slots` i32[N] (-1: none); returns the updated pool.
Tensor KvCacheWrite(Tensor pool, Tensor rows, Tensor slots, int64_t layer, Loc loc = Loc::current());
// Attention of q [B, T, H, D] over keys 0..positions[b, t] of layer `layer` of the pools,
// read through block_tables [B, M] -> f32 [B, T, H, D].
Tensor PagedAttention(Tensor q, Tensor k_pool, Tensor v_pool, Tensor block_tables, Tensor positions, int64_t layer,
                      double scale, Loc loc = Loc::current());
// Each row's next token (ir/op_table.h's sample_tokens): logits [..., V], sampling f32 [..., 3]
// (temperature, top_k, top_p), draws i32 [..., 3] (seed low, seed high, draw index) -> i32 [...].
Tensor SampleTokens(Tensor logits, Tensor sampling, Tensor draws, Loc loc = Loc::current());

}  // namespace kiln
