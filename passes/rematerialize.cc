#include "passes/rematerialize.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "ir/fusion.h"
#include "ir/graph.h"
#include "ir/op_table.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

// A loop fusion's single result or an elementwise op: computation this pass may repeat.
bool Repeatable(const Node& v) {
  if (v.has_multiple_results() || v.opcode() == Opcode::kGetResult || v.num_operands() == 0) return false;
  if (v.opcode() == Opcode::kFusion) {
    absl::StatusOr<FusionKind> kind = FusionKindOf(v);
    return kind.ok() && *kind == FusionKind::kLoop && v.body() != nullptr && v.body()->outputs().size() == 1;
  }
  if (!IsElementwise(v.opcode()) || !IsLoopOp(v)) return false;
  for (const Node* o : v.operands()) {
    if (o->has_multiple_results() || o->type().dims != v.type().dims) return false;
  }
  return true;
}

bool IsLoopFusion(const Node& g) {
  if (g.opcode() != Opcode::kFusion) return false;
  absl::StatusOr<FusionKind> kind = FusionKindOf(g);
  return kind.ok() && *kind == FusionKind::kLoop;
}

// The values a node stands for: its get_result nodes for a multi-result node, else itself.
std::vector<Node*> ResultsOf(const Node& g) {
  std::vector<Node*> results;
  if (g.has_multiple_results()) {
    for (int i = 0; i < g.num_results(); ++i) results.push_back(g.result(i));
  } else {
    results.push_back(const_cast<Node*>(&g));
  }
  return results;
}

struct Candidate {
  Node* value = nullptr;   // V
  Node* late_use = nullptr;  // U
  Node* sibling = nullptr;   // G (the fusion node)
  Node* place = nullptr;     // where G's replacement goes: G or U
};

class Rematerializer {
 public:
  Rematerializer(Function& f, int64_t min_bytes, int64_t min_alone_bytes, int64_t min_gap)
      : f_(f), min_bytes_(min_bytes), min_alone_bytes_(min_alone_bytes), min_gap_(min_gap) {
    Index();
  }

  // The next value to recompute, or none.
  std::optional<Candidate> Find() {
    for (const auto& n : f_.nodes()) {
      Node* v = n.get();
      if (tried_.contains(v->id()) || !Repeatable(*v)) continue;
      tried_.insert(v->id());
      std::optional<Candidate> c = ForValue(v);
      if (c.has_value()) return c;
    }
    return std::nullopt;
  }

