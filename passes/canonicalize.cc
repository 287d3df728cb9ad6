#include "passes/canonicalize.h"

#include <cstring>
#include <optional>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ir/node_predicates.h"
#include "ir/pattern_match.h"
#include "ir/status_macros.h"
#include "ir/reference_backend.h"

namespace kiln {
namespace {

namespace m = match;

// ---------------------------------------------------------------------------------------
// Predicates this pass alone needs; the shared ones (splats) are ir/node_predicates.h's.

// x + z == x for every x, bit for bit: -0.0 for floats (+0.0 turns -0.0 into +0.0), 0 for
// integers. (x - z == x needs +0.0 instead: x - -0.0 turns -0.0 into +0.0.)
m::Pattern AdditiveIdentity() {
  return m::Any().Where("the additive identity everywhere (-0.0 for floats, 0 for integers)", [](const Node& n) {
    return IsSplatOf(n, IsFloat(n.type().dtype) ? -0.0 : 0.0);
  });
}

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
// Rules: a table of (pattern -> rewrite). The table is built once per Canonicalize call; its
// patterns write their captures into one Captures, and a rewrite reads what its own pattern
// captured.

struct NoMatch {};
struct InPlace {};  // the rule rewrote the root's operands or attributes itself
struct NewNode {    // the root becomes this node (same name, scope and type)
  Opcode op;
  std::vector<Node*> operands;
  AttrMap attrs;
};
// Node*: an existing node replaces the root.
using Rewrite = std::variant<NoMatch, InPlace, Node*, NewNode>;

struct Captures {
  Node* x = nullptr;      // the value that survives the rewrite
  Node* inner = nullptr;  // the inner node of a chain of two
};

using RewriteFn = Rewrite (*)(Node& root, const Captures& captured);

struct RewriteRule {
  absl::string_view name;
  std::optional<Opcode> root;  // the op the pattern is rooted at, to skip it quickly; nullopt: any
  m::Pattern pattern;
  RewriteFn rewrite;
};

Rewrite ReplaceByX(Node&, const Captures& captured) { return captured.x; }

// convert(convert(x)) or reshape(reshape(x)) -> the outer one applied to x; its declared
// result type stays.
Rewrite SkipInner(Node& root, const Captures& captured) {
  root.ReplaceOperand(0, captured.x);
  return InPlace{};
}

Rewrite ComposeTransposes(Node& root, const Captures& captured) {
  // Result dim i is inner dim perm[i], which is x dim inner_perm[perm[i]].
  const std::vector<int64_t> inner_perm = IntsOr(*captured.inner, "perm");
  std::vector<int64_t> composed;
  for (int64_t p : IntsOr(root, "perm")) composed.push_back(inner_perm[p]);
  root.ReplaceOperand(0, captured.x);
  root.mutable_attrs().Set("perm", composed);
  return InPlace{};
}

Rewrite ComposeBroadcasts(Node& root, const Captures& captured) {
  // Operand dim i of the inner broadcast lands on its result dim inner_dims[i], which the
  // outer one maps to dims[inner_dims[i]]. A dim of size 1 anywhere along the way repeats
  // one element either way, so the composition is exact.
  const std::vector<int64_t> dims = IntsOr(root, "dims");
  std::vector<int64_t> composed;
  for (int64_t d : IntsOr(*captured.inner, "dims")) composed.push_back(dims[d]);
  root.ReplaceOperand(0, captured.x);
  root.mutable_attrs().Set("dims", composed);
  return InPlace{};
}

// The root's value, computed by the reference backend's kernel for its op.
Rewrite FoldConstant(Node& root, const Captures&) {
  Module scratch("fold");
  Function* f = scratch.AddFunction("fold");
  std::vector<Node*> operands;
  for (const Node* operand : root.operands()) {
    operands.push_back(f->AppendNode(Opcode::kConstant, {}, operand->attrs(), operand->type()));
  }
  f->SetOutputs({f->AppendNode(root.opcode(), operands, root.attrs(), root.type())});
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

// The rules of the header, in the order they are tried.
std::vector<RewriteRule> MakeRules(Captures& c, int64_t max_fold_elements) {
  const auto small = [max_fold_elements](const Node& n) { return n.type().num_elements() <= max_fold_elements; };
  const m::Pattern foldable =
      m::Any()
          .Where("an op with operands", [](const Node& n) { return GetOpInfo(n.opcode()).category != OpCategory::kLeaf; })
          .Where("small enough to fold", small)
          .WithEveryOperand(m::Op(Opcode::kConstant).Where("small enough to fold", small));
  // A node of one operand that has the node's own type: convert, reshape, concatenate.
  const m::Pattern same_type_as_operand = m::Any().WithOperands({m::Any(&c.x)}).Where(
      "of its operand's type", [](const Node& n) { return n.operand(0)->type() == n.type(); });
  const m::Pattern lossless_convert =
      m::Op(Opcode::kConvert, {m::Any(&c.x)}).Where("a convert that holds every value of its operand", [](const Node& n) {
        return HoldsEveryValueOf(n.type().dtype, n.operand(0)->type().dtype);
      });
  const auto identity_perm = [](const Node& n) { return IsIdentityPermutation(IntsOr(n, "perm")); };
  const auto broadcast_identity = [](const Node& n) {
    return n.operand(0)->type() == n.type() && IsIdentityPermutation(IntsOr(n, "dims"));
  };
  // Same shape: every stride is 1 (or the dim has one element), so every start must be 0.
  const auto slice_identity = [](const Node& n) {
    if (n.operand(0)->type() != n.type()) return false;
    for (int64_t start : IntsOr(n, "start")) {
      if (start != 0) return false;
    }
    return true;
  };
  return {
      {"fold-constants", std::nullopt, foldable, FoldConstant},
      {"mul-by-one", Opcode::kMul, m::AnyOrder(Opcode::kMul, m::Any(&c.x), m::SplatOf(1.0)), ReplaceByX},
      {"mul-by-one", Opcode::kDiv, m::Op(Opcode::kDiv, {m::Any(&c.x), m::SplatOf(1.0)}), ReplaceByX},
      {"add-zero", Opcode::kAdd, m::AnyOrder(Opcode::kAdd, m::Any(&c.x), AdditiveIdentity()), ReplaceByX},
      {"add-zero", Opcode::kSub, m::Op(Opcode::kSub, {m::Any(&c.x), m::SplatOf(0.0)}), ReplaceByX},
      {"convert-identity", Opcode::kConvert, same_type_as_operand, ReplaceByX},
      {"convert-chain", Opcode::kConvert, m::Op(Opcode::kConvert, {lossless_convert}), SkipInner},
      {"reshape-chain", Opcode::kReshape, same_type_as_operand, ReplaceByX},
      {"reshape-chain", Opcode::kReshape, m::Op(Opcode::kReshape, {m::Op(Opcode::kReshape, {m::Any(&c.x)})}),
       SkipInner},
      {"transpose-chain", Opcode::kTranspose,
       m::Op(Opcode::kTranspose, {m::Any(&c.x)}).Where("an identity permutation", identity_perm), ReplaceByX},
      {"transpose-chain", Opcode::kTranspose,
       m::Op(Opcode::kTranspose, {m::Op(Opcode::kTranspose, {m::Any(&c.x)}).Capture(&c.inner)}), ComposeTransposes},
      {"broadcast-chain", Opcode::kBroadcast,
       m::Op(Opcode::kBroadcast, {m::Any(&c.x)}).Where("a broadcast to its operand's type", broadcast_identity),
       ReplaceByX},
      {"broadcast-chain", Opcode::kBroadcast,
       m::Op(Opcode::kBroadcast, {m::Op(Opcode::kBroadcast, {m::Any(&c.x)}).Capture(&c.inner)}), ComposeBroadcasts},
      {"slice-identity", Opcode::kSlice,
       m::Op(Opcode::kSlice, {m::Any(&c.x)}).Where("a slice that keeps every element", slice_identity), ReplaceByX},
      {"concatenate-single", Opcode::kConcatenate, same_type_as_operand, ReplaceByX},
  };
}

// Replaces `node` by a new node that keeps its name, so dumps and tests still read %name.
void ReplaceWithNew(Node* node, NewNode spec) {
  Function& f = *node->parent();
  const std::string name = node->name();
  KILN_CHECK(f.RenameNode(node, f.UniqueName(name + ".old")));
  Node* replacement = f.InsertNodeBefore(node, spec.op, std::move(spec.operands), std::move(spec.attrs), node->type(),
                                         name, node->scope());
  node->ReplaceAllUsesWith(replacement);
  f.RemoveNode(node);
}

// Applies rules to `node` until none fires or it is replaced (and removed). Returns whether
// any fired.
bool RewriteNode(Node* node, const std::vector<RewriteRule>& rules, const Captures& captured) {
  // A multi-result node and its results stay one group: no rule folds or replaces them.
  if (node->has_multiple_results() || node->opcode() == Opcode::kGetResult) return false;
  bool changed = false;
  for (bool again = true; again;) {
    again = false;
    for (const RewriteRule& rule : rules) {
      if (rule.root && *rule.root != node->opcode()) continue;
      if (!m::Match(node, rule.pattern)) continue;
      Rewrite rewrite = rule.rewrite(*node, captured);
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
  Captures captured;
  const std::vector<RewriteRule> rules = MakeRules(captured, max_fold_elements);
  // Rules look only at a node and its operands, and operands come first, so one sweep in
  // definition order sees each node with its operands already rewritten. A node may be
  // removed while it is being visited; the snapshot only holds nodes not yet visited.
  std::vector<Node*> snapshot;
  for (const auto& n : function.nodes()) snapshot.push_back(n.get());
  bool changed = false;
  for (Node* node : snapshot) {
    changed |= RewriteNode(node, rules, captured);
  }
  return changed;
}

absl::StatusOr<bool> CanonicalizePass::RunOnFunction(Function& function) {
  return Canonicalize(function, max_fold_elements_);
}

}  // namespace kiln
