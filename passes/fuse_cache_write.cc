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
  const std::vector<Node*> old_params = old_body.parameters();
  auto body = std::make_unique<Function>(FusionBodyName(write->name()));
  absl::flat_hash_map<const Node*, Node*> copy_of;
  auto add_param = [&](int64_t index, const Node& like, const std::string& name) -> Node* {
    return body->AppendNode(Opcode::kParameter, {}, AttrMap{{"index", index}}, like.type(), name, like.scope());
  };
  for (size_t i = 0; i < old_params.size(); ++i) {
    Node* p = add_param(static_cast<int64_t>(i), *old_params[i], old_params[i]->name());
    if (p == nullptr) return absl::InternalError(absl::StrCat("fuse-cache-write: cannot copy %", old_params[i]->name()));
    copy_of[old_params[i]] = p;
  }
  const int64_t pool_index = static_cast<int64_t>(old_params.size());
  Node* pool = add_param(pool_index, *write->operand(0), body->UniqueName(write->operand(0)->name()));
  Node* slots = add_param(pool_index + 1, *write->operand(2), body->UniqueName(write->operand(2)->name()));
  if (pool == nullptr || slots == nullptr) return absl::InternalError("fuse-cache-write: cannot add the pool and slots");
  for (const auto& n : old_body.nodes()) {
    if (n->opcode() == Opcode::kParameter) continue;
    std::vector<Node*> operands;
    for (Node* o : n->operands()) operands.push_back(copy_of.at(o));
    Node* copy = body->AppendNode(n->opcode(), std::move(operands), n->attrs(), n->type(), n->name(), n->scope());
    if (copy == nullptr) return absl::InternalError(absl::StrCat("fuse-cache-write: cannot copy %", n->name()));
    copy_of[n.get()] = copy;
  }
  Node* written = body->AppendNode(Opcode::kKvCacheWrite, {pool, copy_of.at(old_body.outputs()[0]), slots},
                                   write->attrs(), write->type(), body->UniqueName(write->name()), write->scope());
  if (written == nullptr) return absl::InternalError(absl::StrCat("fuse-cache-write: cannot copy %", write->name()));
  body->SetOutputs({written});

  std::vector<Node*> operands = rows->operands();
  operands.push_back(write->operand(0));
  operands.push_back(write->operand(2));
  const std::string name = write->name();
  if (!f.RenameNode(write, f.UniqueName(absl::StrCat(name, ".unfused")))) {
    return absl::InternalError(absl::StrCat("fuse-cache-write: cannot rename %", name));
  }
  std::vector<Node*> fusion =
      AddFusionNode(f, FusionKind::kCacheWrite, std::move(operands), std::move(body), {name}, write->scope(), write);
  if (fusion.empty()) return absl::InternalError(absl::StrCat("fuse-cache-write: cannot add the fusion %", name));
  write->ReplaceAllUsesWith(fusion[0]);
  f.RemoveNode(write);
  f.RemoveNode(rows);
  return absl::OkStatus();
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
