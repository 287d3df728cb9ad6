// Builder: the typed way to add nodes to a Function. Every method infers the result type
// and, on bad input, returns an error that names the op, the operand types and the
// caller's source location, e.g.
//   add(f32[2,3], f32[3,2]) at model.cc:42: operand types differ: f32[2,3] vs f32[3,2]
#pragma once

#include <cstdint>
#include <source_location>
#include <string>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "ir/graph.h"

namespace kiln {

struct DotDims {
  std::vector<int64_t> lhs_batch, rhs_batch, lhs_contract, rhs_contract;
};

class Builder {
 public:
  using Loc = std::source_location;
  explicit Builder(Function* function) : function_(function) {}

  Function* function() const { return function_; }
  // Scope given to new nodes (e.g. "layers.3.attn"); see ScopedName.
  const std::string& scope() const { return scope_; }
  void set_scope(std::string scope) { scope_ = std::move(scope); }

  // The general form: any op of one result, with attributes and (for kDeclared ops) the
  // result type.
  absl::StatusOr<Node*> Op(Opcode op, std::vector<Node*> operands, AttrMap attrs = {},
                           const TensorType* declared = nullptr, std::string name = "",
                           Loc loc = Loc::current());
  // An op of several results (adamw_update, attention, attention_grad): the node and its
  // get_result nodes, which are returned in result order. `names` (one per result, or
  // empty) are made unique if taken.
  absl::StatusOr<std::vector<Node*>> MultiResultOp(Opcode op, std::vector<Node*> operands, AttrMap attrs,
                                                   std::vector<std::string> names = {}, Loc loc = Loc::current());

  // Parameter number `index` is the next unused index.
  absl::StatusOr<Node*> Parameter(std::string name, TensorType type, Loc loc = Loc::current());
  absl::StatusOr<Node*> Constant(double value, TensorType type, Loc loc = Loc::current());
  absl::StatusOr<Node*> ConstantValues(std::vector<double> values, TensorType type,
                                       Loc loc = Loc::current());
  absl::StatusOr<Node*> Iota(TensorType type, int64_t dim, Loc loc = Loc::current());

  absl::StatusOr<Node*> Unary(Opcode op, Node* x, Loc loc = Loc::current());
  absl::StatusOr<Node*> Binary(Opcode op, Node* a, Node* b, Loc loc = Loc::current());
  absl::StatusOr<Node*> Add(Node* a, Node* b, Loc loc = Loc::current()) { return Binary(Opcode::kAdd, a, b, loc); }
  absl::StatusOr<Node*> Sub(Node* a, Node* b, Loc loc = Loc::current()) { return Binary(Opcode::kSub, a, b, loc); }
  absl::StatusOr<Node*> Mul(Node* a, Node* b, Loc loc = Loc::current()) { return Binary(Opcode::kMul, a, b, loc); }
  absl::StatusOr<Node*> Div(Node* a, Node* b, Loc loc = Loc::current()) { return Binary(Opcode::kDiv, a, b, loc); }
  absl::StatusOr<Node*> Compare(Node* a, Node* b, std::string direction, Loc loc = Loc::current());
  absl::StatusOr<Node*> Select(Node* pred, Node* a, Node* b, Loc loc = Loc::current());
  absl::StatusOr<Node*> Convert(Node* x, DType to, Loc loc = Loc::current());
  // `dims[i]` is the result dim that operand dim i maps to.
  absl::StatusOr<Node*> Broadcast(Node* x, std::vector<int64_t> dims, std::vector<int64_t> shape,
                                  Loc loc = Loc::current());
  // Broadcasts a scalar to `shape`.
  absl::StatusOr<Node*> BroadcastScalar(Node* x, std::vector<int64_t> shape, Loc loc = Loc::current());
  absl::StatusOr<Node*> Reshape(Node* x, std::vector<int64_t> shape, Loc loc = Loc::current());
  absl::StatusOr<Node*> Transpose(Node* x, std::vector<int64_t> perm, Loc loc = Loc::current());
  absl::StatusOr<Node*> Slice(Node* x, std::vector<int64_t> start, std::vector<int64_t> limit,
                              std::vector<int64_t> stride = {}, Loc loc = Loc::current());
  absl::StatusOr<Node*> Concatenate(std::vector<Node*> xs, int64_t dim, Loc loc = Loc::current());
  absl::StatusOr<Node*> ReduceSum(Node* x, std::vector<int64_t> dims, Loc loc = Loc::current());
  absl::StatusOr<Node*> ReduceMax(Node* x, std::vector<int64_t> dims, Loc loc = Loc::current());
  // `out_dtype` is the accumulation/result type; nullopt keeps the operands' dtype.
  absl::StatusOr<Node*> DotGeneral(Node* a, Node* b, const DotDims& dims,
                                   std::optional<DType> out_dtype = std::nullopt, Loc loc = Loc::current());
  absl::StatusOr<Node*> Gather(Node* table, Node* indices, Loc loc = Loc::current());
  absl::StatusOr<Node*> ScatterAdd(Node* indices, Node* updates, TensorType result, Loc loc = Loc::current());
  absl::StatusOr<Node*> RmsNorm(Node* x, Node* w, double eps, Loc loc = Loc::current());
  absl::StatusOr<Node*> LayerNorm(Node* x, Node* w, Node* bias, double eps, Loc loc = Loc::current());
  absl::StatusOr<Node*> Softmax(Node* x, Loc loc = Loc::current());
  // classes > 0: only the logits' first `classes` columns are classes (ir/op_table.h).
  // The per-row loss: result 0 of a cross_entropy node, whose result 1 (loss->operand(0)->
  // result(1), named "<loss>.lse") is the rows' log-sum-exp that CrossEntropyGrad takes.
  absl::StatusOr<Node*> CrossEntropy(Node* logits, Node* labels, int64_t classes = 0, Loc loc = Loc::current());
  // dL/dlogits of cross_entropy(logits, labels) {classes} given dloss and that node's lse.
  absl::StatusOr<Node*> CrossEntropyGrad(Node* logits, Node* labels, Node* dloss, Node* lse, int64_t classes = 0,
                                         Loc loc = Loc::current());
  absl::StatusOr<Node*> Rope(Node* x, Node* positions, double theta, bool inverse = false,
                             Loc loc = Loc::current());

  // Sets the function's outputs; aliases[i] is the parameter index output i reuses, or -1.
  absl::Status Return(std::vector<Node*> outputs, std::vector<int64_t> aliases = {},
                      Loc loc = Loc::current());

  // Names the next node created (consumed by it). Names are made unique if taken.
  Builder& Named(std::string name) {
    next_name_ = std::move(name);
    return *this;
  }

 private:
  absl::StatusOr<std::vector<TensorType>> Infer(Opcode op, const std::vector<Node*>& operands, const AttrMap& attrs,
                                                const TensorType* declared, Loc loc);
  Function* function_;
  std::string scope_;
  std::string next_name_;
  int64_t next_parameter_index_ = 0;
};

// Formats "file.cc:42" (the file's last two path components) for error messages.
std::string FormatLocation(const std::source_location& loc);

}  // namespace kiln
