#include "passes/group_optimizer_updates.h"

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace kiln {
namespace {

constexpr int kStateOperands = 4;  // p, g, m, v of a one-group update; the scalars follow
constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

absl::flat_hash_map<const Node*, int64_t> Positions(const Function& f) {
  absl::flat_hash_map<const Node*, int64_t> pos;
  for (size_t i = 0; i < f.nodes().size(); ++i) pos[f.nodes()[i].get()] = static_cast<int64_t>(i);
  return pos;
}

// A one-group update and where it may go: after `earliest` (the position of the last node it
// needs before it), before `latest` (its results' first reader, kNever when only outputs read
// them); `ready` orders the members (the last of its own p, g, m, v).
struct Update {
  Node* node = nullptr;
  int64_t earliest = -1, latest = kNever, ready = -1, position = 0;
  Node* anchor = nullptr;  // the node at `earliest`
};

Update Describe(Node* node, const absl::flat_hash_map<const Node*, int64_t>& pos,
                const absl::flat_hash_set<const Node*>& updates) {
  Update u{.node = node, .position = pos.at(node)};
  auto need = [&](Node* n) {
    if (pos.at(n) > u.earliest) {
      u.earliest = pos.at(n);
      u.anchor = n;
    }
  };
  for (int i = 0; i < node->num_operands(); ++i) {
    need(node->operand(i));
    if (i < kStateOperands) u.ready = std::max(u.ready, pos.at(node->operand(i)));
  }
  // Other readers of p, m and v that ran before this update still run before its group, so
  // its results can still take those buffers.
  for (int i : {0, 2, 3}) {
    for (Node* reader : node->operand(i)->users()) {
      if (reader != node && !updates.contains(reader) && pos.at(reader) < u.position) need(reader);
    }
  }
  for (int r = 0; r < node->num_results(); ++r) {
    for (const Node* user : node->result(r)->users()) u.latest = std::min(u.latest, pos.at(user));
  }
  return u;
}

// Whether `a` reads a result of `b` directly (a dependency the window check cannot see: the
// reader is the update itself, which moves).
bool ReadsResultOf(const Node& a, const Node& b) {
  for (const Node* x : a.operands()) {
    if (x->opcode() == Opcode::kGetResult && x->operand(0) == &b) return true;
  }
  return false;
}

// The node to insert a group before so that it comes just after `anchor`: past the get_result
// nodes that must stay right after their multi-result node, and past the groups this run has
// already put there (so groups keep the order they were made in: by class, then readiness).
// (Never past a group that reads a result of `members`: that one must follow.)
Node* InsertionPointAfter(const Function& f, const Node* anchor, const absl::flat_hash_set<const Node*>& built,
                          const std::vector<Node*>& members) {
  const absl::flat_hash_map<const Node*, int64_t> pos = Positions(f);
  auto skip = [&](const Node& n) {
    if (n.opcode() == Opcode::kGetResult) return true;
    if (!built.contains(&n)) return false;
    for (const Node* m : members) {
      if (ReadsResultOf(n, *m)) return false;
    }
    return true;
  };
  size_t i = static_cast<size_t>(pos.at(anchor)) + 1;
  while (i < f.nodes().size() && skip(*f.nodes()[i])) ++i;
  return i < f.nodes().size() ? f.nodes()[i].get() : nullptr;
}

// Replaces `members` (one-group updates, in group order) by one grouped node after `anchor`;
// records each removed result's replacement in `replaced`.
bool BuildGroup(Function& f, const std::vector<Node*>& members, const Node* anchor,
                absl::flat_hash_map<const Node*, Node*>& replaced, absl::flat_hash_set<const Node*>& built) {
  Node* before = InsertionPointAfter(f, anchor, built, members);
  if (before == nullptr) return false;  // the members come after the anchor: cannot happen
  const Node& first = *members[0];
  std::vector<Node*> operands;
  std::vector<TensorType> types;
  std::vector<std::string> names, final_names;
  for (Node* m : members) {
    for (int i = 0; i < kStateOperands; ++i) operands.push_back(m->operand(i));
    for (int r = 0; r < m->num_results(); ++r) {
      types.push_back(m->result_type(r));
      final_names.push_back(m->result(r)->name());
      names.push_back(f.UniqueName(absl::StrCat(final_names.back(), ".grouped")));
    }
  }
  for (int i = kStateOperands; i < first.num_operands(); ++i) operands.push_back(first.operand(i));
  std::vector<Node*> results = f.AppendMultiResultNode(Opcode::kAdamWUpdate, std::move(operands), first.attrs(),
                                                       std::move(types), names, first.scope(), before);
  if (results.empty()) return false;
  std::vector<Node*> dead;
  size_t k = 0;
  for (Node* m : members) {
    for (int r = 0; r < m->num_results(); ++r) {
      m->result(r)->ReplaceAllUsesWith(results[k]);  // outputs included
      replaced[m->result(r)] = results[k++];
      dead.push_back(m->result(r));
    }
    dead.push_back(m);
  }
  f.RemoveNodes(dead);
  built.insert(results[0]->operand(0));
  for (size_t i = 0; i < results.size(); ++i) f.RenameNode(results[i], final_names[i]);
  f.RenameNode(results[0]->operand(0), f.UniqueName(absl::StrCat(final_names[0], ".results")));
  return true;
}

}  // namespace

absl::StatusOr<bool> GroupOptimizerUpdatesPass::RunOnFunction(Function& f) {
  // Classes of one-group updates: the same scalar operands and attributes, in node order.
  using Key = std::pair<std::vector<int64_t>, std::string>;
  std::map<Key, std::vector<Node*>> classes;
  std::vector<Key> order;
  absl::flat_hash_set<const Node*> updates;
  for (const auto& n : f.nodes()) {
    if (n->opcode() != Opcode::kAdamWUpdate || n->num_results() != 3) continue;
    std::vector<int64_t> scalars;
    for (int i = kStateOperands; i < n->num_operands(); ++i) scalars.push_back(n->operand(i)->id());
    Key key{std::move(scalars), n->attrs().ToString()};
    auto [it, fresh] = classes.try_emplace(key);
    if (fresh) order.push_back(key);
    it->second.push_back(n.get());
    updates.insert(n.get());
  }
  bool changed = false;
  absl::flat_hash_set<const Node*> built;  // the grouped nodes made so far
  for (const Key& key : order) {
    const std::vector<Node*>& nodes = classes[key];
    if (nodes.size() < 2) continue;
    // Groups, decided on the positions before any of this class moves.
    std::vector<std::vector<Node*>> groups;
    std::vector<const Node*> anchors;
    {
      const absl::flat_hash_map<const Node*, int64_t> pos = Positions(f);
      std::vector<Update> members;
      for (Node* n : nodes) members.push_back(Describe(n, pos, updates));
      std::stable_sort(members.begin(), members.end(), [](const Update& a, const Update& b) {
        return std::tie(a.ready, a.position) < std::tie(b.ready, b.position);
      });
      int64_t earliest = -1, latest = kNever;
      for (const Update& u : members) {
        bool fits = !groups.empty() && static_cast<int64_t>(groups.back().size()) < max_groups_ &&
                    std::max(earliest, u.earliest) < std::min(latest, u.latest);
        if (fits) {
          for (const Node* m : groups.back()) fits &= !ReadsResultOf(*u.node, *m) && !ReadsResultOf(*m, *u.node);
        }
        if (!fits) {
          groups.emplace_back();
          anchors.push_back(nullptr);
          earliest = -1;
          latest = kNever;
        }
        groups.back().push_back(u.node);
        if (u.earliest > earliest) {
          earliest = u.earliest;
          anchors.back() = u.anchor;
        }
        latest = std::min(latest, u.latest);
      }
    }
    // An anchor may be a result of an update grouped just before (a function of two steps,
    // the second reading the first's p'): the grouped node's result stands in for it.
    absl::flat_hash_map<const Node*, Node*> replaced;
    for (size_t g = 0; g < groups.size(); ++g) {
      if (groups[g].size() < 2 || anchors[g] == nullptr) continue;
      const Node* anchor = anchors[g];
      while (replaced.contains(anchor)) anchor = replaced.at(anchor);
      for (const Node* m : groups[g]) updates.erase(m);
      changed |= BuildGroup(f, groups[g], anchor, replaced, built);
    }
  }
  return changed;
}

}  // namespace kiln
