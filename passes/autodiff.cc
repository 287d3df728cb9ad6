#include "passes/autodiff.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ir/builder.h"
#include "ir/status_macros.h"
#include "passes/vjp_rules.h"

namespace kiln {
namespace {

absl::Status CheckRequest(const Function& f, const Node* loss, absl::Span<Node* const> wrt) {
  const std::string where = absl::StrCat("AppendBackward in @", f.name());
  if (loss == nullptr) return absl::InvalidArgumentError(absl::StrCat(where, ": loss is null"));
  if (loss->parent() != &f) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": loss %", loss->name(), " belongs to @",
                                                   loss->parent() ? loss->parent()->name() : "<none>"));
  }
  if (loss->type() != TensorType{DType::kF32, {}}) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": loss %", loss->name(), " must be f32[], got ", loss->type().ToString()));
  }
  for (size_t i = 0; i < wrt.size(); ++i) {
    const Node* n = wrt[i];
    if (n == nullptr) return absl::InvalidArgumentError(absl::StrCat(where, ": wrt[", i, "] is null"));
    if (n->parent() != &f) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": wrt[", i, "] %", n->name(), " belongs to @",
                                                     n->parent() ? n->parent()->name() : "<none>"));
    }
    if (!IsFloat(n->type().dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": wrt[", i, "] %", n->name(), " is ",
                                                     n->type().ToString(), "; only float values have gradients"));
    }
  }
  return absl::OkStatus();
}

// Whether any result of `n` is a float value (a multi-result node is active through them).
bool HasFloatResult(const Node& n) {
  for (const TensorType& t : n.result_types()) {
    if (IsFloat(t.dtype)) return true;
  }
  return false;
}

// The float nodes on some path from a wrt node to the loss: only these get cotangents.
absl::flat_hash_set<const Node*> ActiveNodes(const std::vector<Node*>& forward, const Node* loss,
                                             absl::Span<Node* const> wrt) {
  absl::flat_hash_set<const Node*> depends_on_wrt(wrt.begin(), wrt.end());
  for (const Node* n : forward) {
    if (!HasFloatResult(*n)) continue;
    for (const Node* operand : n->operands()) {
      if (depends_on_wrt.contains(operand)) {
        depends_on_wrt.insert(n);
        break;
      }
    }
  }
  absl::flat_hash_set<const Node*> active;
  std::vector<const Node*> stack;
  if (depends_on_wrt.contains(loss)) stack.push_back(loss);
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    if (!active.insert(n).second) continue;
    for (const Node* operand : n->operands()) {
      if (depends_on_wrt.contains(operand)) stack.push_back(operand);
    }
  }
  return active;
}

// Cotangents per forward node, summed as contributions arrive.
class CotangentTable {
 public:
  explicit CotangentTable(Builder& b) : b_(b) {}

  Node* Get(const Node* n) const {
    auto it = sums_.find(n);
    return it == sums_.end() ? nullptr : it->second;
  }

  // Adds in the wider of the two float types, so f32 contributions to a bf16 value are not
  // rounded before they are summed.
  absl::Status Accumulate(Node* target, Node* contribution) {
    Node*& sum = sums_[target];
    if (sum == nullptr) {
      sum = contribution;
      return absl::OkStatus();
    }
    const DType wide = DTypeBytes(contribution->type().dtype) > DTypeBytes(sum->type().dtype)
                           ? contribution->type().dtype
                           : sum->type().dtype;
    const std::string saved_scope = b_.scope();
    b_.set_scope(target->scope());
    ASSIGN_OR_RETURN(Node * lhs, b_.Convert(sum, wide));
    ASSIGN_OR_RETURN(Node * rhs, b_.Convert(contribution, wide));
    ASSIGN_OR_RETURN(sum, b_.Named(absl::StrCat(target->name(), ".grad")).Add(lhs, rhs));
    b_.set_scope(saved_scope);
    return absl::OkStatus();
  }

 private:
  Builder& b_;
  absl::flat_hash_map<const Node*, Node*> sums_;
};

