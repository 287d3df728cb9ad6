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
#include "passes/extend_fusion.h"

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
  auto body = std::make_unique<Function>(FusionBodyName(attention->name()));
  absl::flat_hash_map<const Node*, Node*> copy_of;
  RETURN_IF_ERROR(CopyBodyParameters(old_body, *body, copy_of, FuseAttentionQPass::kName));
  // The attention's other operands (pools, tables, positions) follow the loop's parameters.
  const int64_t first = static_cast<int64_t>(old_body.parameters().size());
  std::vector<Node*> attention_operands = {nullptr};
  for (int i = 1; i < attention->num_operands(); ++i) {
    ASSIGN_OR_RETURN(Node* p, AppendBodyParameter(*body, first + i - 1, *attention->operand(i), FuseAttentionQPass::kName));
    attention_operands.push_back(p);
  }
  ASSIGN_OR_RETURN(attention_operands[0], CopyBodyOps(old_body, *body, copy_of, FuseAttentionQPass::kName));
  Node* computed = body->AppendNode(Opcode::kPagedAttention, std::move(attention_operands), attention->attrs(),
                                    attention->type(), body->UniqueName(attention->name()), attention->scope());
  if (computed == nullptr) return absl::InternalError(absl::StrCat("fuse-attention-q: cannot copy %", attention->name()));
  body->SetOutputs({computed});

  std::vector<Node*> operands = q->operands();
  for (int i = 1; i < attention->num_operands(); ++i) operands.push_back(attention->operand(i));
  return ReplaceWithFusion(f, attention, q, FusionKind::kAttentionQ, std::move(operands), std::move(body),
                           FuseAttentionQPass::kName);
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
