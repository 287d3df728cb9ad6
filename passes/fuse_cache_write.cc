#include "passes/fuse_cache_write.h"

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

// The loop fusion computing `write`'s rows, when nothing else reads them; else null.
Node* RowsFusion(const Node& write) {
  Node* rows = write.operand(1);
  if (rows->opcode() != Opcode::kFusion || rows->users().size() != 1 || rows->has_multiple_results()) return nullptr;
  absl::StatusOr<FusionKind> kind = FusionKindOf(*rows);
  if (!kind.ok() || *kind != FusionKind::kLoop || rows->body() == nullptr || rows->body()->outputs().size() != 1) {
    return nullptr;
  }
  if (IsFunctionOutput(*rows)) return nullptr;  // returned too: it is stored anyway
  return rows;
}

absl::Status Fuse(Function& f, Node* write, Node* rows) {
  const Function& old_body = *rows->body();
  auto body = std::make_unique<Function>(FusionBodyName(write->name()));
  absl::flat_hash_map<const Node*, Node*> copy_of;
  RETURN_IF_ERROR(CopyBodyParameters(old_body, *body, copy_of, FuseCacheWritePass::kName));
  const int64_t pool_index = static_cast<int64_t>(old_body.parameters().size());
  ASSIGN_OR_RETURN(Node* pool, AppendBodyParameter(*body, pool_index, *write->operand(0), FuseCacheWritePass::kName));
  ASSIGN_OR_RETURN(Node* slots, AppendBodyParameter(*body, pool_index + 1, *write->operand(2), FuseCacheWritePass::kName));
  ASSIGN_OR_RETURN(Node* rows_copy, CopyBodyOps(old_body, *body, copy_of, FuseCacheWritePass::kName));
  Node* written = body->AppendNode(Opcode::kKvCacheWrite, {pool, rows_copy, slots},
                                   write->attrs(), write->type(), body->UniqueName(write->name()), write->scope());
  if (written == nullptr) return absl::InternalError(absl::StrCat("fuse-cache-write: cannot copy %", write->name()));
  body->SetOutputs({written});

  std::vector<Node*> operands = rows->operands();
  operands.push_back(write->operand(0));
  operands.push_back(write->operand(2));
  return ReplaceWithFusion(f, write, rows, FusionKind::kCacheWrite, std::move(operands), std::move(body),
                           FuseCacheWritePass::kName);
}

}  // namespace

absl::StatusOr<bool> FuseCacheWritePass::RunOnFunction(Function& f) {
  std::vector<std::pair<Node*, Node*>> matches;
  for (const auto& n : f.nodes()) {
    if (n->opcode() != Opcode::kKvCacheWrite) continue;
    if (Node* rows = RowsFusion(*n)) matches.emplace_back(n.get(), rows);
  }
  for (auto [write, rows] : matches) RETURN_IF_ERROR(Fuse(f, write, rows));
  return !matches.empty();
}

}  // namespace kiln
