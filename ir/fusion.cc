#include "ir/fusion.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "ir/node_predicates.h"
#include "ir/status_macros.h"
#include "ir/types.h"

namespace kiln {
namespace {

constexpr FusionKind kKinds[] = {FusionKind::kLoop, FusionKind::kReduction, FusionKind::kCacheWrite,
                                 FusionKind::kGemvGlu, FusionKind::kGemvNormGemv};

absl::Status BodyError(FusionKind kind, const Node& member, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("the body of this ", FusionKindName(kind), " fusion: %", member.name(),
                                                 " (", member.op_name(), ") ", why));
}

// Whether `s` is slice(x) of x's last dimension [begin, end), every other dimension whole.
bool IsLastDimSlice(const Node& s, const Node& x, int64_t begin, int64_t end) {
  if (s.opcode() != Opcode::kSlice || s.operand(0) != &x || s.type().dtype != x.type().dtype) return false;
  const absl::StatusOr<std::vector<int64_t>> start = s.attrs().GetInts("start"), limit = s.attrs().GetInts("limit"),
                                            stride = s.attrs().GetInts("stride");
  const std::vector<int64_t>& dims = x.type().dims;
  if (!start.ok() || !limit.ok() || !stride.ok() || dims.empty() || start->size() != dims.size() ||
      limit->size() != dims.size() || stride->size() != dims.size()) {
    return false;
  }
  for (size_t d = 0; d < dims.size(); ++d) {
    const bool last = d + 1 == dims.size();
    if ((*stride)[d] != 1 || (*start)[d] != (last ? begin : 0) || (*limit)[d] != (last ? end : dims[d])) return false;
  }
  return true;
}

bool Uses(const Node& user, const Node* a, const Node* b) {
  return user.operands().size() == 2 &&
         ((user.operand(0) == a && user.operand(1) == b) || (user.operand(0) == b && user.operand(1) == a));
}

}  // namespace

absl::string_view FusionKindName(FusionKind kind) {
  switch (kind) {
    case FusionKind::kLoop: return "loop";
    case FusionKind::kReduction: return "reduction";
    case FusionKind::kCacheWrite: return "cache_write";
    case FusionKind::kGemvGlu: return "gemv_glu";
    case FusionKind::kGemvNormGemv: return "gemv_norm_gemv";
  }
  return "?";
}

