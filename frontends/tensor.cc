#include "frontends/tensor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "ir/verifier.h"

namespace kiln {
namespace {

// The graph the operands belong to: the first one that has a graph. nullptr when every
// operand is empty, and then there is nowhere to keep an error: the result is empty too, and
// the graph that later uses it (or Finish) reports that.
Graph* GraphOf(absl::Span<const Tensor> operands) {
  for (const Tensor& t : operands) {
    if (t.graph() != nullptr) return t.graph();
  }
  return nullptr;
}

template <typename BuildFn>
Tensor Emit(absl::string_view op, absl::Span<const Tensor> operands, Loc loc, BuildFn&& build) {
  Graph* graph = GraphOf(operands);
  if (graph == nullptr) return Tensor();
  return graph->Apply(op, operands, loc, std::forward<BuildFn>(build));
}

Tensor UnaryOp(Opcode op, Tensor x, Loc loc) {
  return Emit(OpName(op), {x}, loc, [&](Builder& b) { return b.Unary(op, x.node(), loc); });
}

Tensor BinaryOp(Opcode op, Tensor a, Tensor b, Loc loc) {
  return Emit(OpName(op), {a, b}, loc, [&](Builder& bld) { return bld.Binary(op, a.node(), b.node(), loc); });
}

// `value` as a constant of `like`'s dtype and shape: a scalar, broadcast unless `like` is one.
Tensor ScalarLike(const Tensor& like, double value, Loc loc) {
  if (!like.ok()) return like;  // failed or empty: the op it feeds is a no-op either way
  Tensor scalar = like.graph()->Scalar(value, like.dtype(), loc);
  return like.rank() == 0 ? scalar : BroadcastScalar(scalar, like.shape(), loc);
}

}  // namespace

const TensorType& Tensor::type() const {
  static const TensorType kFailed;
  return node_ ? node_->type() : kFailed;
}

int64_t Tensor::dim(int i) const {
  int r = rank();
  if (i < 0) i += r;
  return (i >= 0 && i < r) ? shape()[i] : 0;
}

void Graph::Fail(absl::Status error) {
  if (status_.ok()) status_ = std::move(error);
}

bool Graph::CheckOperands(absl::string_view op, absl::Span<const Tensor> operands, Loc loc) {
  if (!ok()) return false;
  for (size_t i = 0; i < operands.size(); ++i) {
    if (operands[i].graph() == nullptr) {
      Fail(absl::InvalidArgumentError(
          absl::StrCat(op, " at ", FormatLocation(loc), ": operand ", i, " is an empty Tensor")));
      return false;
    }
    if (operands[i].graph() != this) {
      Fail(absl::InvalidArgumentError(
          absl::StrCat(op, " at ", FormatLocation(loc), ": operand ", i, " belongs to another Graph")));
      return false;
    }
  }
  return true;
}

Tensor Graph::Wrap(absl::StatusOr<Node*> node) {
  if (!node.ok()) {
    Fail(node.status());
    return Tensor(this, nullptr);
  }
  return Tensor(this, *node);
}

Tensor Graph::Parameter(std::string name, TensorType type, Loc loc) {
  return Apply("parameter", {}, loc, [&](Builder& b) { return b.Parameter(std::move(name), std::move(type), loc); });
}

Tensor Graph::Constant(double value, TensorType type, Loc loc) {
  return Apply("constant", {}, loc, [&](Builder& b) { return b.Constant(value, std::move(type), loc); });
}

Tensor Graph::Scalar(double value, DType dtype, Loc loc) { return Constant(value, TensorType{dtype, {}}, loc); }

Tensor Graph::Iota(TensorType type, int64_t dim, Loc loc) {
  return Apply("iota", {}, loc, [&](Builder& b) { return b.Iota(std::move(type), dim, loc); });
}

absl::Status Graph::Finish(const std::vector<Tensor>& outputs, Loc loc) { return Finish(outputs, {}, loc); }

absl::Status Graph::Finish(const std::vector<Tensor>& outputs, std::vector<int64_t> aliases, Loc loc) {
  std::vector<Node*> nodes;
  for (size_t i = 0; i < outputs.size() && ok(); ++i) {
    if (outputs[i].graph() != this) {
      Fail(absl::InvalidArgumentError(absl::StrCat("return at ", FormatLocation(loc), ": output ", i,
                                                   outputs[i].graph() ? " belongs to another Graph"
                                                                      : " is an empty Tensor")));
    }
    nodes.push_back(outputs[i].node());
  }
  if (!ok()) return status_;
  Fail(builder_.Return(std::move(nodes), std::move(aliases), loc));
  if (ok()) Fail(VerifyFunction(*function()));  // catches what no single op can: e.g. a bad scope name
  return status_;
}

ScopeGuard::ScopeGuard(Graph& graph, absl::string_view name)
    : graph_(graph), saved_scope_(graph.builder().scope()) {
  graph_.builder().set_scope(saved_scope_.empty() ? std::string(name) : absl::StrCat(saved_scope_, ".", name));
}

ScopeGuard::~ScopeGuard() { graph_.builder().set_scope(std::move(saved_scope_)); }

Tensor operator+(TensorArg a, Tensor b) { return BinaryOp(Opcode::kAdd, a.tensor, b, a.loc); }
Tensor operator-(TensorArg a, Tensor b) { return BinaryOp(Opcode::kSub, a.tensor, b, a.loc); }
Tensor operator*(TensorArg a, Tensor b) { return BinaryOp(Opcode::kMul, a.tensor, b, a.loc); }
Tensor operator/(TensorArg a, Tensor b) { return BinaryOp(Opcode::kDiv, a.tensor, b, a.loc); }
Tensor operator+(TensorArg a, double b) { return BinaryOp(Opcode::kAdd, a.tensor, ScalarLike(a.tensor, b, a.loc), a.loc); }
Tensor operator-(TensorArg a, double b) { return BinaryOp(Opcode::kSub, a.tensor, ScalarLike(a.tensor, b, a.loc), a.loc); }
Tensor operator*(TensorArg a, double b) { return BinaryOp(Opcode::kMul, a.tensor, ScalarLike(a.tensor, b, a.loc), a.loc); }
Tensor operator/(TensorArg a, double b) { return BinaryOp(Opcode::kDiv, a.tensor, ScalarLike(a.tensor, b, a.loc), a.loc); }
Tensor operator+(double a, TensorArg b) { return BinaryOp(Opcode::kAdd, ScalarLike(b.tensor, a, b.loc), b.tensor, b.loc); }
Tensor operator-(double a, TensorArg b) { return BinaryOp(Opcode::kSub, ScalarLike(b.tensor, a, b.loc), b.tensor, b.loc); }
Tensor operator*(double a, TensorArg b) { return BinaryOp(Opcode::kMul, ScalarLike(b.tensor, a, b.loc), b.tensor, b.loc); }
Tensor operator/(double a, TensorArg b) { return BinaryOp(Opcode::kDiv, ScalarLike(b.tensor, a, b.loc), b.tensor, b.loc); }
Tensor operator-(TensorArg x) { return UnaryOp(Opcode::kNeg, x.tensor, x.loc); }

Tensor Add(Tensor a, Tensor b, Loc loc) { return BinaryOp(Opcode::kAdd, a, b, loc); }
Tensor Sub(Tensor a, Tensor b, Loc loc) { return BinaryOp(Opcode::kSub, a, b, loc); }
Tensor Mul(Tensor a, Tensor b, Loc loc) { return BinaryOp(Opcode::kMul, a, b, loc); }
Tensor Div(Tensor a, Tensor b, Loc loc) { return BinaryOp(Opcode::kDiv, a, b, loc); }
Tensor Add(Tensor a, double b, Loc loc) { return BinaryOp(Opcode::kAdd, a, ScalarLike(a, b, loc), loc); }
Tensor Mul(Tensor a, double b, Loc loc) { return BinaryOp(Opcode::kMul, a, ScalarLike(a, b, loc), loc); }
Tensor Max(Tensor a, Tensor b, Loc loc) { return BinaryOp(Opcode::kMax, a, b, loc); }
Tensor Min(Tensor a, Tensor b, Loc loc) { return BinaryOp(Opcode::kMin, a, b, loc); }
Tensor Exp(Tensor x, Loc loc) { return UnaryOp(Opcode::kExp, x, loc); }
Tensor Log(Tensor x, Loc loc) { return UnaryOp(Opcode::kLog, x, loc); }
Tensor Sqrt(Tensor x, Loc loc) { return UnaryOp(Opcode::kSqrt, x, loc); }
Tensor Rsqrt(Tensor x, Loc loc) { return UnaryOp(Opcode::kRsqrt, x, loc); }
Tensor Tanh(Tensor x, Loc loc) { return UnaryOp(Opcode::kTanh, x, loc); }
Tensor Sigmoid(Tensor x, Loc loc) { return UnaryOp(Opcode::kSigmoid, x, loc); }
Tensor Gelu(Tensor x, Loc loc) { return UnaryOp(Opcode::kGelu, x, loc); }
Tensor Abs(Tensor x, Loc loc) { return UnaryOp(Opcode::kAbs, x, loc); }

Tensor Compare(Tensor a, Tensor b, std::string direction, Loc loc) {
  return Emit("compare", {a, b}, loc,
              [&](Builder& bld) { return bld.Compare(a.node(), b.node(), std::move(direction), loc); });
}

Tensor Select(Tensor pred, Tensor on_true, Tensor on_false, Loc loc) {
  return Emit("select", {pred, on_true, on_false}, loc,
              [&](Builder& b) { return b.Select(pred.node(), on_true.node(), on_false.node(), loc); });
}

Tensor Convert(Tensor x, DType to, Loc loc) {
  return Emit("convert", {x}, loc, [&](Builder& b) { return b.Convert(x.node(), to, loc); });
}

Tensor Broadcast(Tensor x, std::vector<int64_t> dims, std::vector<int64_t> shape, Loc loc) {
  return Emit("broadcast", {x}, loc,
              [&](Builder& b) { return b.Broadcast(x.node(), std::move(dims), std::move(shape), loc); });
}

Tensor BroadcastScalar(Tensor scalar, std::vector<int64_t> shape, Loc loc) {
  return Broadcast(scalar, {}, std::move(shape), loc);
}

Tensor BroadcastRow(Tensor row, std::vector<int64_t> shape, Loc loc) {
  // An empty target shape has no last dim: dim -1 makes the broadcast report it.
  int64_t last = static_cast<int64_t>(shape.size()) - 1;
  return Broadcast(row, {last}, std::move(shape), loc);
}

Tensor Reshape(Tensor x, std::vector<int64_t> shape, Loc loc) {
  return Emit("reshape", {x}, loc, [&](Builder& b) { return b.Reshape(x.node(), std::move(shape), loc); });
}

Tensor Transpose(Tensor x, std::vector<int64_t> perm, Loc loc) {
  return Emit("transpose", {x}, loc, [&](Builder& b) { return b.Transpose(x.node(), std::move(perm), loc); });
}

Tensor Slice(Tensor x, std::vector<int64_t> start, std::vector<int64_t> limit, Loc loc) {
  return Emit("slice", {x}, loc,
              [&](Builder& b) { return b.Slice(x.node(), std::move(start), std::move(limit), {}, loc); });
}

Tensor Concatenate(std::vector<Tensor> xs, int64_t dim, Loc loc) {
  return Emit("concatenate", xs, loc, [&](Builder& b) {
    std::vector<Node*> nodes;
    for (const Tensor& x : xs) nodes.push_back(x.node());
    return b.Concatenate(std::move(nodes), dim, loc);
  });
}

Tensor ReduceSum(Tensor x, std::vector<int64_t> dims, Loc loc) {
  return Emit("reduce_sum", {x}, loc, [&](Builder& b) { return b.ReduceSum(x.node(), std::move(dims), loc); });
}

Tensor ReduceMax(Tensor x, std::vector<int64_t> dims, Loc loc) {
  return Emit("reduce_max", {x}, loc, [&](Builder& b) { return b.ReduceMax(x.node(), std::move(dims), loc); });
}

Tensor DotGeneral(Tensor a, Tensor b, const DotDims& dims, std::optional<DType> out_dtype, Loc loc) {
  return Emit("dot_general", {a, b}, loc,
              [&](Builder& bld) { return bld.DotGeneral(a.node(), b.node(), dims, out_dtype, loc); });
}

Tensor Matmul(Tensor a, Tensor b, std::optional<DType> out_dtype, Loc loc) {
  return Emit("matmul", {a, b}, loc, [&](Builder& bld) -> absl::StatusOr<Node*> {
    const int ra = a.rank(), rb = b.rank();
    DotDims dims;
    if (rb == 2 && ra >= 1) {
      dims.lhs_contract = {ra - 1};
      dims.rhs_contract = {0};
    } else if (ra == rb && ra > 2) {
      for (int i = 0; i < ra - 2; ++i) {
        dims.lhs_batch.push_back(i);
        dims.rhs_batch.push_back(i);
      }
      dims.lhs_contract = {ra - 1};
      dims.rhs_contract = {rb - 2};
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "matmul(", a.type().ToString(), ", ", b.type().ToString(), ") at ", FormatLocation(loc),
          ": needs b of rank 2, or a and b of one rank > 2 with leading batch dims"));
    }
    return bld.DotGeneral(a.node(), b.node(), dims, out_dtype, loc);
  });
}