  absl::Status Apply(const Candidate& c) {
    Node& v = *c.value;
    if (c.sibling == nullptr) return ApplyAlone(c);
    Node& g = *c.sibling;
    std::unique_ptr<Function> body = CloneFunction(*g.body(), g.body()->name());
    const std::vector<Node*> params = body->parameters();
    auto param_for = [&](const Node* operand) -> Node* {
      for (int j = 0; j < g.num_operands(); ++j) {
        if (g.operand(j) == operand) return params[j];
      }
      return nullptr;
    };
    // V's ops, appended to the body, read G's parameters.
    Node* root = nullptr;
    if (v.opcode() == Opcode::kFusion) {
      absl::flat_hash_map<const Node*, Node*> copy;
      const std::vector<Node*> v_params = v.body()->parameters();
      for (size_t i = 0; i < v_params.size(); ++i) copy[v_params[i]] = param_for(v.operand(static_cast<int>(i)));
      for (const auto& m : v.body()->nodes()) {
        if (m->opcode() == Opcode::kParameter) continue;
        std::vector<Node*> ops;
        for (const Node* o : m->operands()) ops.push_back(copy.at(o));
        Node* clone = body->AppendNode(m->opcode(), std::move(ops), m->attrs(), m->type(),
                                       body->UniqueName(absl::StrCat(m->name(), ".remat")), m->scope());
        if (clone == nullptr) return absl::InternalError(absl::StrCat("rematerialize: cannot copy %", m->name()));
        copy[m.get()] = clone;
      }
      root = copy.at(v.body()->outputs()[0]);
    } else {
      std::vector<Node*> ops;
      for (const Node* o : v.operands()) ops.push_back(param_for(o));
      root = body->AppendNode(v.opcode(), std::move(ops), v.attrs(), v.type(),
                              body->UniqueName(absl::StrCat(v.name(), ".remat")), v.scope());
      if (root == nullptr) return absl::InternalError(absl::StrCat("rematerialize: cannot copy %", v.name()));
    }
    std::vector<Node*> outputs = body->outputs();
    outputs.push_back(root);
    body->SetOutputs(outputs);

    // The replacement takes G's result names (G's own move aside) and one for V's copy.
    const std::vector<Node*> old_results = ResultsOf(g);
    std::vector<std::string> names;
    for (Node* r : old_results) {
      names.push_back(r->name());
      if (!f_.RenameNode(r, f_.UniqueName(absl::StrCat(r->name(), ".before_remat")))) {
        return absl::InternalError(absl::StrCat("rematerialize: cannot rename %", r->name()));
      }
    }
    if (g.has_multiple_results() && !f_.RenameNode(&g, f_.UniqueName(absl::StrCat(g.name(), ".before_remat")))) {
      return absl::InternalError(absl::StrCat("rematerialize: cannot rename %", g.name()));
    }
    names.push_back(f_.UniqueName(absl::StrCat(v.name(), ".remat")));
    std::vector<Node*> operands = g.operands();
    std::vector<Node*> results =
        AddFusionNode(f_, FusionKind::kLoop, std::move(operands), std::move(body), names, g.scope(), c.place);
    if (results.size() != names.size()) return absl::InternalError("rematerialize: cannot add the merged fusion");
    for (size_t k = 0; k < old_results.size(); ++k) old_results[k]->ReplaceAllUsesWith(results[k]);
    for (int i = 0; i < c.late_use->num_operands(); ++i) {
      if (c.late_use->operand(i) == &v) c.late_use->ReplaceOperand(i, results.back());
    }
    std::vector<Node*> dead = old_results;
    if (g.has_multiple_results()) dead.push_back(&g);
    f_.RemoveNodes(dead);
    if (v.users().empty() && !IsOutput(v)) f_.RemoveNode(&v);
    Index();
    return absl::OkStatus();
  }

 private:
  // No sibling: V's computation is copied as a kernel of its own just before U.
  absl::Status ApplyAlone(const Candidate& c) {
    Node& v = *c.value;
    const std::string name = f_.UniqueName(absl::StrCat(v.name(), ".remat"));
    Node* copy = nullptr;
    if (v.opcode() == Opcode::kFusion) {
      std::vector<Node*> results = AddFusionNode(f_, FusionKind::kLoop, v.operands(),
                                                 CloneFunction(*v.body(), v.body()->name()), {name}, v.scope(), c.place);
      if (results.size() == 1) copy = results[0];
    } else {
      copy = f_.InsertNodeBefore(c.place, v.opcode(), v.operands(), v.attrs(), v.type(), name, v.scope());
    }
    if (copy == nullptr) return absl::InternalError(absl::StrCat("rematerialize: cannot copy %", v.name()));
    for (int i = 0; i < c.late_use->num_operands(); ++i) {
      if (c.late_use->operand(i) == &v) c.late_use->ReplaceOperand(i, copy);
    }
    if (v.users().empty() && !IsOutput(v)) f_.RemoveNode(&v);
    Index();
    return absl::OkStatus();
  }

  // Whether `o` stays in memory until `at` anyway: a parameter (held for the whole step) or
  // a value read at or after `at` by a node other than `v`.
  bool LiveAt(const Node& o, int64_t at, const Node* v) const {
    if (o.opcode() == Opcode::kParameter) return true;
    for (const Node* u : o.users()) {
      if (u != v && position_.at(u) >= at) return true;
    }
    return false;
  }

