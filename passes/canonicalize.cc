#include "passes/canonicalize.h"

#include <cmath>
#include <cstring>
#include <optional>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ir/status_macros.h"
#include "runtime/reference_backend.h"

namespace kiln {
namespace {

// ---------------------------------------------------------------------------------------
// Matchers

// The value every element of `node` holds, when it is a constant whose elements are all the
// same (bitwise: -0.0 and 0.0 differ), or a broadcast of one.
std::optional<double> SplatValue(const Node* node) {
  if (node->opcode() == Opcode::kBroadcast) return SplatValue(node->operand(0));
  if (node->opcode() != Opcode::kConstant) return std::nullopt;
  if (node->attrs().Has("value")) {
    absl::StatusOr<double> v = node->attrs().GetFloat("value");
    return v.ok() ? std::optional<double>(*v) : std::nullopt;
  }
  absl::StatusOr<std::vector<double>> values = node->attrs().GetFloats("values");
  if (!values.ok() || values->empty()) return std::nullopt;
  for (double v : *values) {
    if (std::memcmp(&v, &values->front(), sizeof(double)) != 0) return std::nullopt;
  }
  return values->front();
}

bool IsSplatOf(const Node* node, double want) {
  std::optional<double> v = SplatValue(node);
  return v && *v == want && std::signbit(*v) == std::signbit(want);
}

bool IsOne(const Node* node) { return IsSplatOf(node, 1.0); }

// x + z == x for every x, bit for bit: -0.0 for floats (+0.0 turns -0.0 into +0.0), 0 for
// integers.
bool IsAdditiveIdentity(const Node* node) {
  return IsSplatOf(node, IsFloat(node->type().dtype) ? -0.0 : 0.0);
}
// x - z == x for every x: +0.0 (x - -0.0 turns -0.0 into +0.0).
bool IsSubtractiveIdentity(const Node* node) { return IsSplatOf(node, 0.0); }

// Whether every value of dtype `narrow` is exactly a value of `wide`, so converting to
// `wide` and on loses nothing.
bool HoldsEveryValueOf(DType wide, DType narrow) {
  if (wide == narrow || narrow == DType::kPred) return true;
  switch (narrow) {
    case DType::kF8E4M3:
    case DType::kF8E5M2: return wide == DType::kF16 || wide == DType::kBF16 || wide == DType::kF32;
    case DType::kF16:
    case DType::kBF16: return wide == DType::kF32;
    case DType::kI32: return wide == DType::kI64;
    default: return false;
  }
}

std::vector<int64_t> IntsOr(const Node& node, absl::string_view attr) {
  absl::StatusOr<std::vector<int64_t>> v = node.attrs().GetInts(attr);
  return v.ok() ? *v : std::vector<int64_t>{};
}

bool IsIdentityPermutation(const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i) {
    if (perm[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------
// Rules. A rule looks at a node (the root) and its operands and decides one Rewrite.

struct NoMatch {};
struct InPlace {};  // the rule rewrote the root's operands or attributes itself
struct NewNode {    // the root becomes this node (same name, scope and type)
  Opcode op;
  std::vector<Node*> operands;
  AttrMap attrs;
};
// Node*: an existing node replaces the root.
using Rewrite = std::variant<NoMatch, InPlace, Node*, NewNode>;

struct RewriteContext {
  int64_t max_fold_elements;
};

using RuleFn = Rewrite (*)(Node& node, const RewriteContext& ctx);

struct RewriteRule {
  absl::string_view name;
  std::optional<Opcode> root;  // the op the rule matches; nullopt: any op
  RuleFn apply;
};

Rewrite MulByOne(Node& node, const RewriteContext&) {
  if (IsOne(node.operand(1))) return node.operand(0);
  if (node.opcode() == Opcode::kMul && IsOne(node.operand(0))) return node.operand(1);
  return NoMatch{};
}

Rewrite AddZero(Node& node, const RewriteContext&) {
  if (node.opcode() == Opcode::kSub) return IsSubtractiveIdentity(node.operand(1)) ? Rewrite(node.operand(0)) : NoMatch{};
  if (IsAdditiveIdentity(node.operand(1))) return node.operand(0);
  if (IsAdditiveIdentity(node.operand(0))) return node.operand(1);
  return NoMatch{};
}

// Nodes whose result equals their operand when the types match: convert, reshape,
// concatenate of one operand.
Rewrite SameTypeIdentity(Node& node, const RewriteContext&) {
  if (node.num_operands() != 1 || node.operand(0)->type() != node.type()) return NoMatch{};
  return node.operand(0);
}

Rewrite ConvertChain(Node& node, const RewriteContext&) {
  Node* middle = node.operand(0);
  if (middle->opcode() != Opcode::kConvert) return NoMatch{};
  Node* x = middle->operand(0);
  if (!HoldsEveryValueOf(middle->type().dtype, x->type().dtype)) return NoMatch{};
  node.ReplaceOperand(0, x);
  return InPlace{};
}

Rewrite ReshapeChain(Node& node, const RewriteContext&) {
  Node* inner = node.operand(0);
  if (inner->opcode() != Opcode::kReshape) return NoMatch{};
  node.ReplaceOperand(0, inner->operand(0));  // the declared result type stays
  return InPlace{};
}

Rewrite TransposeChain(Node& node, const RewriteContext&) {
  const std::vector<int64_t> perm = IntsOr(node, "perm");
  if (IsIdentityPermutation(perm)) return node.operand(0);
  Node* inner = node.operand(0);
  if (inner->opcode() != Opcode::kTranspose) return NoMatch{};
  // Result dim i is inner dim perm[i], which is x dim inner_perm[perm[i]].
  const std::vector<int64_t> inner_perm = IntsOr(*inner, "perm");
  std::vector<int64_t> composed;
  for (int64_t p : perm) composed.push_back(inner_perm[p]);
  node.ReplaceOperand(0, inner->operand(0));
  node.mutable_attrs().Set("perm", composed);
  return InPlace{};
}

Rewrite BroadcastChain(Node& node, const RewriteContext&) {
  const std::vector<int64_t> dims = IntsOr(node, "dims");
  Node* x = node.operand(0);
  if (x->type() == node.type() && IsIdentityPermutation(dims)) return x;
  if (x->opcode() != Opcode::kBroadcast) return NoMatch{};
  // Operand dim i of the inner broadcast lands on its result dim inner_dims[i], which the
  // outer one maps to dims[inner_dims[i]]. A dim of size 1 anywhere along the way repeats
  // one element either way, so the composition is exact.
  const std::vector<int64_t> inner_dims = IntsOr(*x, "dims");
  std::vector<int64_t> composed;
  for (int64_t d : inner_dims) composed.push_back(dims[d]);
  node.ReplaceOperand(0, x->operand(0));
  node.mutable_attrs().Set("dims", composed);
  return InPlace{};
}

Rewrite SliceIdentity(Node& node, const RewriteContext&) {
  const Node* x = node.operand(0);
  if (x->type() != node.type()) return NoMatch{};
  // Same shape: every stride must be 1 (or the dim has one element) and every start 0.
  const std::vector<int64_t> start = IntsOr(node, "start");
  for (int64_t s : start) {
    if (s != 0) return NoMatch{};
  }
  return node.operand(0);
}

Rewrite FoldConstants(Node& node, const RewriteContext& ctx) {
  if (GetOpInfo(node.opcode()).category == OpCategory::kLeaf) return NoMatch{};
  if (node.type().num_elements() > ctx.max_fold_elements) return NoMatch{};
  for (const Node* operand : node.operands()) {
    if (operand->opcode() != Opcode::kConstant || operand->type().num_elements() > ctx.max_fold_elements) {
      return NoMatch{};
    }
  }
  // Evaluate the op alone, with the reference backend's kernel for it.
  Module scratch("fold");
  Function* f = scratch.AddFunction("fold");
  std::vector<Node*> operands;
  for (const Node* operand : node.operands()) {
    operands.push_back(f->AppendNode(Opcode::kConstant, {}, operand->attrs(), operand->type()));
  }
  f->SetOutputs({f->AppendNode(node.opcode(), operands, node.attrs(), node.type())});
  absl::StatusOr<std::vector<HostTensor>> result = EvaluateFunction(*f, {}, {.num_threads = 1});
  // An op that fails on these constants (integer division by zero, an index out of range)
  // is left for the program to report when it runs.
  if (!result.ok()) return NoMatch{};
  const std::vector<double>& values = result->front().values();
  AttrMap attrs;
  bool splat = !values.empty();
  for (double v : values) splat = splat && std::memcmp(&v, &values.front(), sizeof(double)) == 0;
  if (splat) {
    attrs.Set("value", values.front());
  } else {
    attrs.Set("values", values);
  }
  return NewNode{Opcode::kConstant, {}, std::move(attrs)};
}

const std::vector<RewriteRule>& Rules() {
  static const std::vector<RewriteRule> rules = {
      {"fold-constants", std::nullopt, FoldConstants},
      {"mul-by-one", Opcode::kMul, MulByOne},
      {"mul-by-one", Opcode::kDiv, MulByOne},
      {"add-zero", Opcode::kAdd, AddZero},
      {"add-zero", Opcode::kSub, AddZero},
      {"convert-identity", Opcode::kConvert, SameTypeIdentity},
      {"convert-chain", Opcode::kConvert, ConvertChain},
      {"reshape-chain", Opcode::kReshape, SameTypeIdentity},
      {"reshape-chain", Opcode::kReshape, ReshapeChain},
      {"transpose-chain", Opcode::kTranspose, TransposeChain},
      {"broadcast-chain", Opcode::kBroadcast, BroadcastChain},
      {"slice-identity", Opcode::kSlice, SliceIdentity},
      {"concatenate-single", Opcode::kConcatenate, SameTypeIdentity},
  };
  return rules;
}

// Replaces `node` by a new node that keeps its name, so dumps and tests still read %name.
// The name is busy until `node` goes, hence the detour through a temporary.
void ReplaceWithNew(Node* node, NewNode spec) {
  Function& f = *node->parent();
  const std::string name = node->name();
  const std::string scope = node->scope();
  const TensorType type = node->type();
  Node* temp = f.InsertNodeBefore(node, spec.op, spec.operands, spec.attrs, type, f.UniqueName(name + ".new"), scope);
  node->ReplaceAllUsesWith(temp);
  f.RemoveNode(node);
  Node* renamed = f.InsertNodeBefore(temp, spec.op, std::move(spec.operands), std::move(spec.attrs), type, name, scope);
  temp->ReplaceAllUsesWith(renamed);
  f.RemoveNode(temp);
}

// Applies rules to `node` until none fires or it is replaced (and removed). Returns whether
// any fired.
bool RewriteNode(Node* node, const RewriteContext& ctx) {
  // A multi-result node and its results stay one group: no rule folds or replaces them.
  if (node->has_multiple_results() || node->opcode() == Opcode::kGetResult) return false;
  bool changed = false;
  for (bool again = true; again;) {
    again = false;
    for (const RewriteRule& rule : Rules()) {
      if (rule.root && *rule.root != node->opcode()) continue;
      Rewrite rewrite = rule.apply(*node, ctx);
      if (std::holds_alternative<NoMatch>(rewrite)) continue;
      changed = true;
      if (std::holds_alternative<InPlace>(rewrite)) {  // try every rule on the new form
        again = true;
        break;
      }
      if (NewNode* spec = std::get_if<NewNode>(&rewrite)) {
        ReplaceWithNew(node, std::move(*spec));
        return true;
      }
      node->ReplaceAllUsesWith(std::get<Node*>(rewrite));
      node->parent()->RemoveNode(node);
      return true;
    }
  }
  return changed;
}

}  // namespace

bool Canonicalize(Function& function, int64_t max_fold_elements) {
  const RewriteContext ctx{max_fold_elements};
  // Rules look only at a node and its operands, and operands come first, so one sweep in
  // definition order sees each node with its operands already rewritten. A node may be
  // removed while it is being visited; the snapshot only holds nodes not yet visited.
  std::vector<Node*> snapshot;
  for (const auto& n : function.nodes()) snapshot.push_back(n.get());
  bool changed = false;
  for (Node* node : snapshot) {
    changed |= RewriteNode(node, ctx);
  }
  return changed;
}

absl::StatusOr<bool> CanonicalizePass::Run(Module& module) {
  bool changed = false;
  for (const auto& function : module.functions()) {
    changed |= Canonicalize(*function, max_fold_elements_);
  }
  return changed;
}

}  // namespace kiln