Tensor Gather(Tensor table, Tensor indices, Loc loc) {
  return Emit("gather", {table, indices}, loc, [&](Builder& b) { return b.Gather(table.node(), indices.node(), loc); });
}

Tensor Softmax(Tensor x, Loc loc) {
  return Emit("softmax", {x}, loc, [&](Builder& b) { return b.Softmax(x.node(), loc); });
}

Tensor RmsNorm(Tensor x, Tensor weight, double eps, Loc loc) {
  return Emit("rms_norm", {x, weight}, loc, [&](Builder& b) { return b.RmsNorm(x.node(), weight.node(), eps, loc); });
}

Tensor LayerNorm(Tensor x, Tensor weight, Tensor bias, double eps, Loc loc) {
  return Emit("layer_norm", {x, weight, bias}, loc,
              [&](Builder& b) { return b.LayerNorm(x.node(), weight.node(), bias.node(), eps, loc); });
}

Tensor Rope(Tensor x, Tensor positions, double theta, Loc loc) {
  return Emit("rope", {x, positions}, loc,
              [&](Builder& b) { return b.Rope(x.node(), positions.node(), theta, /*inverse=*/false, loc); });
}

Tensor KvCacheWrite(Tensor pool, Tensor rows, Tensor slots, int64_t layer, Loc loc) {
  return Emit("kv_cache_write", {pool, rows, slots}, loc, [&](Builder& b) {
    return b.Op(Opcode::kKvCacheWrite, {pool.node(), rows.node(), slots.node()}, AttrMap{{"layer", layer}}, nullptr,
                "", loc);
  });
}

Tensor PagedAttention(Tensor q, Tensor k_pool, Tensor v_pool, Tensor block_tables, Tensor positions, int64_t layer,
                      double scale, Loc loc) {
  return Emit("paged_attention", {q, k_pool, v_pool, block_tables, positions}, loc, [&](Builder& b) {
    return b.Op(Opcode::kPagedAttention, {q.node(), k_pool.node(), v_pool.node(), block_tables.node(), positions.node()},
                AttrMap{{"layer", layer}, {"scale", scale}}, nullptr, "", loc);
  });
}

Tensor SampleTokens(Tensor logits, Tensor sampling, Tensor draws, Loc loc) {
  return Emit("sample_tokens", {logits, sampling, draws}, loc, [&](Builder& b) {
    return b.Op(Opcode::kSampleTokens, {logits.node(), sampling.node(), draws.node()}, AttrMap{}, nullptr, "", loc);
  });
}

Tensor CrossEntropy(Tensor logits, Tensor labels, int64_t classes, Loc loc) {
  return Emit("cross_entropy", {logits, labels}, loc,
              [&](Builder& b) { return b.CrossEntropy(logits.node(), labels.node(), classes, loc); });
}

}  // namespace kiln