absl::Status Backpropagate(Builder& b, const std::vector<Node*>& forward, Node* loss,
                           const absl::flat_hash_set<const Node*>& active, CotangentTable& cotangents) {
  const auto loss_at = std::find(forward.begin(), forward.end(), loss);
  for (auto it = std::make_reverse_iterator(loss_at + 1); it != forward.rend(); ++it) {
    Node* node = *it;
    // A get_result's cotangent is its multi-result node's, for that result: the node's rule
    // takes one per result.
    if (node->opcode() == Opcode::kGetResult || !active.contains(node)) continue;
    std::vector<Node*> results_cotangents(node->num_results(), nullptr);
    bool any = false;
    for (int r = 0; r < node->num_results(); ++r) {
      results_cotangents[r] = cotangents.Get(node->has_multiple_results() ? node->result(r) : node);
      any |= results_cotangents[r] != nullptr;
    }
    if (!any) continue;
    const VjpRow* row = FindVjpRow(node->opcode());
    if (row == nullptr) {
      return absl::UnimplementedError(absl::StrCat("AppendBackward in @", node->parent()->name(), ": op ",
                                                   node->op_name(), " (node %", node->name(), ") has no VJP rule"));
    }
    b.set_scope(node->scope());
    if (row->cotangent_type == CotangentType::kNodeType) {
      for (int r = 0; r < node->num_results(); ++r) {
        if (results_cotangents[r] == nullptr) continue;
        ASSIGN_OR_RETURN(results_cotangents[r], b.Convert(results_cotangents[r], node->result_type(r).dtype));
      }
    }
    VjpArgs args{&b, node, results_cotangents[0], std::vector<bool>(node->num_operands()), results_cotangents};
    for (int i = 0; i < node->num_operands(); ++i) args.wanted[i] = active.contains(node->operand(i));
    absl::StatusOr<std::vector<Node*>> contributions = row->rule(args);
    if (!contributions.ok()) {
      return absl::Status(contributions.status().code(),
                          absl::StrCat("VJP of ", node->op_name(), " %", node->name(), " in @",
                                       node->parent()->name(), ": ", contributions.status().message()));
    }
    for (int i = 0; i < node->num_operands(); ++i) {
      Node* contribution = i < static_cast<int>(contributions->size()) ? (*contributions)[i] : nullptr;
      if (!args.wanted[i] || contribution == nullptr) continue;
      Node* operand = node->operand(i);
      if (contribution->type().dims != operand->type().dims || !IsFloat(contribution->type().dtype)) {
        return absl::InternalError(absl::StrCat("VJP of ", node->op_name(), " %", node->name(), " gave operand ", i,
                                                " a cotangent ", contribution->type().ToString(), " for ",
                                                operand->type().ToString()));
      }
      RETURN_IF_ERROR(cotangents.Accumulate(operand, contribution));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool HasVjpRule(Opcode op) { return FindVjpRow(op) != nullptr; }

absl::StatusOr<std::vector<Node*>> AppendBackward(Function& f, Node* loss, absl::Span<Node* const> wrt) {
  RETURN_IF_ERROR(CheckRequest(f, loss, wrt));
  std::vector<Node*> forward;
  for (const auto& n : f.nodes()) forward.push_back(n.get());
  const absl::flat_hash_set<const Node*> active = ActiveNodes(forward, loss, wrt);

  Builder b(&f);
  CotangentTable cotangents(b);
  absl::Status status = [&]() -> absl::Status {
    if (!active.empty()) {
      b.set_scope(loss->scope());
      ASSIGN_OR_RETURN(Node * seed, b.Named(absl::StrCat(loss->name(), ".grad")).Constant(1.0, loss->type()));
      RETURN_IF_ERROR(cotangents.Accumulate(loss, seed));
      RETURN_IF_ERROR(Backpropagate(b, forward, loss, active, cotangents));
    }
    return absl::OkStatus();
  }();
  std::vector<Node*> grads;
  for (Node* n : wrt) {
    if (!status.ok()) break;
    b.set_scope(n->scope());
    Node* g = cotangents.Get(n);
    absl::StatusOr<Node*> grad = g != nullptr ? b.Convert(g, n->type().dtype)
                                              : b.Named(absl::StrCat(n->name(), ".grad")).Constant(0.0, n->type());
    status = grad.status();
    if (grad.ok()) grads.push_back(*grad);
  }
  if (!status.ok()) {
    // Leave `f` as it was: drop every node appended since the snapshot (none is an output).
    std::vector<Node*> appended;
    for (size_t i = forward.size(); i < f.nodes().size(); ++i) appended.push_back(f.nodes()[i].get());
    f.RemoveNodes(appended);
    return status;
  }
  return grads;
}

absl::StatusOr<Function*> BuildGradientFunction(Module& m, const Function& forward, int loss_output,
                                                absl::Span<const int64_t> wrt_params, std::string name) {
  const std::string where = absl::StrCat("BuildGradientFunction(@", forward.name(), " -> @", name, ")");
  if (loss_output < 0 || loss_output >= static_cast<int>(forward.outputs().size())) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": loss output ", loss_output, " out of range; @",
                                                   forward.name(), " has ", forward.outputs().size(), " outputs"));
  }
  const std::vector<Node*> params = forward.parameters();
  for (int64_t p : wrt_params) {
    if (p < 0 || p >= static_cast<int64_t>(params.size())) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": parameter ", p, " out of range; @", forward.name(),
                                                     " has ", params.size(), " parameters"));
    }
  }
  Function* g = m.AddFunction(name);
  if (g == nullptr) return absl::AlreadyExistsError(absl::StrCat(where, ": a function @", name, " exists already"));

  absl::flat_hash_map<const Node*, Node*> copy_of;
  for (const auto& n : forward.nodes()) {
    std::vector<Node*> operands;
    for (const Node* operand : n->operands()) operands.push_back(copy_of.at(operand));
    Node* copy = g->AppendNodeWithTypes(n->id(), n->opcode(), std::move(operands), n->attrs(), n->result_types(),
                                        n->name(), n->scope());
    KILN_CHECK(copy != nullptr);  // ids and names were unique in `forward`
    if (n->body() != nullptr) copy->set_body(CloneFunction(*n->body(), n->body()->name()));
    copy_of[n.get()] = copy;
  }
  Node* loss = copy_of.at(forward.outputs()[loss_output]);
  std::vector<Node*> wrt;
  for (int64_t p : wrt_params) wrt.push_back(copy_of.at(params[p]));

  absl::StatusOr<std::vector<Node*>> grads = AppendBackward(*g, loss, wrt);
  if (!grads.ok()) {
    m.RemoveFunction(name);
    return absl::Status(grads.status().code(), absl::StrCat(where, ": ", grads.status().message()));
  }
  std::vector<Node*> outputs = {loss};
  outputs.insert(outputs.end(), grads->begin(), grads->end());
  g->SetOutputs(std::move(outputs));
  return g;
}

}  // namespace kiln
