#include "passes/dce.h"

#include "absl/container/flat_hash_set.h"

namespace kiln {

bool RemoveDeadNodes(Function& function) {
  // Nodes come in definition order, so one backward sweep sees every user of a node before
  // the node itself: a node is live iff it is an output or a live node uses it. The results
  // of a live multi-result node stay, used or not: the node and its get_result nodes are one
  // group (ir/graph.h), so a second, forward sweep revives them.
  absl::flat_hash_set<const Node*> live(function.outputs().begin(), function.outputs().end());
  const auto& nodes = function.nodes();
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    Node* node = it->get();
    if (live.contains(node) || node->opcode() == Opcode::kParameter) {
      live.insert(node);
      for (const Node* operand : node->operands()) live.insert(operand);
    }
  }
  std::vector<Node*> dead;
  for (const auto& node : nodes) {
    if (node->opcode() == Opcode::kGetResult && live.contains(node->operand(0))) live.insert(node.get());
    if (!live.contains(node.get())) dead.push_back(node.get());
  }
  if (dead.empty()) return false;
  function.RemoveNodes(dead);
  return true;
}

absl::StatusOr<bool> DcePass::RunOnFunction(Function& function) { return RemoveDeadNodes(function); }

}  // namespace kiln