absl::StatusOr<FusionKind> ParseFusionKind(absl::string_view name) {
  for (FusionKind kind : kKinds) {
    if (FusionKindName(kind) == name) return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown fusion kind '", name.substr(0, 64), "' (the kinds are loop, reduction, cache_write, gemv_glu, gemv_norm_gemv)"));
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
      // One or more outputs: kv_cache_writes (at least one), each into a pool parameter that
      // nothing else in the body reads, and loop values.
      int writes = 0;
      for (const Node* out : body->outputs()) {
        if (out->opcode() != Opcode::kKvCacheWrite) continue;
        ++writes;
        const Node* pool = out->operand(0);
        if (pool->opcode() != Opcode::kParameter || out->operand(2)->opcode() != Opcode::kParameter) {
          return BodyError(kind, *out, "writes a pool or reads slots that are not the body's parameters");
        }
        for (const Node* user : pool->users()) {
          if (user != out) {
            return BodyError(kind, *user, absl::StrCat("reads the pool %", pool->name(),
                                                       " that the body writes in place: only its write may"));
          }
        }
        if (out->operand(1) == pool) return BodyError(kind, *out, "writes its pool's own elements as rows");
      }
      if (writes == 0) {
        return absl::InvalidArgumentError("a cache_write fusion's body returns a kv_cache_write (and may return loop values)");
      }
      for (const auto& n : body->nodes()) {
        if (n->opcode() == Opcode::kParameter) continue;
        if (n->opcode() == Opcode::kKvCacheWrite) {
          if (std::find(body->outputs().begin(), body->outputs().end(), n.get()) == body->outputs().end()) {
            return BodyError(kind, *n, "is a cache write the body does not return");
          }
          for (const Node* user : n->users()) {
            return BodyError(kind, *user, "uses the cache write: a cache_write fusion ends at it");
          }
          continue;
        }
        if (!IsLoopOp(*n)) return BodyError(kind, *n, "cannot be computed element by element for the cache write");
      }
      return absl::OkStatus();
    }
    case FusionKind::kGemvGlu: {
      const Node* gemm = nullptr;
      for (const auto& n : body->nodes()) {
        if (n->opcode() != Opcode::kGemm) continue;
        if (gemm != nullptr) return BodyError(kind, *n, "is a second gemm: a gemv_glu body holds one");
        gemm = n.get();
      }
      if (gemm == nullptr) return absl::InvalidArgumentError("a gemv_glu fusion's body holds a gemm");
      for (const Node* operand : gemm->operands()) {
        if (operand->opcode() != Opcode::kParameter) {
          return BodyError(kind, *gemm, "multiplies a value computed in the body: its operands are parameters");
        }
      }
      if (MatchSwiGlu(*body, *gemm).out == nullptr) {
        return BodyError(kind, *gemm,
                         "is not followed by silu(x[.., :F]) * x[.., F:] alone: the body a gemv_glu fusion holds");
      }
      return absl::OkStatus();
    }
    case FusionKind::kGemvNormGemv:
      return MatchGemvNormGemv(*body).status();
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

namespace kiln {

absl::StatusOr<GemvNormGemvOps> MatchGemvNormGemv(const Function& body) {
  constexpr FusionKind kind = FusionKind::kGemvNormGemv;
  GemvNormGemvOps ops;
  for (const auto& n : body.nodes()) {
    if (n->opcode() != Opcode::kGemm) continue;
    if (ops.first == nullptr) {
      ops.first = n.get();
    } else if (ops.second == nullptr) {
      ops.second = n.get();
    } else {
      return BodyError(kind, *n, "is a third gemm: a gemv_norm_gemv body holds two");
    }
  }
  if (ops.second == nullptr) return absl::InvalidArgumentError("a gemv_norm_gemv fusion's body holds two gemms");
  for (const Node* operand : ops.first->operands()) {
    if (operand->opcode() != Opcode::kParameter) {
      return BodyError(kind, *ops.first, "multiplies a value computed in the body: its operands are parameters");
    }
  }
  if (ops.first->type().dtype != DType::kF32) {
    return BodyError(kind, *ops.first, "is not f32: the norm's sums of squares are of an f32 residual stream");
  }
  const Node* norm = ops.second->operand(0);
  if (norm->opcode() != Opcode::kRmsNorm || norm->num_operands() != 2 || norm->operand(0) != ops.first ||
      norm->operand(1)->opcode() != Opcode::kParameter || norm->users().size() != 1) {
    return BodyError(kind, *ops.second, "does not multiply the rms_norm of the first gemm (by a parameter's weight), its one reader");
  }
  ops.norm = norm;
  for (int i = 1; i < ops.second->num_operands(); ++i) {
    if (ops.second->operand(i)->opcode() != Opcode::kParameter) {
      return BodyError(kind, *ops.second, "multiplies a computed value other than the norm: its other operands are parameters");
    }
  }
  ops.glu = MatchSwiGluOf(*ops.second);
  const Node* last = ops.glu.out != nullptr ? ops.glu.out : ops.second;
  for (const auto& n : body.nodes()) {
    const Node* p = n.get();
    if (p->opcode() == Opcode::kParameter || p == ops.first || p == ops.norm || p == ops.second) continue;
    if (ops.glu.out != nullptr && (p == ops.glu.gate || p == ops.glu.up || p == ops.glu.sigmoid ||
                                   p == ops.glu.gated || p == ops.glu.out)) {
      continue;
    }
    return BodyError(kind, *p, "is none of the two gemms, the norm between them and the second's SwiGLU");
  }
  if (body.outputs().size() != 2 || body.outputs()[0] != ops.first || body.outputs()[1] != last) {
    return absl::InvalidArgumentError(
        "a gemv_norm_gemv fusion's body returns its first gemm, then its second (or that one's SwiGLU)");
  }
  return ops;
}

SwiGluOps MatchSwiGluOf(const Node& x) {
  const SwiGluOps none;
  if (x.type().dims.empty()) return none;
  const int64_t width = x.type().dims.back();
  if (width < 2 || width % 2 != 0) return none;
  const int64_t half = width / 2;
  SwiGluOps ops;
  ops.half = half;
  if (x.users().size() != 2) return none;
  for (const Node* s : x.users()) {
    if (IsLastDimSlice(*s, x, 0, half)) ops.gate = s;
    if (IsLastDimSlice(*s, x, half, width)) ops.up = s;
  }
  if (ops.gate == nullptr || ops.up == nullptr || ops.gate->users().size() != 2 || ops.up->users().size() != 1) {
    return none;
  }
  for (const Node* u : ops.gate->users()) {
    if (u->opcode() == Opcode::kSigmoid) ops.sigmoid = u;
  }
  if (ops.sigmoid == nullptr || ops.sigmoid->users().size() != 1) return none;
  ops.gated = ops.sigmoid->users()[0];
  if (ops.gated->opcode() != Opcode::kMul || !Uses(*ops.gated, ops.gate, ops.sigmoid) ||
      ops.gated->users().size() != 1) {
    return none;
  }
  ops.out = ops.gated->users()[0];
  if (ops.out->opcode() != Opcode::kMul || !Uses(*ops.out, ops.gated, ops.up) || ops.up->users()[0] != ops.out) {
    return none;
  }
  for (const Node* n : {ops.sigmoid, ops.gated, ops.out}) {
    if (n->type().dtype != x.type().dtype) return none;
  }
  return ops;
}

SwiGluOps MatchSwiGlu(const Function& body, const Node& x) {
  const SwiGluOps none;
  if (body.outputs().size() != 1) return none;
  const SwiGluOps ops = MatchSwiGluOf(x);
  if (ops.out == nullptr || ops.out != body.outputs()[0]) return none;
  // Nothing else in the body: its parameters (x, when x is one) and these five.
  for (const auto& n : body.nodes()) {
    const Node* p = n.get();
    if (p != &x && p != ops.gate && p != ops.up && p != ops.sigmoid && p != ops.gated && p != ops.out &&
        p->opcode() != Opcode::kParameter) {
      return none;
    }
  }
  return ops;
}

}  // namespace kiln
