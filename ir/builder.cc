#include "ir/builder.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ir/shape_inference.h"
#include "ir/status_macros.h"

namespace kiln {

std::string FormatLocation(const std::source_location& loc) {
  absl::string_view file = loc.file_name();
  // Keep "dir/file.cc": enough to find it, short enough to read.
  size_t slash = file.rfind('/');
  if (slash != absl::string_view::npos && slash > 0) {
    size_t prev = file.rfind('/', slash - 1);
    if (prev != absl::string_view::npos) file = file.substr(prev + 1);
  }
  return absl::StrCat(file, ":", loc.line());
}

namespace {

// Checks the operands of a new node and gives their types; the error names the op and the
// caller's line.
absl::StatusOr<std::vector<TensorType>> CheckedOperandTypes(const Function* function, Opcode op,
                                                            const std::vector<Node*>& operands,
                                                            const std::source_location& loc) {
  for (size_t i = 0; i < operands.size(); ++i) {
    const Node* operand = operands[i];
    if (operand == nullptr || operand->parent() != function) {
      return absl::InvalidArgumentError(absl::StrCat(
          OpName(op), " at ", FormatLocation(loc), ": operand ", i,
          operand == nullptr ? " is null" : absl::StrCat(" (%", operand->name(), ") belongs to another function")));
    }
  }
  absl::StatusOr<std::vector<TensorType>> types = OperandTypes(op, operands);
  if (!types.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(OpName(op), " at ", FormatLocation(loc), ": ", types.status().message()));
  }
  return types;
}

}  // namespace

absl::StatusOr<std::vector<TensorType>> Builder::Infer(Opcode op, const std::vector<Node*>& operands,
                                                       const AttrMap& attrs, const TensorType* declared, Loc loc) {
  if (op == Opcode::kGetResult) {
    return absl::InvalidArgumentError(absl::StrCat("get_result at ", FormatLocation(loc),
                                                   ": results come with their node (Builder::MultiResultOp)"));
  }
  ASSIGN_OR_RETURN(std::vector<TensorType> types, CheckedOperandTypes(function_, op, operands, loc));
  absl::StatusOr<std::vector<TensorType>> results = InferResultTypes(op, types, attrs, declared);
  if (!results.ok()) {
    std::vector<std::string> shown;
    for (const TensorType& t : types) shown.push_back(t.ToString());
    std::string attr_text = attrs.empty() ? "" : absl::StrCat(" ", attrs.ToString());
    std::string result_text = declared ? absl::StrCat(" -> ", declared->ToString()) : "";
    return absl::InvalidArgumentError(absl::StrCat(OpName(op), "(", absl::StrJoin(shown, ", "), ")", attr_text,
                                                   result_text, " at ", FormatLocation(loc), ": ",
                                                   results.status().message()));
  }
  return results;
}

absl::StatusOr<Node*> Builder::Op(Opcode op, std::vector<Node*> operands, AttrMap attrs,
                                  const TensorType* declared, std::string name, Loc loc) {
  if (name.empty()) name = std::move(next_name_);
  next_name_.clear();
  if (HasMultipleResults(op)) {
    return absl::InvalidArgumentError(absl::StrCat(OpName(op), " at ", FormatLocation(loc), ": has ",
                                                   GetOpInfo(op).num_results,
                                                   " results: build it with Builder::MultiResultOp"));
  }
  ASSIGN_OR_RETURN(std::vector<TensorType> types, Infer(op, operands, attrs, declared, loc));
  if (types.size() != 1) {  // an op whose operands or attributes set its result count (a gemm with amax=1)
    return absl::InvalidArgumentError(absl::StrCat(OpName(op), " at ", FormatLocation(loc), ": has ", types.size(),
                                                   " results here: build it with Builder::MultiResultOp"));
  }
  if (!name.empty()) name = function_->UniqueName(name);
  Node* node = function_->AppendNode(op, std::move(operands), std::move(attrs), std::move(types[0]), name, scope_);
  KILN_CHECK(node != nullptr);
  return node;
}

absl::StatusOr<std::vector<Node*>> Builder::MultiResultOp(Opcode op, std::vector<Node*> operands, AttrMap attrs,
                                                          std::vector<std::string> names, Loc loc) {
  next_name_.clear();
  if (GetOpInfo(op).num_results == 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(OpName(op), " at ", FormatLocation(loc), ": has one result: build it with Builder::Op"));
  }
  ASSIGN_OR_RETURN(std::vector<TensorType> types, Infer(op, operands, attrs, nullptr, loc));
  if (types.size() < 2) {  // an op whose result count its attributes set
    return absl::InvalidArgumentError(absl::StrCat(OpName(op), " at ", FormatLocation(loc),
                                                   ": these attributes give one result: build it with Builder::Op"));
  }
  if (!names.empty() && names.size() != types.size()) {
    return absl::InvalidArgumentError(absl::StrCat(OpName(op), " at ", FormatLocation(loc), ": ", names.size(),
                                                   " names for ", types.size(), " results"));
  }
  names.resize(types.size());
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i].empty()) continue;
    std::string unique = function_->UniqueName(names[i]);
    for (size_t j = 0; j < i; ++j) {  // distinct from the results named before it, too
      for (int k = 1; unique == names[j]; ++k) unique = function_->UniqueName(absl::StrCat(names[i], ".", k));
    }
    names[i] = std::move(unique);
  }
  std::vector<Node*> results = function_->AppendMultiResultNode(op, std::move(operands), std::move(attrs),
                                                                std::move(types), std::move(names), scope_);
  KILN_CHECK(!results.empty());
  return results;
}

