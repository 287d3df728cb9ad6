#include "passes/fuse_residual_norm.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "ir/node_predicates.h"
#include "ir/pattern_match.h"

namespace kiln {
namespace {

namespace m = match;

bool IsNorm(const Node& n) { return n.opcode() == Opcode::kRmsNorm || n.opcode() == Opcode::kLayerNorm; }

// An f32 value the fused kernels may read as it lies: not a broadcast, which fuse-loops
// would fold into the add's own kernel without storing it.
m::Pattern ResidualOperand() {
  return m::Any().WithDType(DType::kF32).Where("not a broadcast",
                                               [](const Node& n) { return n.opcode() != Opcode::kBroadcast; });
}

// add(h, branch): f32 operands of the add's own shape (its type rule makes them equal).
m::Pattern ResidualAdd() {
  return m::Op(Opcode::kAdd).WithDType(DType::kF32).WithOperands({ResidualOperand(), ResidualOperand()});
}

// The input gradient of a norm, read by the add alone.
m::Pattern SoleUseGradInput(Node** gi) {
  return m::Op(Opcode::kRmsNormGradInput)
      .WithDType(DType::kF32)
      .Where("used once, not a function output",
             [](const Node& n) { return n.users().size() == 1 && !IsFunctionOutput(n); })
      .Capture(gi);
}

// The uses of `v` that convert it to a narrower float type: all of them converting to one
// dtype (the first such use's), in use order, each node once.
std::vector<Node*> NarrowingConverts(const Node& v, std::optional<DType>& dtype) {
  std::vector<Node*> converts;
  for (Node* u : v.users()) {
    if (u->opcode() != Opcode::kConvert || !IsFloat(u->type().dtype) || u->type().dtype == v.type().dtype) continue;
    if (!dtype.has_value()) dtype = u->type().dtype;
    if (u->type().dtype == *dtype && std::find(converts.begin(), converts.end(), u) == converts.end()) {
      converts.push_back(u);
    }
  }
  return converts;
}

// Whether every use of the norm `y` converts it to one float dtype (then y may be written
// in it); the converts are appended to `converts`.
std::optional<DType> EveryUseConverts(const Node& y, std::vector<Node*>& converts) {
  if (y.users().empty() || IsFunctionOutput(y) || y.type().dtype != DType::kF32) return std::nullopt;
  std::optional<DType> dtype;
  converts = NarrowingConverts(y, dtype);
  size_t uses = 0;
  for (const Node* c : converts) uses += std::count(y.users().begin(), y.users().end(), c);
  if (uses != y.users().size()) {
    converts.clear();  // y stays as it is, and so do its converts
    return std::nullopt;
  }
  return dtype;
}

// Makes every use of each convert read `value` instead, and removes the converts.
void ReplaceConverts(Function& f, const std::vector<Node*>& converts, Node* value) {
  for (Node* c : converts) {
    c->ReplaceAllUsesWith(value);
    f.RemoveNode(c);
  }
}

// Whether `a` is defined before `b` in `f` (positions of the function's node order).
class Order {
 public:
  explicit Order(const Function& f) {
    for (size_t i = 0; i < f.nodes().size(); ++i) position_[f.nodes()[i].get()] = static_cast<int64_t>(i);
  }
  // Nodes made after construction are not known; the pass asks only about older ones.
  bool Before(const Node* a, const Node* b) const { return position_.at(a) < position_.at(b); }

