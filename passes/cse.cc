#include "passes/cse.h"

#include <algorithm>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace kiln {
namespace {

// Whether swapping the two operands keeps the value, bit for bit. The reference semantics
// compute a+b, a*b exactly in double then round once, and max/min propagate NaN from either
// side, so these hold for every dtype.
bool IsCommutative(const Node& node) {
  switch (node.opcode()) {
    case Opcode::kAdd:
    case Opcode::kMul:
    case Opcode::kMax:
    case Opcode::kMin: return true;
    case Opcode::kCompare: {
      absl::StatusOr<std::string> dir = node.attrs().GetSymbol("direction");
      return dir.ok() && (*dir == "eq" || *dir == "ne");
    }
    default: return false;
  }
}

// A fusion's body by structure, not by names: each node's op, attributes, types and operands
// (by position in the body), then the outputs. Two fusions with equal bodies over the same
// operands compute the same values.
std::string BodyKey(const Function& body) {
  absl::flat_hash_map<const Node*, int64_t> position;
  std::string key = "{";
  for (const auto& n : body.nodes()) {
    absl::StrAppend(&key, static_cast<int>(n->opcode()), "(");
    for (const Node* o : n->operands()) absl::StrAppend(&key, position.at(o), ",");
    absl::StrAppend(&key, ")", n->attrs().ToString(), ":");
    for (const TensorType& t : n->result_types()) absl::StrAppend(&key, t.ToString(), ";");
    position[n.get()] = static_cast<int64_t>(position.size());
  }
  key += "->";
  for (const Node* out : body.outputs()) absl::StrAppend(&key, position.at(out), ",");
  return key + "}";
}

// Two nodes compute the same value iff their keys are equal. Attributes print doubles in a
// form that reads back to the same bits (so -0.0 and 0.0 differ), hence the printed form is
// an exact key.
std::string ValueKey(const Node& node) {
  std::vector<int64_t> operand_ids;
  for (const Node* operand : node.operands()) operand_ids.push_back(operand->id());
  if (IsCommutative(node)) std::sort(operand_ids.begin(), operand_ids.end());
  std::string key = absl::StrCat(static_cast<int>(node.opcode()), "(");
  for (int64_t id : operand_ids) absl::StrAppend(&key, id, ",");
  absl::StrAppend(&key, ")", node.attrs().ToString(), ":");
  for (const TensorType& t : node.result_types()) absl::StrAppend(&key, t.ToString(), ";");
  if (node.body() != nullptr) key += BodyKey(*node.body());
  return key;
}

}  // namespace

bool EliminateCommonSubexpressions(Function& function) {
  absl::flat_hash_map<std::string, Node*> first_with_key;
  std::vector<Node*> duplicates;
  // Operands of a node are replaced by their survivors before the node is keyed (they come
  // earlier), so chains of duplicates collapse in this one sweep. A duplicate multi-result
  // node hands its get_result nodes to the survivor, and they, coming next, are duplicates
  // of the survivor's own: the group goes as a whole.
  for (const auto& owned : function.nodes()) {
    Node* node = owned.get();
    if (node->opcode() == Opcode::kParameter) continue;
    auto [it, inserted] = first_with_key.try_emplace(ValueKey(*node), node);
    if (inserted) continue;
    node->ReplaceAllUsesWith(it->second);
    duplicates.push_back(node);
  }
  if (duplicates.empty()) return false;
  function.RemoveNodes(duplicates);
  return true;
}

absl::StatusOr<bool> CsePass::RunOnFunction(Function& function) { return EliminateCommonSubexpressions(function); }

}  // namespace kiln
