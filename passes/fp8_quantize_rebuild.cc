#include "passes/fp8_quantize_rebuild.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "ir/fp8_scaling.h"
#include "ir/shape_inference.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

// The result index of each role (q, amax, scale_inv, q_t, next_state), -1 where absent.
std::vector<int> RoleIndices(const Fp8QuantizeResults& r) {
  return {Fp8QuantizeResults::kQ, Fp8QuantizeResults::kAmax, Fp8QuantizeResults::kScaleInv, r.q_t, r.next_state};
}

}  // namespace

absl::StatusOr<std::vector<Node*>> RebuildFp8Quantize(Function& f, Node* quantize, AttrMap attrs) {
  const std::string where = absl::StrCat("%", quantize->name(), " in @", f.name());
  if (quantize->opcode() != Opcode::kFp8Quantize) {
    return absl::InternalError(absl::StrCat(where, " is not an fp8_quantize"));
  }
  ASSIGN_OR_RETURN(const Fp8QuantizeResults old_layout, Fp8QuantizeResultsOf(quantize->attrs()));
  ASSIGN_OR_RETURN(const Fp8QuantizeResults new_layout, Fp8QuantizeResultsOf(attrs));
  const std::vector<int> old_roles = RoleIndices(old_layout), new_roles = RoleIndices(new_layout);
  std::vector<Node*> old(quantize->num_results(), nullptr);
  for (int i = 0; i < quantize->num_results(); ++i) old[i] = quantize->result(i);
  for (size_t role = 0; role < old_roles.size(); ++role) {
    if (old_roles[role] >= 0 && new_roles[role] < 0) {
      return absl::InternalError(absl::StrCat(where, ": a rebuilt fp8_quantize would lose a result"));
    }
  }

  std::vector<TensorType> operand_types;
  for (const Node* o : quantize->operands()) operand_types.push_back(o->type());
  ASSIGN_OR_RETURN(std::vector<TensorType> types,
                   InferResultTypes(Opcode::kFp8Quantize, operand_types, attrs, nullptr));
  const std::string q_name = old[0] != nullptr ? old[0]->name() : quantize->name();
  static constexpr const char* kNewSuffix[] = {"", ".amax", ".scale_inv", ".t", ".next_state"};
  std::vector<std::string> names(types.size());
  std::vector<std::string> final_names(types.size());
  for (size_t role = 0; role < new_roles.size(); ++role) {
    const int i = new_roles[role];
    if (i < 0) continue;
    const Node* before = old_roles[role] >= 0 ? old[old_roles[role]] : nullptr;
    final_names[i] = before != nullptr ? before->name() : f.UniqueName(absl::StrCat(q_name, kNewSuffix[role]));
    names[i] = f.UniqueName(absl::StrCat(final_names[i], ".tmp"));
  }
  const std::string node_name = quantize->name();
  std::vector<Node*> results = f.AppendMultiResultNode(Opcode::kFp8Quantize, quantize->operands(), std::move(attrs),
                                                       std::move(types), names, quantize->scope(), quantize);
  if (results.size() != names.size()) return absl::InternalError(absl::StrCat(where, ": cannot rebuild it"));
  Node* rebuilt = results[0]->operand(0);
  std::vector<Node*> dead{quantize};
  for (size_t role = 0; role < old_roles.size(); ++role) {
    Node* before = old_roles[role] >= 0 ? old[old_roles[role]] : nullptr;
    if (before == nullptr) continue;
    before->ReplaceAllUsesWith(results[new_roles[role]]);
    dead.push_back(before);
  }
  f.RemoveNodes(dead);
  for (size_t i = 0; i < results.size(); ++i) f.RenameNode(results[i], final_names[i]);
  f.RenameNode(rebuilt, node_name);
  return results;
}

}  // namespace kiln