absl::StatusOr<Node*> Builder::Parameter(std::string name, TensorType type, Loc loc) {
  AttrMap attrs{{"index", next_parameter_index_}};
  ASSIGN_OR_RETURN(Node * node, Op(Opcode::kParameter, {}, std::move(attrs), &type, std::move(name), loc));
  ++next_parameter_index_;
  return node;
}

absl::StatusOr<Node*> Builder::Constant(double value, TensorType type, Loc loc) {
  return Op(Opcode::kConstant, {}, AttrMap{{"value", value}}, &type, "", loc);
}

absl::StatusOr<Node*> Builder::ConstantValues(std::vector<double> values, TensorType type, Loc loc) {
  return Op(Opcode::kConstant, {}, AttrMap{{"values", std::move(values)}}, &type, "", loc);
}

absl::StatusOr<Node*> Builder::Iota(TensorType type, int64_t dim, Loc loc) {
  return Op(Opcode::kIota, {}, AttrMap{{"dim", dim}}, &type, "", loc);
}

absl::StatusOr<Node*> Builder::Unary(Opcode op, Node* x, Loc loc) {
  if (GetOpInfo(op).category != OpCategory::kUnary) {
    return absl::InvalidArgumentError(absl::StrCat(OpName(op), " at ", FormatLocation(loc), " is not a unary op"));
  }
  return Op(op, {x}, {}, nullptr, "", loc);
}

absl::StatusOr<Node*> Builder::Binary(Opcode op, Node* a, Node* b, Loc loc) {
  if (GetOpInfo(op).category != OpCategory::kBinary) {
    return absl::InvalidArgumentError(absl::StrCat(OpName(op), " at ", FormatLocation(loc), " is not a binary op"));
  }
  return Op(op, {a, b}, {}, nullptr, "", loc);
}

absl::StatusOr<Node*> Builder::Compare(Node* a, Node* b, std::string direction, Loc loc) {
  return Op(Opcode::kCompare, {a, b}, AttrMap{{"direction", Symbol{std::move(direction)}}}, nullptr, "", loc);
}

absl::StatusOr<Node*> Builder::Select(Node* pred, Node* a, Node* b, Loc loc) {
  return Op(Opcode::kSelect, {pred, a, b}, {}, nullptr, "", loc);
}

namespace {
// The type of a node that may be passed as an operand; null for null or a multi-result node,
// which Builder::Op then rejects with the caller's line.
const TensorType* OperandType(const Node* x) {
  return x != nullptr && !x->has_multiple_results() ? &x->type() : nullptr;
}
}  // namespace

absl::StatusOr<Node*> Builder::Convert(Node* x, DType to, Loc loc) {
  const TensorType* xt = OperandType(x);
  if (xt != nullptr && xt->dtype == to) return x;  // a no-op convert is never built
  TensorType t{to, xt ? xt->dims : std::vector<int64_t>{}};
  return Op(Opcode::kConvert, {x}, {}, &t, "", loc);
}

absl::StatusOr<Node*> Builder::Broadcast(Node* x, std::vector<int64_t> dims, std::vector<int64_t> shape, Loc loc) {
  TensorType t{OperandType(x) ? OperandType(x)->dtype : DType::kF32, std::move(shape)};
  return Op(Opcode::kBroadcast, {x}, AttrMap{{"dims", std::move(dims)}}, &t, "", loc);
}

absl::StatusOr<Node*> Builder::BroadcastScalar(Node* x, std::vector<int64_t> shape, Loc loc) {
  return Broadcast(x, {}, std::move(shape), loc);
}

absl::StatusOr<Node*> Builder::Reshape(Node* x, std::vector<int64_t> shape, Loc loc) {
  TensorType t{OperandType(x) ? OperandType(x)->dtype : DType::kF32, std::move(shape)};
  return Op(Opcode::kReshape, {x}, {}, &t, "", loc);
}

absl::StatusOr<Node*> Builder::Transpose(Node* x, std::vector<int64_t> perm, Loc loc) {
  return Op(Opcode::kTranspose, {x}, AttrMap{{"perm", std::move(perm)}}, nullptr, "", loc);
}

