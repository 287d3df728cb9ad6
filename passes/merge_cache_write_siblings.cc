#include "passes/merge_cache_write_siblings.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "ir/fusion.h"
#include "ir/graph.h"
#include "ir/status_macros.h"
#include "passes/extend_fusion.h"

namespace kiln {
namespace {

using NodeIndex = absl::flat_hash_map<const Node*, int64_t>;

// A fusion that may join a group: one result (returned or not: the merged node's result
// takes its place among the outputs), a cache_write or a loop fusion.
bool IsSibling(const Node& n) {
  if (n.opcode() != Opcode::kFusion || n.has_multiple_results() || n.body() == nullptr) {
    return false;
  }
  absl::StatusOr<FusionKind> kind = FusionKindOf(n);
  if (!kind.ok()) return false;
  return (*kind == FusionKind::kCacheWrite && n.body()->outputs().size() == 1) ||
         (*kind == FusionKind::kLoop && n.body()->outputs().size() == 1);
}

// The operand index of a one-output cache_write fusion's pool (its body's write's pool
// parameter), or -1 for a loop fusion.
int PoolOperand(const Node& n) {
  const Node* out = n.body()->outputs()[0];
  if (out->opcode() != Opcode::kKvCacheWrite) return -1;
  return static_cast<int>(out->operand(0)->attrs().GetInt("index").value_or(-1));
}

// Whether `group` (in definition order) may be computed by one node standing where its last
// member stands: every other member's users come after that place (so none reads another's
// result, directly or through other nodes), no two members write one pool, and no member reads
// a pool that a member writes other than as that write's own pool.
bool CanMerge(const std::vector<Node*>& group, const NodeIndex& index_of) {
  const int64_t last = index_of.at(group.back());
  for (size_t m = 0; m + 1 < group.size(); ++m) {
    for (const Node* user : group[m]->users()) {
      if (index_of.at(user) <= last) return false;
    }
  }
  absl::flat_hash_map<const Node*, const Node*> writer_of;  // pool -> the member writing it
  for (Node* m : group) {
    const int pool = PoolOperand(*m);
    if (pool < 0) continue;
    if (pool >= m->num_operands() || !writer_of.emplace(m->operand(pool), m).second) return false;
  }
  for (const Node* m : group) {
    for (int j = 0; j < m->num_operands(); ++j) {
      auto it = writer_of.find(m->operand(j));
      if (it != writer_of.end() && (it->second != m || j != PoolOperand(*m))) return false;
    }
  }
  return true;
}

// The siblings among `value`'s users not yet taken, in definition order, each kept when the
// group with it can still be merged.
std::vector<Node*> GroupOfUsers(const Node& value, const NodeIndex& index_of,
                                const absl::flat_hash_set<const Node*>& taken) {
  std::vector<Node*> candidates;
  for (Node* user : value.users()) {
    if (IsSibling(*user) && !taken.contains(user) &&
        std::find(candidates.begin(), candidates.end(), user) == candidates.end()) {
      candidates.push_back(user);
    }
  }
  std::sort(candidates.begin(), candidates.end(),
            [&](const Node* a, const Node* b) { return index_of.at(a) < index_of.at(b); });
  std::vector<Node*> group;
  for (Node* c : candidates) {
    group.push_back(c);
    if (!CanMerge(group, index_of)) group.pop_back();
  }
  bool writes = false;
  for (const Node* m : group) writes |= PoolOperand(*m) >= 0;
  if (group.size() < 2 || !writes) group.clear();
  return group;
}

// The groups to merge, largest first: a value many siblings read only in part together (the
// slots every layer's writes read, the RoPE table) must not take a layer's siblings before the
// value they all read (its qkv projection) groups them whole.
std::vector<std::vector<Node*>> FindGroups(const Function& f) {
  NodeIndex index_of;
  for (size_t i = 0; i < f.nodes().size(); ++i) index_of[f.nodes()[i].get()] = static_cast<int64_t>(i);
  absl::flat_hash_set<const Node*> taken;
  std::vector<std::vector<Node*>> groups;
  while (true) {
    std::vector<Node*> best;
    for (const auto& value : f.nodes()) {
      std::vector<Node*> group = GroupOfUsers(*value, index_of, taken);
      if (group.size() > best.size()) best = std::move(group);
    }
    if (best.empty()) return groups;
    for (const Node* m : best) taken.insert(m);
    groups.push_back(std::move(best));
  }
}

absl::Status Merge(Function& f, const std::vector<Node*>& group) {
  constexpr absl::string_view kPass = MergeCacheWriteSiblingsPass::kName;
  auto body = std::make_unique<Function>(FusionBodyName(group.front()->name()));
  std::vector<Node*> operands;
  absl::flat_hash_map<const Node*, Node*> param_of;  // the merged node's operand -> its body parameter
  std::vector<Node*> outputs;
  std::vector<std::string> names;
  for (Node* m : group) {
    const Function& old_body = *m->body();
    const std::vector<Node*> params = old_body.parameters();
    absl::flat_hash_map<const Node*, Node*> copy_of;
    for (size_t i = 0; i < params.size(); ++i) {
      Node* outer = m->operand(static_cast<int>(i));
      auto [it, added] = param_of.emplace(outer, nullptr);
      if (added) {
        ASSIGN_OR_RETURN(it->second,
                         AppendBodyParameter(*body, static_cast<int64_t>(operands.size()), *params[i], kPass));
        operands.push_back(outer);
      }
      copy_of[params[i]] = it->second;
    }
    ASSIGN_OR_RETURN(Node* out, CopyBodyOps(old_body, *body, copy_of, kPass));
    outputs.push_back(out);
    names.push_back(m->name());
    if (!f.RenameNode(m, f.UniqueName(absl::StrCat(m->name(), ".unfused")))) {
      return absl::InternalError(absl::StrCat(kPass, ": cannot rename %", m->name()));
    }
  }
  body->SetOutputs(outputs);
  const std::vector<Node*> results = AddFusionNode(f, FusionKind::kCacheWrite, std::move(operands), std::move(body),
                                                   names, group.front()->scope(), group.back());
  if (results.size() != group.size()) {
    return absl::InternalError(absl::StrCat(kPass, ": cannot add the fusion %", names.front()));
  }
  for (size_t k = 0; k < group.size(); ++k) {
    group[k]->ReplaceAllUsesWith(results[k]);
    f.RemoveNode(group[k]);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<bool> MergeCacheWriteSiblingsPass::RunOnFunction(Function& f) {
  const std::vector<std::vector<Node*>> groups = FindGroups(f);
  for (const std::vector<Node*>& group : groups) RETURN_IF_ERROR(Merge(f, group));
  return !groups.empty();
}

}  // namespace kiln