  void Index() {
    position_.clear();
    for (int64_t i = 0; i < f_.num_nodes(); ++i) position_[f_.nodes()[i].get()] = i;
  }

  bool IsOutput(const Node& v) const {
    return std::find(f_.outputs().begin(), f_.outputs().end(), &v) != f_.outputs().end();
  }

  std::optional<Candidate> ForValue(Node* v) {
    if (IsOutput(*v) || v->users().empty()) return std::nullopt;
    if (v->type().num_elements() * DTypeBytes(v->type().dtype) < min_bytes_) return std::nullopt;
    Node* late = nullptr;
    for (Node* u : v->users()) {
      if (late == nullptr || position_.at(u) > position_.at(late)) late = u;
    }
    int64_t last_other = position_.at(v);
    for (Node* u : v->users()) {
      if (u != late) last_other = std::max(last_other, position_.at(u));
    }
    if (late->opcode() == Opcode::kGetResult) return std::nullopt;
    const int64_t late_at = position_.at(late);
    if (late_at - last_other < min_gap_) return std::nullopt;
    // The sibling placed latest (closest to U) wins: the copy then lives shortest.
    std::optional<Candidate> best;
    int64_t best_at = -1;
    for (const auto& n : f_.nodes()) {
      Node* g = n.get();
      if (g == v || g == late || !IsLoopFusion(*g)) continue;
      if (std::find(g->operands().begin(), g->operands().end(), v) != g->operands().end()) continue;
      bool shape_ok = true;
      for (const TensorType& t : g->result_types()) shape_ok = shape_ok && t.dims == v->type().dims;
      if (!shape_ok) continue;
      bool reads_all = true;
      for (const Node* o : v->operands()) {
        reads_all = reads_all && std::find(g->operands().begin(), g->operands().end(), o) != g->operands().end();
      }
      if (!reads_all) continue;
      const int64_t g_at = position_.at(g);
      int64_t place_at = g_at;
      Node* place = g;
      if (g_at > late_at) {  // G moves up to U: every operand of G must come before U
        bool before = true;
        for (const Node* o : g->operands()) before = before && position_.at(o) < late_at;
        if (!before) continue;
        place_at = late_at;
        place = late;
      }
      // Placed after V's last other use, or the forward's V would still be alive beside it.
      if (place_at <= last_other || place_at <= best_at) continue;
      best_at = place_at;
      best = Candidate{.value = v, .late_use = late, .sibling = g, .place = place};
    }
    if (best.has_value()) return best;
    // No sibling reads V's inputs: a copy of its own just before U still frees V's memory
    // in between, when those inputs are held until U anyway (so the copy keeps nothing alive
    // longer). It reads them once more: SwiGLU's after merge-sibling-gemms, whose backward
    // kernel writes the gate/up gradient (twice h's width) and so takes no h of its own.
    if (v->type().num_elements() * DTypeBytes(v->type().dtype) < min_alone_bytes_) return std::nullopt;
    for (const Node* o : v->operands()) {
      if (!LiveAt(*o, late_at, v)) return std::nullopt;
    }
    return Candidate{.value = v, .late_use = late, .sibling = nullptr, .place = late};
  }

  Function& f_;
  const int64_t min_bytes_, min_alone_bytes_, min_gap_;
  absl::flat_hash_map<const Node*, int64_t> position_;
  absl::flat_hash_set<int64_t> tried_;  // ids of the values looked at (ids are never reused)
};

}  // namespace

absl::StatusOr<bool> RematerializePass::RunOnFunction(Function& function) {
  Rematerializer r(function, min_bytes_, min_alone_bytes_, min_gap_);
  bool changed = false;
  while (std::optional<Candidate> c = r.Find()) {
    RETURN_IF_ERROR(r.Apply(*c));
    changed = true;
  }
  return changed;
}

}  // namespace kiln