absl::StatusOr<Node*> Builder::Slice(Node* x, std::vector<int64_t> start, std::vector<int64_t> limit,
                                     std::vector<int64_t> stride, Loc loc) {
  if (stride.empty()) stride.assign(start.size(), 1);
  return Op(Opcode::kSlice, {x},
            AttrMap{{"start", std::move(start)}, {"limit", std::move(limit)}, {"stride", std::move(stride)}},
            nullptr, "", loc);
}

absl::StatusOr<Node*> Builder::Concatenate(std::vector<Node*> xs, int64_t dim, Loc loc) {
  return Op(Opcode::kConcatenate, std::move(xs), AttrMap{{"dim", dim}}, nullptr, "", loc);
}

absl::StatusOr<Node*> Builder::ReduceSum(Node* x, std::vector<int64_t> dims, Loc loc) {
  return Op(Opcode::kReduceSum, {x}, AttrMap{{"dims", std::move(dims)}}, nullptr, "", loc);
}

absl::StatusOr<Node*> Builder::ReduceMax(Node* x, std::vector<int64_t> dims, Loc loc) {
  return Op(Opcode::kReduceMax, {x}, AttrMap{{"dims", std::move(dims)}}, nullptr, "", loc);
}

absl::StatusOr<Node*> Builder::DotGeneral(Node* a, Node* b, const DotDims& dims, std::optional<DType> out_dtype,
                                          Loc loc) {
  AttrMap attrs{{"lhs_batch", dims.lhs_batch},
                {"rhs_batch", dims.rhs_batch},
                {"lhs_contract", dims.lhs_contract},
                {"rhs_contract", dims.rhs_contract}};
  if (out_dtype && OperandType(a) && *out_dtype != OperandType(a)->dtype) {
    attrs.Set("out_dtype", Symbol{std::string(DTypeName(*out_dtype))});
  }
  return Op(Opcode::kDotGeneral, {a, b}, std::move(attrs), nullptr, "", loc);
}

absl::StatusOr<Node*> Builder::Gather(Node* table, Node* indices, Loc loc) {
  return Op(Opcode::kGather, {table, indices}, {}, nullptr, "", loc);
}

absl::StatusOr<Node*> Builder::ScatterAdd(Node* indices, Node* updates, TensorType result, Loc loc) {
  return Op(Opcode::kScatterAdd, {indices, updates}, {}, &result, "", loc);
}

absl::StatusOr<Node*> Builder::RmsNorm(Node* x, Node* w, double eps, Loc loc) {
  return Op(Opcode::kRmsNorm, {x, w}, AttrMap{{"eps", eps}}, nullptr, "", loc);
}

absl::StatusOr<Node*> Builder::LayerNorm(Node* x, Node* w, Node* bias, double eps, Loc loc) {
  return Op(Opcode::kLayerNorm, {x, w, bias}, AttrMap{{"eps", eps}}, nullptr, "", loc);
}

absl::StatusOr<Node*> Builder::Softmax(Node* x, Loc loc) { return Op(Opcode::kSoftmax, {x}, {}, nullptr, "", loc); }

absl::StatusOr<Node*> Builder::CrossEntropy(Node* logits, Node* labels, int64_t classes, Loc loc) {
  AttrMap attrs;
  if (classes > 0) attrs.Set("classes", classes);
  std::string name = std::move(next_name_);
  std::vector<std::string> names;
  if (!name.empty()) names = {name, absl::StrCat(name, ".lse")};
  ASSIGN_OR_RETURN(std::vector<Node*> results,
                   MultiResultOp(Opcode::kCrossEntropy, {logits, labels}, std::move(attrs), std::move(names), loc));
  return results[0];
}

absl::StatusOr<Node*> Builder::CrossEntropyGrad(Node* logits, Node* labels, Node* dloss, Node* lse, int64_t classes,
                                                Loc loc) {
  AttrMap attrs;
  if (classes > 0) attrs.Set("classes", classes);
  return Op(Opcode::kCrossEntropyGrad, {logits, labels, dloss, lse}, std::move(attrs), nullptr, "", loc);
}

absl::StatusOr<Node*> Builder::Rope(Node* x, Node* positions, double theta, bool inverse, Loc loc) {
  return Op(Opcode::kRope, {x, positions}, AttrMap{{"theta", theta}, {"inverse", int64_t{inverse ? 1 : 0}}},
            nullptr, "", loc);
}

absl::Status Builder::Return(std::vector<Node*> outputs, std::vector<int64_t> aliases, Loc loc) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i] == nullptr || outputs[i]->parent() != function_) {
      return absl::InvalidArgumentError(
          absl::StrCat("return at ", FormatLocation(loc), ": output ", i, " is not a node of @", function_->name()));
    }
  }
  if (!aliases.empty() && aliases.size() != outputs.size()) {
    return absl::InvalidArgumentError(absl::StrCat("return at ", FormatLocation(loc), ": ", aliases.size(),
                                                   " aliases for ", outputs.size(), " outputs"));
  }
  function_->SetOutputs(std::move(outputs), std::move(aliases));
  return absl::OkStatus();
}

}  // namespace kiln
