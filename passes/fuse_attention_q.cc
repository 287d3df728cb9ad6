#include "passes/fuse_attention_q.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "ir/fusion.h"
#include "ir/graph.h"
#include "ir/node_predicates.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

// The loop fusion computing `attention`'s q, when nothing else reads it; else null.
Node* QFusion(const Node& attention) {
  Node* q = attention.operand(0);
  if (q->opcode() != Opcode::kFusion || q->users().size() != 1 || q->has_multiple_results()) return nullptr;
  absl::StatusOr<FusionKind> kind = FusionKindOf(*q);
  if (!kind.ok() || *kind != FusionKind::kLoop || q->body() == nullptr || q->body()->outputs().size() != 1) {
    return nullptr;
  }
  if (IsFunctionOutput(*q)) return nullptr;  // returned too: it is stored anyway
  for (int i = 1; i < attention.num_operands(); ++i) {
    if (attention.operand(i) == q) return nullptr;
  }
  return q;
}

absl::Status Fuse(Function& f, Node* attention, Node* q) {
  const Function& old_body = *q->body();
  const std::vector<Node*> old_params = old_body.parameters();
  auto body = std::make_unique<Function>(FusionBodyName(attention->name()));
  absl::flat_hash_map<const Node*, Node*> copy_of;
  auto add_param = [&](int64_t index, const Node& like, const std::string& name) -> Node* {
    return body->AppendNode(Opcode::kParameter, {}, AttrMap{{"index", index}}, like.type(), name, like.scope());
  };
  for (size_t i = 0; i < old_params.size(); ++i) {
    Node* p = add_param(static_cast<int64_t>(i), *old_params[i], old_params[i]->name());
    if (p == nullptr) return absl::InternalError(absl::StrCat("fuse-attention-q: cannot copy %", old_params[i]->name()));
    copy_of[old_params[i]] = p;
  }
  // The attention's other operands (pools, tables, positions) follow the loop's parameters.
  std::vector<Node*> attention_operands = {nullptr};
  for (int i = 1; i < attention->num_operands(); ++i) {
    const Node& operand = *attention->operand(i);
    Node* p = add_param(static_cast<int64_t>(old_params.size()) + i - 1, operand, body->UniqueName(operand.name()));
    if (p == nullptr) return absl::InternalError(absl::StrCat("fuse-attention-q: cannot add %", operand.name()));
    attention_operands.push_back(p);
  }
  for (const auto& n : old_body.nodes()) {
    if (n->opcode() == Opcode::kParameter) continue;
    std::vector<Node*> operands;
    for (Node* o : n->operands()) operands.push_back(copy_of.at(o));
    Node* copy = body->AppendNode(n->opcode(), std::move(operands), n->attrs(), n->type(), n->name(), n->scope());
    if (copy == nullptr) return absl::InternalError(absl::StrCat("fuse-attention-q: cannot copy %", n->name()));
    copy_of[n.get()] = copy;
  }
  attention_operands[0] = copy_of.at(old_body.outputs()[0]);
  Node* computed = body->AppendNode(Opcode::kPagedAttention, std::move(attention_operands), attention->attrs(),
                                    attention->type(), body->UniqueName(attention->name()), attention->scope());
  if (computed == nullptr) return absl::InternalError(absl::StrCat("fuse-attention-q: cannot copy %", attention->name()));
  body->SetOutputs({computed});

  std::vector<Node*> operands = q->operands();
  for (int i = 1; i < attention->num_operands(); ++i) operands.push_back(attention->operand(i));
  const std::string name = attention->name();
  if (!f.RenameNode(attention, f.UniqueName(absl::StrCat(name, ".unfused")))) {
    return absl::InternalError(absl::StrCat("fuse-attention-q: cannot rename %", name));
  }
  std::vector<Node*> fusion = AddFusionNode(f, FusionKind::kAttentionQ, std::move(operands), std::move(body), {name},
                                            attention->scope(), attention);
  if (fusion.empty()) return absl::InternalError(absl::StrCat("fuse-attention-q: cannot add the fusion %", name));
  attention->ReplaceAllUsesWith(fusion[0]);
  f.RemoveNode(attention);
  f.RemoveNode(q);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<bool> FuseAttentionQPass::RunOnFunction(Function& f) {
  std::vector<std::pair<Node*, Node*>> matches;
  for (const auto& n : f.nodes()) {
    if (n->opcode() != Opcode::kPagedAttention) continue;
    if (Node* q = QFusion(*n)) matches.emplace_back(n.get(), q);
  }
  for (auto [attention, q] : matches) RETURN_IF_ERROR(Fuse(f, attention, q));
  return !matches.empty();
}

}  // namespace kiln
