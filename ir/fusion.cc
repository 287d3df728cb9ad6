#include "ir/fusion.h"

#include "absl/strings/str_cat.h"
#include "ir/node_predicates.h"
#include "ir/status_macros.h"
#include "ir/types.h"

namespace kiln {
namespace {

constexpr FusionKind kKinds[] = {FusionKind::kLoop, FusionKind::kReduction, FusionKind::kCacheWrite};

absl::Status BodyError(FusionKind kind, const Node& member, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("the body of this ", FusionKindName(kind), " fusion: %", member.name(),
                                                 " (", member.op_name(), ") ", why));
}

}  // namespace

absl::string_view FusionKindName(FusionKind kind) {
  switch (kind) {
    case FusionKind::kLoop: return "loop";
    case FusionKind::kReduction: return "reduction";
    case FusionKind::kCacheWrite: return "cache_write";
  }
  return "?";
}

absl::StatusOr<FusionKind> ParseFusionKind(absl::string_view name) {
  for (FusionKind kind : kKinds) {
    if (FusionKindName(kind) == name) return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown fusion kind '", name.substr(0, 64), "' (the kinds are loop, reduction, cache_write)"));
}

absl::StatusOr<FusionKind> FusionKindOf(const Node& fusion) {
  ASSIGN_OR_RETURN(std::string kind, fusion.attrs().GetSymbol("kind"));
  return ParseFusionKind(kind);
}

bool IsLoopOp(const Node& node) {
  if (node.has_multiple_results() || node.opcode() == Opcode::kGetResult || node.opcode() == Opcode::kFusion) {
    return false;
  }
  if (IsFp8(node.type().dtype)) return false;
  for (const Node* o : node.operands()) {
    if (IsFp8(o->type().dtype)) return false;
  }
  if (IsElementwise(node.opcode())) return true;
  switch (node.opcode()) {
    case Opcode::kBroadcast:
    case Opcode::kReshape:
    case Opcode::kTranspose:
    case Opcode::kSlice:
    case Opcode::kConcatenate:
    case Opcode::kIota:
      return true;
    case Opcode::kConstant:
      return IsSplatConstant(node);
    default:
      return false;
  }
}

bool IsFusibleReduction(const Node& node) {
  return (node.opcode() == Opcode::kReduceSum || node.opcode() == Opcode::kReduceMax) && !IsFp8(node.type().dtype) &&
         !IsFp8(node.operand(0)->type().dtype);
}

absl::StatusOr<std::vector<TensorType>> FusionResultTypes(absl::Span<const TensorType> operands,
                                                          const Function& body) {
  const std::vector<Node*> params = body.parameters();
  if (params.size() != operands.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the body takes ", params.size(), " parameter(s) but the fusion has ",
                                                   operands.size(), " operand(s)"));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i]->type() != operands[i]) {
      return absl::InvalidArgumentError(absl::StrCat("operand ", i, " is ", operands[i].ToString(),
                                                     " but the body's parameter %", params[i]->name(), " is ",
                                                     params[i]->type().ToString()));
    }
  }
  std::vector<TensorType> types;
  for (const Node* out : body.outputs()) {
    if (out->has_multiple_results()) return absl::InvalidArgumentError("the body returns a multi-result node");
    types.push_back(out->type());
  }
  if (types.empty()) return absl::InvalidArgumentError("the body returns nothing");
  return types;
}

std::string FusionBodyName(absl::string_view first_result) { return absl::StrCat(first_result, ".body"); }

absl::Status CheckFusionBody(const AttrMap& attrs, const Function* body) {
  if (body == nullptr) return absl::InvalidArgumentError("a fusion needs a body");
  ASSIGN_OR_RETURN(std::string kind_name, attrs.GetSymbol("kind"));
  ASSIGN_OR_RETURN(const FusionKind kind, ParseFusionKind(kind_name));
  if (!body->output_aliases().empty()) {
    return absl::InvalidArgumentError("a fusion body cannot alias its outputs to its parameters");
  }
  for (const auto& n : body->nodes()) {
    if (n->opcode() == Opcode::kFusion) return BodyError(kind, *n, "is a fusion: bodies do not nest");
  }
  switch (kind) {
    case FusionKind::kLoop:
      for (const auto& n : body->nodes()) {
        if (n->opcode() != Opcode::kParameter && !IsLoopOp(*n)) {
          return BodyError(kind, *n, "cannot be computed element by element in a loop kernel");
        }
      }
      return absl::OkStatus();
    case FusionKind::kReduction: {
      if (body->outputs().size() != 1 || !IsFusibleReduction(*body->outputs()[0])) {
        return absl::InvalidArgumentError("a reduction fusion's body returns one reduce_sum or reduce_max");
      }
      const Node* reduction = body->outputs()[0];
      for (const auto& n : body->nodes()) {
        if (n.get() == reduction || n->opcode() == Opcode::kParameter) continue;
        if (!IsLoopOp(*n)) return BodyError(kind, *n, "cannot be computed element by element for the reduction");
      }
      for (const Node* user : reduction->users()) {
        return BodyError(kind, *user, "uses the reduction: a reduction fusion ends at it");
      }
      return absl::OkStatus();
    }
    case FusionKind::kCacheWrite: {
      if (body->outputs().size() != 1 || body->outputs()[0]->opcode() != Opcode::kKvCacheWrite) {
        return absl::InvalidArgumentError("a cache_write fusion's body returns one kv_cache_write");
      }
      const Node* write = body->outputs()[0];
      if (write->operand(0)->opcode() != Opcode::kParameter || write->operand(2)->opcode() != Opcode::kParameter) {
        return BodyError(kind, *write, "writes a pool or reads slots that are not the body's parameters");
      }
      for (const auto& n : body->nodes()) {
        if (n.get() == write || n->opcode() == Opcode::kParameter) continue;
        if (!IsLoopOp(*n)) return BodyError(kind, *n, "cannot be computed element by element for the cache write");
      }
      for (const Node* user : write->users()) {
        return BodyError(kind, *user, "uses the cache write: a cache_write fusion ends at it");
      }
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unknown fusion kind");
}

std::vector<Node*> AddFusionNode(Function& f, FusionKind kind, std::vector<Node*> operands,
                                 std::unique_ptr<Function> body, std::vector<std::string> result_names,
                                 std::string scope, Node* before) {
  AttrMap attrs{{"kind", Symbol{std::string(FusionKindName(kind))}}};
  std::vector<TensorType> types;
  for (const Node* out : body->outputs()) types.push_back(out->type());
  if (types.size() == 1) {
    Node* node = before != nullptr
                     ? f.InsertNodeBefore(before, Opcode::kFusion, std::move(operands), std::move(attrs), types[0],
                                          result_names[0], std::move(scope))
                     : f.AppendNode(Opcode::kFusion, std::move(operands), std::move(attrs), types[0], result_names[0],
                                    std::move(scope));
    if (node == nullptr) return {};
    node->set_body(std::move(body));
    return {node};
  }
  std::vector<Node*> results = f.AppendMultiResultNode(Opcode::kFusion, std::move(operands), std::move(attrs),
                                                       std::move(types), std::move(result_names), std::move(scope),
                                                       before);
  if (results.empty()) return {};
  results[0]->operand(0)->set_body(std::move(body));
  return results;
}

}  // namespace kiln
