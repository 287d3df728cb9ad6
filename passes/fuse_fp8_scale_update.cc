#include "passes/fuse_fp8_scale_update.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ir/fp8_scaling.h"
#include "ir/status_macros.h"
#include "passes/fp8_quantize_rebuild.h"

namespace kiln {
namespace {

// The fp8_quantize whose amax `update` reads, when the pass may fuse the two; else null.
absl::StatusOr<Node*> FusableQuantize(const Node& update) {
  const Node* state = update.operand(0);
  const Node* amax = update.operand(1);
  if (amax->opcode() != Opcode::kGetResult || amax->result_index() != Fp8QuantizeResults::kAmax) return nullptr;
  Node* quantize = amax->operand(0);
  if (quantize->opcode() != Opcode::kFp8Quantize || quantize->operand(1) != state) return nullptr;
  ASSIGN_OR_RETURN(const Fp8QuantizeResults layout, Fp8QuantizeResultsOf(quantize->attrs()));
  if (layout.updates_state()) return nullptr;
  ASSIGN_OR_RETURN(const DType out_dtype, quantize->attrs().GetDType("out_dtype"));
  ASSIGN_OR_RETURN(const DType format, update.attrs().GetDType("fp8_format"));
  if (out_dtype != format) return nullptr;
  for (const Node* user : state->users()) {
    if (user != quantize && user->opcode() == Opcode::kFp8Quantize) return nullptr;
  }
  return quantize;
}

}  // namespace

absl::StatusOr<bool> FuseFp8ScaleUpdatePass::RunOnFunction(Function& f) {
  std::vector<Node*> updates;
  for (const auto& n : f.nodes()) {
    if (n->opcode() == Opcode::kFp8ScaleUpdate) updates.push_back(n.get());
  }
  bool changed = false;
  for (Node* update : updates) {
    ASSIGN_OR_RETURN(Node * quantize, FusableQuantize(*update));
    if (quantize == nullptr) continue;
    ASSIGN_OR_RETURN(const int64_t margin, update->attrs().GetInt("margin"));
    AttrMap attrs = quantize->attrs();
    attrs.Set("update_state", int64_t{1});
    attrs.Set("margin", margin);
    ASSIGN_OR_RETURN(std::vector<Node*> results, RebuildFp8Quantize(f, quantize, std::move(attrs)));
    ASSIGN_OR_RETURN(const Fp8QuantizeResults layout, Fp8QuantizeResultsOf(results[0]->operand(0)->attrs()));
    Node* next_state = results[layout.next_state];
    const std::string name = update->name();
    update->ReplaceAllUsesWith(next_state);
    f.RemoveNode(update);
    f.RenameNode(next_state, name);
    changed = true;
  }
  return changed;
}

}  // namespace kiln
