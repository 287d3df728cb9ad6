#include "passes/chunk_lm_head.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ir/gemm_slots.h"
#include "ir/node_predicates.h"

namespace kiln {

int64_t LmHeadChunks(int64_t rows, int64_t chunk_rows) {
  if (chunk_rows <= 0 || rows <= chunk_rows) return 1;
  for (int64_t k = 2; k <= rows / 8; ++k) {
    if (rows % k == 0 && (rows / k) % 8 == 0 && rows / k <= chunk_rows) return k;
  }
  return 1;
}

namespace {

// `node` itself, or its one user when that is a reshape (and the only one).
Node* ThroughReshape(Node* node) {
  if (node->users().size() == 1 && node->users()[0]->opcode() == Opcode::kReshape) return node->users()[0];
  return node;
}

// The one value of a uniform cotangent: a constant, or the broadcast of a scalar constant
// (what the real presets' [16384] cotangent is: canonicalize folds only small broadcasts).
std::optional<double> UniformValue(const Node& n) {
  const Node* c = &n;
  if (n.opcode() == Opcode::kBroadcast && n.num_operands() == 1 && n.operand(0)->type().rank() == 0) c = n.operand(0);
  if (c->opcode() != Opcode::kConstant) return std::nullopt;
  absl::StatusOr<double> v = c->attrs().GetFloat("value");
  if (!v.ok()) return std::nullopt;
  return *v;
}

bool AttrIs(const Node& n, absl::string_view name, absl::string_view symbol) {
  absl::StatusOr<std::string> v = n.attrs().GetSymbol(name);
  return v.ok() && *v == symbol;
}
bool IntAttrIs(const Node& n, absl::string_view name, int64_t value) {
  absl::StatusOr<int64_t> v = n.attrs().GetInt(name);
  return v.ok() && *v == value;
}
bool FloatAttrIs(const Node& n, absl::string_view name, double value) {
  absl::StatusOr<double> v = n.attrs().GetFloat(name);
  return v.ok() && *v == value;
}

// A plain gemm: batch 1, beta 0 (no C), no epilogue, no FP8 slots, of the given layouts.
bool PlainGemm(const Node& n, absl::string_view a_layout, absl::string_view b_layout) {
  return n.opcode() == Opcode::kGemm && !n.has_multiple_results() && !HasFp8Slots(n) && IntAttrIs(n, "batch", 1) &&
         AttrIs(n, "epilogue", "none") && AttrIs(n, "a_layout", a_layout) && AttrIs(n, "b_layout", b_layout) &&
         FloatAttrIs(n, "beta", 0.0) && n.num_operands() == 2;
}

// What the rewrite reads, found from the logits gemm.
struct LmHead {
  Node* logits = nullptr;     // gemm(x, w) : [.., V]
  Node* logits2d = nullptr;   // logits or its reshape to [N, V]
  Node* ce = nullptr;         // the cross_entropy node (multi-result)
  Node* loss = nullptr;       // its get_result 0
  Node* lse = nullptr;        // its get_result 1
  Node* ce_grad = nullptr;    // cross_entropy_grad(logits2d, labels, dloss, lse)
  Node* dlogits = nullptr;    // ce_grad or its reshape
  Node* dx = nullptr;         // gemm(dlogits, w) {mk, kn}
  Node* dw = nullptr;         // gemm(dlogits, x [, c]) {km, kn}: with c (beta 1), a tied embedding's
  Node* dw_c = nullptr;       // that c, or null
  int64_t rows = 0, classes = 0, features = 0;
};

bool Match(Node* logits, LmHead& h) {
  if (!PlainGemm(*logits, "mk", "nk") || IsFunctionOutput(*logits)) return false;
  h.logits = logits;
  h.logits2d = ThroughReshape(logits);
  const TensorType& t2 = h.logits2d->type();
  if (t2.rank() != 2) return false;
  h.rows = t2.dims[0];
  h.classes = t2.dims[1];
  Node* x = logits->operand(0);
  h.features = x->type().dims.back();
  if (x->type().num_elements() != h.rows * h.features || IsFunctionOutput(*h.logits2d)) return false;
  // logits2d: read by cross_entropy and cross_entropy_grad, once each.
  if (h.logits2d->users().size() != 2) return false;
  for (Node* u : h.logits2d->users()) {
    if (u->opcode() == Opcode::kCrossEntropy && u->operand(0) == h.logits2d) h.ce = u;
    if (u->opcode() == Opcode::kCrossEntropyGrad && u->operand(0) == h.logits2d) h.ce_grad = u;
  }
  if (h.ce == nullptr || h.ce_grad == nullptr) return false;
  h.loss = h.ce->result(0);
  h.lse = h.ce->result(1);
  if (h.loss == nullptr || h.lse == nullptr) return false;
  Node* labels = h.ce->operand(1);
  Node* dloss = h.ce_grad->operand(2);
  if (h.ce_grad->operand(1) != labels || h.ce_grad->operand(3) != h.lse) return false;
  // The cotangent must be known before the loss: a constant.
  if (!UniformValue(*dloss).has_value() || dloss->type().dims != std::vector<int64_t>{h.rows}) {
    return false;
  }
  h.dlogits = ThroughReshape(h.ce_grad);
  if (IsFunctionOutput(*h.ce_grad) || IsFunctionOutput(*h.dlogits) || h.dlogits->users().size() != 2) return false;
  Node* w = logits->operand(1);
  for (Node* u : h.dlogits->users()) {
    if (u->opcode() != Opcode::kGemm || u->operand(0) != h.dlogits) continue;
    if (PlainGemm(*u, "mk", "kn") && u->operand(1) == w) h.dx = u;
    if (PlainGemm(*u, "km", "kn") && u->operand(1) == x) h.dw = u;
    // A tied embedding's weight gradient accumulates the LM head's into the embedding's (C).
    if (u->opcode() == Opcode::kGemm && u->operand(1) == x && u->num_operands() == 3 && !HasFp8Slots(*u) &&
        IntAttrIs(*u, "batch", 1) && AttrIs(*u, "epilogue", "none") && AttrIs(*u, "a_layout", "km") &&
        AttrIs(*u, "b_layout", "kn") && FloatAttrIs(*u, "beta", 1.0) && u->operand(2)->type() == u->type()) {
      h.dw = u;
      h.dw_c = u->operand(2);
    }
  }
  return h.dx != nullptr && h.dw != nullptr && h.dx->type().num_elements() == h.rows * h.features;
}

AttrMap WithInt(AttrMap attrs, const std::string& name, int64_t v) {
  attrs.Set(name, v);
  return attrs;
}

// Rewrites one matched LM head into `chunks` chunks, inserted before the cross_entropy (where
// x, w and the labels are all defined, and before every use of the loss). A weight gradient
// with C (a tied embedding's, computed at the end of the backward) gets the chunks' sum added
// where it was: one f32 add of [V, d], where the chunks' logits would have held [N, V] twice.
void Rewrite(Function& f, const LmHead& h, int64_t chunks) {
  Node* const at = h.ce;
  Node* const x = h.logits->operand(0);
  Node* const w = h.logits->operand(1);
  Node* const labels = h.ce->operand(1);
  Node* const dloss = h.ce_grad->operand(2);
  const int64_t rows = h.rows / chunks, n = h.rows, d = h.features;
  const std::string& scope = h.logits->scope();
  auto insert = [&](Opcode op, std::vector<Node*> operands, AttrMap attrs, TensorType type, absl::string_view base,
                    const std::string& node_scope) {
    return f.InsertNodeBefore(at, op, std::move(operands), std::move(attrs), std::move(type), f.UniqueName(base),
                              node_scope);
  };
  auto slice = [&](Node* v, int64_t c, const std::string& node_scope) {
    std::vector<int64_t> start(v->type().rank(), 0), limit = v->type().dims, stride(v->type().rank(), 1);
    start[0] = c * rows;
    limit[0] = (c + 1) * rows;
    TensorType t = v->type();
    t.dims[0] = rows;
    AttrMap a;
    a.Set("start", start);
    a.Set("limit", limit);
    a.Set("stride", stride);
    return insert(Opcode::kSlice, {v}, std::move(a), std::move(t), absl::StrCat(v->name(), ".", c), node_scope);
  };
  Node* x2 = x->type().rank() == 2 ? x
                                   : insert(Opcode::kReshape, {x}, {}, TensorType{x->type().dtype, {n, d}},
                                            absl::StrCat(x->name(), ".rows"), scope);
  std::vector<Node*> losses, lses, dxs;
  Node* dw = nullptr;
  for (int64_t c = 0; c < chunks; ++c) {
    Node* xc = slice(x2, c, scope);
    Node* labels_c = slice(labels, c, h.ce->scope());
    AttrMap dloss_value;
    dloss_value.Set("value", *UniformValue(*dloss));
    Node* dloss_c = insert(Opcode::kConstant, {}, std::move(dloss_value), TensorType{dloss->type().dtype, {rows}},
                           absl::StrCat(dloss->name(), ".", c), dloss->scope());
    Node* logits_c = insert(Opcode::kGemm, {xc, w}, WithInt(h.logits->attrs(), "m", rows),
                            TensorType{h.logits->type().dtype, {rows, h.classes}},
                            absl::StrCat(h.logits->name(), ".", c), scope);
    const TensorType row_values{DType::kF32, {rows}};
    std::vector<Node*> ce = f.AppendMultiResultNode(
        Opcode::kCrossEntropy, {logits_c, labels_c}, h.ce->attrs(), {row_values, row_values},
        {f.UniqueName(absl::StrCat(h.loss->name(), ".", c)), f.UniqueName(absl::StrCat(h.lse->name(), ".", c))},
        h.ce->scope(), at);
    losses.push_back(ce[0]);
    lses.push_back(ce[1]);
    Node* dl = insert(Opcode::kCrossEntropyGrad, {logits_c, labels_c, dloss_c, ce[1]}, h.ce_grad->attrs(),
                      TensorType{h.ce_grad->type().dtype, {rows, h.classes}}, absl::StrCat(h.ce_grad->name(), ".", c),
                      h.ce_grad->scope());
    dxs.push_back(insert(Opcode::kGemm, {dl, w}, WithInt(h.dx->attrs(), "m", rows),
                         TensorType{h.dx->type().dtype, {rows, d}}, absl::StrCat(h.dx->name(), ".", c),
                         h.dx->scope()));
    AttrMap dw_attrs = WithInt(h.dw->attrs(), "k", rows);
    std::vector<Node*> dw_operands = {dl, xc};
    dw_attrs.Set("beta", dw != nullptr ? 1.0 : 0.0);
    if (dw != nullptr) dw_operands.push_back(dw);
    dw = insert(Opcode::kGemm, std::move(dw_operands), std::move(dw_attrs), h.dw->type(),
                absl::StrCat(h.dw->name(), ".", c), h.dw->scope());
  }
  AttrMap rows_dim;
  rows_dim.Set("dim", int64_t{0});
  Node* loss = insert(Opcode::kConcatenate, losses, rows_dim, h.loss->type(), absl::StrCat(h.loss->name(), ".chunks"),
                      h.ce->scope());
  Node* lse = insert(Opcode::kConcatenate, lses, rows_dim, h.lse->type(), absl::StrCat(h.lse->name(), ".chunks"),
                     h.ce->scope());
  Node* dx = insert(Opcode::kConcatenate, dxs, rows_dim, TensorType{h.dx->type().dtype, {n, d}},
                    absl::StrCat(h.dx->name(), ".chunks"), h.dx->scope());
  if (h.dx->type().rank() != 2) {
    dx = insert(Opcode::kReshape, {dx}, {}, h.dx->type(), absl::StrCat(h.dx->name(), ".shaped"), h.dx->scope());
  }

  // The old nodes' values now come from the chunks; the old nodes go, each name to its
  // replacement (dumps and reports keep reading the same names).
  const std::string loss_name = h.loss->name(), dx_name = h.dx->name(), dw_name = h.dw->name();
  h.loss->ReplaceAllUsesWith(loss);
  h.lse->ReplaceAllUsesWith(lse);
  h.dx->ReplaceAllUsesWith(dx);
  if (h.dw_c != nullptr) {
    dw = f.InsertNodeBefore(h.dw, Opcode::kAdd, {dw, h.dw_c}, {}, h.dw->type(),
                            f.UniqueName(absl::StrCat(h.dw->name(), ".tied")), h.dw->scope());
  }
  h.dw->ReplaceAllUsesWith(dw);
  std::vector<Node*> dead = {h.dw, h.dx};
  if (h.dlogits != h.ce_grad) dead.push_back(h.dlogits);
  dead.push_back(h.ce_grad);
  dead.push_back(h.loss);
  dead.push_back(h.lse);
  dead.push_back(h.ce);
  if (h.logits2d != h.logits) dead.push_back(h.logits2d);
  dead.push_back(h.logits);
  f.RemoveNodes(dead);
  if (dloss->users().empty() && !IsFunctionOutput(*dloss)) f.RemoveNode(dloss);
  if (lse->users().empty()) f.RemoveNode(lse);
  f.RenameNode(loss, loss_name);
  f.RenameNode(dx, dx_name);
  f.RenameNode(dw, dw_name);
}

}  // namespace

absl::StatusOr<bool> ChunkLmHeadPass::RunOnFunction(Function& f) {
  if (chunk_rows_ <= 0) return false;
  std::vector<Node*> gemms;
  for (const auto& n : f.nodes()) {
    if (n->opcode() == Opcode::kGemm) gemms.push_back(n.get());
  }
  bool changed = false;
  for (Node* g : gemms) {
    LmHead h;
    if (!Match(g, h)) continue;
    const int64_t chunks = LmHeadChunks(h.rows, chunk_rows_);
    if (chunks < 2) continue;
    Rewrite(f, h, chunks);
    changed = true;
  }
  return changed;
}

}  // namespace kiln