 private:
  absl::flat_hash_map<const Node*, int64_t> position_;
};

// Frees `n`'s name for the node that replaces it and returns the name.
std::string TakeName(Function& f, Node* n) {
  std::string name = n->name();
  KILN_CHECK(f.RenameNode(n, f.UniqueName(absl::StrCat(name, ".unfused"))));
  return name;
}

// norm(add(h, branch)) -> add_norm(h, branch), or norm(x) {out_dtype} where every use of the
// norm converts it. Returns whether it changed anything.
bool FuseForward(Function& f, const Order& order, Node* norm) {
  if (norm->attrs().Has("out_dtype")) return false;  // already written narrow
  std::vector<Node*> converts;
  const std::optional<DType> narrow = EveryUseConverts(*norm, converts);
  AttrMap attrs = norm->attrs();
  if (narrow.has_value()) attrs.Set("out_dtype", Symbol{std::string(DTypeName(*narrow))});
  TensorType y_type = norm->type();
  if (narrow.has_value()) y_type.dtype = *narrow;

  Node* add = norm->operand(0);
  const std::vector<Node*> params(norm->operands().begin() + 1, norm->operands().end());  // w (and b)
  bool fold = m::Match(add, ResidualAdd()) && !add->has_multiple_results();
  for (const Node* p : params) fold = fold && order.Before(p, add);  // the fused node goes where the add was
  if (!fold) {
    if (!narrow.has_value()) return false;
    norm->mutable_attrs() = std::move(attrs);
    norm->set_type(y_type);
    ReplaceConverts(f, converts, norm);
    return true;
  }

  const Opcode fused = norm->opcode() == Opcode::kRmsNorm ? Opcode::kAddRmsNorm : Opcode::kAddLayerNorm;
  std::vector<Node*> operands = {add->operand(0), add->operand(1)};
  operands.insert(operands.end(), params.begin(), params.end());
  const std::string sum_name = TakeName(f, add);
  const std::string y_name = TakeName(f, norm);
  const std::vector<Node*> results = f.AppendMultiResultNode(fused, std::move(operands), std::move(attrs),
                                                             {add->type(), y_type}, {sum_name, y_name},
                                                             norm->scope(), /*before=*/add);
  KILN_CHECK(results.size() == 2);
  ReplaceConverts(f, converts, results[1]);
  norm->ReplaceAllUsesWith(results[1]);  // none left when y is narrow
  f.RemoveNode(norm);
  add->ReplaceAllUsesWith(results[0]);
  f.RemoveNode(add);
  return true;
}

// add(dres, rms_norm_grad_input(x, w, dy)) -> add_rms_norm_grad_input(dres, x, w, dy), with a
// narrow copy for the add's converts.
bool FuseBackward(Function& f, Node* add) {
  if (!m::Match(add, ResidualAdd())) return false;
  Node* gi = nullptr;
  int gi_side = -1;
  for (int side : {1, 0}) {  // autodiff writes add(sum so far, new contribution)
    if (m::Match(add->operand(side), SoleUseGradInput(&gi))) {
      gi_side = side;
      break;
    }
  }
  if (gi_side < 0) return false;
  Node* dres = add->operand(1 - gi_side);
  std::optional<DType> copy_dtype;
  const std::vector<Node*> converts = NarrowingConverts(*add, copy_dtype);
  AttrMap attrs = gi->attrs();
  std::vector<TensorType> types = {add->type()};
  std::vector<std::string> names = {TakeName(f, add)};
  if (copy_dtype.has_value()) {
    attrs.Set("copy_dtype", Symbol{std::string(DTypeName(*copy_dtype))});
    types.push_back(converts[0]->type());
    names.push_back(TakeName(f, converts[0]));
  }
  const std::vector<Node*> operands = {dres, gi->operand(0), gi->operand(1), gi->operand(2)};
  Node* dx = nullptr;
  if (copy_dtype.has_value()) {
    const std::vector<Node*> results = f.AppendMultiResultNode(Opcode::kAddRmsNormGradInput, operands,
                                                               std::move(attrs), types, names, gi->scope(), add);
    KILN_CHECK(results.size() == 2);
    dx = results[0];
    ReplaceConverts(f, converts, results[1]);
  } else {
    dx = f.InsertNodeBefore(add, Opcode::kAddRmsNormGradInput, operands, std::move(attrs), types[0], names[0],
                            gi->scope());
    KILN_CHECK(dx != nullptr);
  }
  add->ReplaceAllUsesWith(dx);
  f.RemoveNode(add);
  f.RemoveNode(gi);
  return true;
}

// The values a node stands for: itself, or a multi-result node's get_result nodes.
std::vector<Node*> ResultValues(Node* n) {
  if (!n->has_multiple_results()) return {n};
  std::vector<Node*> values;
  for (int i = 0; i < n->num_results(); ++i) values.push_back(n->result(i));
  return values;
}

// The input gradient of the norm (x, w, dy) {eps} that `gw` (rms_norm_grad_weight) is the
// weight gradient of, without a weight gradient yet; nullptr if there is none.
Node* InputGradientOf(const Node& gw) {
  Node* x = gw.operand(0);
  for (Node* u : x->users()) {
    const int x_at = u->opcode() == Opcode::kRmsNormGradInput ? 0 : u->opcode() == Opcode::kAddRmsNormGradInput ? 1 : -1;
    if (x_at < 0 || u->attrs().Has("weight_grad")) continue;
    if (u->operand(x_at) != x || u->operand(x_at + 1) != gw.operand(1) || u->operand(x_at + 2) != gw.operand(2)) {
      continue;
    }
    if (u->attrs().GetFloat("eps").value_or(-1) != gw.attrs().GetFloat("eps").value_or(-2)) continue;
    return u;
  }
  return nullptr;
}

// rms_norm_grad_weight(x, w, dy) beside an input gradient of the same (x, w, dy, eps) ->
// that input gradient {weight_grad=1}, dw its last result. The merged node goes where one of
// the two was: the earlier when the input gradient's operands (dres) are defined before it,
// else the input gradient's place when no use of dw comes before it. Returns whether it
// merged.
bool MergeWeightGrad(Function& f, Node* gw) {
  Node* gi = InputGradientOf(*gw);
  if (gi == nullptr) return false;
  const Order order(f);
  Node* before = gi;
  if (order.Before(gw, gi)) {
    bool operands_first = true;
    for (const Node* o : gi->operands()) operands_first = operands_first && order.Before(o, gw);
    bool uses_after = true;
    for (const Node* u : gw->users()) uses_after = uses_after && order.Before(gi, u);
    if (operands_first) {
      before = gw;
    } else if (!uses_after) {
      return false;
    }
  }
  AttrMap attrs = gi->attrs();
  attrs.Set("weight_grad", int64_t{1});
  std::vector<TensorType> types = gi->result_types();
  types.push_back(gw->type());
  const std::vector<Node*> old_values = ResultValues(gi);
  std::vector<std::string> names;
  for (Node* v : old_values) names.push_back(TakeName(f, v));
  names.push_back(TakeName(f, gw));
  if (gi->has_multiple_results()) TakeName(f, gi);  // its `<first>.results` name, for the new node
  const std::vector<Node*> results = f.AppendMultiResultNode(gi->opcode(), gi->operands(), std::move(attrs), types,
                                                             names, gi->scope(), before);
  KILN_CHECK(results.size() == old_values.size() + 1);
  for (size_t i = 0; i < old_values.size(); ++i) old_values[i]->ReplaceAllUsesWith(results[i]);
  gw->ReplaceAllUsesWith(results.back());
  f.RemoveNode(gw);
  std::vector<Node*> dead = old_values;
  if (gi->has_multiple_results()) dead.push_back(gi);
  f.RemoveNodes(dead);
  return true;
}

// dims 0..n-1.
std::vector<int64_t> FirstDims(int n) {
  std::vector<int64_t> dims;
  for (int i = 0; i < n; ++i) dims.push_back(i);
  return dims;
}

// Whether `n` is used once, and not as a function output: the pass may remove it with the
// node that uses it.
bool UsedOnlyOnce(const Node& n) { return n.users().size() == 1 && !IsFunctionOutput(n); }

// LayerNormVjp's centering of a row, sub(v, mul(broadcast(reduce_sum(v) {dims=[last]})
// {dims=[0..last)}, splat 1/D)) (the mul either way round), its row sum, broadcast and mul
// each used once: returns v, and appends those three to `chain`; nullptr if `sub` is not one.
Node* CenteredValue(Node* sub, std::vector<Node*>& chain) {
  Node* v = nullptr;
  Node* summed = nullptr;
  Node *sum = nullptr, *spread = nullptr, *mean = nullptr;
  double scale = 0;
  const m::Pattern row_sum = m::Op(Opcode::kReduceSum, {m::Any(&summed)}).Capture(&sum);
  const m::Pattern centering =
      m::Op(Opcode::kSub)
          .WithDType(DType::kF32)
          .WithOperands({m::Any(&v), m::AnyOrder(Opcode::kMul, m::Op(Opcode::kBroadcast, {row_sum}).Capture(&spread),
                                                 m::Splat(&scale))
                                         .Capture(&mean)});
  if (!m::Match(sub, centering) || summed != v) return nullptr;
  const int last = v->type().rank() - 1;
  if (last < 0 || sum->attrs().GetInts("dims").value_or(std::vector<int64_t>{}) != std::vector<int64_t>{last} ||
      spread->attrs().GetInts("dims").value_or(std::vector<int64_t>{-1}) != FirstDims(last) ||
      scale != 1.0 / static_cast<double>(v->type().dims.back())) {
    return nullptr;
  }
  for (Node* n : {sum, spread, mean}) {
    if (!UsedOnlyOnce(*n)) return nullptr;
  }
  chain.insert(chain.end(), {mean, spread, sum});
  return v;
}

// The one rms_norm_grad_weight(c, w, dy) {eps} among c's users other than `gi`, when every
// other user of c is one; `*ok` false when c has a user that is neither.
Node* WeightGradOfCentered(const Node& c, const Node& gi, bool* ok) {
  Node* gw = nullptr;
  *ok = !IsFunctionOutput(c);
  for (Node* u : c.users()) {
    if (u == &gi) continue;
    const bool same = u->opcode() == Opcode::kRmsNormGradWeight && u->operand(0) == &c &&
                      u->operand(1) == gi.operand(1) && u->operand(2) == gi.operand(2) &&
                      u->attrs().GetFloat("eps").value_or(-1) == gi.attrs().GetFloat("eps").value_or(-2);
    if (!same || (gw != nullptr && gw != u)) *ok = false;
    if (same) gw = u;
  }
  return gw;
}

// reduce_sum(dy) {dims=[0..last)} of w's type (layer_norm's bias gradient); nullptr if none.
Node* BiasGradOf(const Node& dy, const TensorType& w_type) {
  const int last = dy.type().rank() - 1;
  for (Node* u : dy.users()) {
    if (u->opcode() == Opcode::kReduceSum && u->type() == w_type &&
        u->attrs().GetInts("dims").value_or(std::vector<int64_t>{}) == FirstDims(last)) {
      return u;
    }
  }
  return nullptr;
}

// Where one node computing the values `replaced` (in order of the function, as `order` knows
// it) from `operands` may go: just before the first of them after which every operand is
// defined and before which no use of an earlier one comes; nullptr if none.
Node* PlaceFor(const Order& order, std::vector<Node*> replaced, const std::vector<Node*>& operands) {
  std::sort(replaced.begin(), replaced.end(), [&](Node* a, Node* b) { return order.Before(a, b); });
  for (Node* at : replaced) {
    bool ok = true;
    for (const Node* o : operands) ok = ok && order.Before(o, at);
    for (const Node* r : replaced) {
      if (r == at || !order.Before(r, at)) continue;
      for (const Node* u : r->users()) ok = ok && order.Before(at, u);
    }
    if (ok) return at;
  }
  return nullptr;
}

// LayerNormVjp's decomposition of one layer_norm's backward, on the finished step:
//   c = center(x);  gi = rms_norm_grad_input(c, w, dy);  dx = center(gi)
//   [dx' = add(dres, dx), and its converts]  [gw = rms_norm_grad_weight(c, w, dy)]
//   [db = reduce_sum(dy) over the rows]
// -> layer_norm_grad_input(x, w, dy), or add_layer_norm_grad_input(dres, x, w, dy) with a
// copy for the add's converts, {weight_grad=1} with dw and db its last results when both gw
// and db are there. Every intermediate (c, gi, the row means) has no other use. Returns
// whether it fused.
bool FuseLayerNormBackward(Function& f, Node* gi) {
  if (gi->attrs().Has("weight_grad") || IsFunctionOutput(*gi) || gi->users().size() != 2) return false;
  std::vector<Node*> dead;
  Node* c = gi->operand(0);
  Node* x = CenteredValue(c, dead);
  if (x == nullptr) return false;
  bool c_only_norm = false;
  Node* gw = WeightGradOfCentered(*c, *gi, &c_only_norm);
  if (!c_only_norm) return false;
  Node* dxc = nullptr;  // center(gi): gi's user other than its row sum
  for (Node* u : gi->users()) {
    if (u->opcode() == Opcode::kSub && u->operand(0) == gi) dxc = u;
  }
  if (dxc == nullptr || CenteredValue(dxc, dead) != gi) return false;
  Node* w = gi->operand(1);
  Node* dy = gi->operand(2);
  Node* db = BiasGradOf(*dy, w->type());
  if (gw != nullptr && db == nullptr) return false;  // dw would stay rms_norm's, reading c
  const bool weight_grad = gw != nullptr;

  // The residual form: the centered gradient's one use adds the residual gradient.
  Node* add = nullptr;
  Node* dres = nullptr;
  if (UsedOnlyOnce(*dxc) && m::Match(dxc->users()[0], ResidualAdd()) && !dxc->users()[0]->has_multiple_results()) {
    add = dxc->users()[0];
    const int side = add->operand(1) == dxc ? 1 : 0;
    if (add->operand(side) == dxc && add->operand(1 - side) != dxc) dres = add->operand(1 - side);
    if (dres == nullptr) add = nullptr;
  }
  Node* dx = add != nullptr ? add : dxc;
  std::optional<DType> copy_dtype;
  const std::vector<Node*> converts = add != nullptr ? NarrowingConverts(*add, copy_dtype) : std::vector<Node*>{};

  std::vector<Node*> operands = {x, w, dy};
  if (add != nullptr) operands.insert(operands.begin(), dres);
  std::vector<Node*> replaced = {dx};
  if (weight_grad) replaced.insert(replaced.end(), {gw, db});
  const Order order(f);
  Node* before = PlaceFor(order, replaced, operands);
  if (before == nullptr) return false;

  AttrMap attrs;
  attrs.Set("eps", gi->attrs().GetFloat("eps").value_or(0));
  std::vector<TensorType> types = {dx->type()};
  std::vector<std::string> names = {TakeName(f, dx)};
  if (copy_dtype.has_value()) {
    attrs.Set("copy_dtype", Symbol{std::string(DTypeName(*copy_dtype))});
    types.push_back(converts[0]->type());
    names.push_back(TakeName(f, converts[0]));
  }
  if (weight_grad) {
    attrs.Set("weight_grad", int64_t{1});
    types.insert(types.end(), {gw->type(), db->type()});
    names.push_back(TakeName(f, gw));
    names.push_back(TakeName(f, db));
  }
  const Opcode op = add != nullptr ? Opcode::kAddLayerNormGradInput : Opcode::kLayerNormGradInput;
  std::vector<Node*> results;
  if (types.size() == 1) {
    results = {f.InsertNodeBefore(before, op, operands, std::move(attrs), types[0], names[0], gi->scope())};
    KILN_CHECK(results[0] != nullptr);
  } else {
    results = f.AppendMultiResultNode(op, operands, std::move(attrs), types, names, gi->scope(), before);
    KILN_CHECK(results.size() == types.size());
  }
  dx->ReplaceAllUsesWith(results[0]);
  if (copy_dtype.has_value()) ReplaceConverts(f, converts, results[1]);
  if (weight_grad) {
    gw->ReplaceAllUsesWith(results[results.size() - 2]);
    db->ReplaceAllUsesWith(results.back());
    dead.insert(dead.end(), {gw, db});
  }
  if (add != nullptr) dead.push_back(add);
  dead.insert(dead.end(), {dxc, gi, c});
  f.RemoveNodes(dead);
  return true;
}

}  // namespace

absl::StatusOr<bool> FuseResidualNormPass::RunOnFunction(Function& f) {
  bool changed = false;
  // Forward first: each norm is removed only by its own rewrite, so the list stays valid
  // (an add two norms read is folded into the first; the second reads the sum).
  {
    const Order order(f);
    std::vector<Node*> norms;
    for (const auto& n : f.nodes()) {
      if (IsNorm(*n)) norms.push_back(n.get());
    }
    for (Node* norm : norms) changed |= FuseForward(f, order, norm);
  }
  // Then the backward's adds: each removes itself, its input gradient and its converts,
  // none of which is another listed add.
  std::vector<Node*> adds;
  for (const auto& n : f.nodes()) {
    if (n->opcode() == Opcode::kAdd) adds.push_back(n.get());
  }
  for (Node* add : adds) changed |= FuseBackward(f, add);
  // Then each layer_norm backward (LayerNormVjp's decomposition) into one input-gradient node,
  // before its rms_norm gradients merge below; each removes its own listed input gradient.
  std::vector<Node*> centered_grads;
  for (const auto& n : f.nodes()) {
    if (n->opcode() == Opcode::kRmsNormGradInput) centered_grads.push_back(n.get());
  }
  for (Node* gi : centered_grads) changed |= FuseLayerNormBackward(f, gi);
  // Last, each weight gradient into its norm's input gradient (plain or with the residual
  // add folded in above); each merge removes the listed weight gradient alone.
  std::vector<Node*> weight_grads;
  for (const auto& n : f.nodes()) {
    if (n->opcode() == Opcode::kRmsNormGradWeight) weight_grads.push_back(n.get());
  }
  for (Node* gw : weight_grads) changed |= MergeWeightGrad(f, gw);
  return changed;
}

}  // namespace kiln
