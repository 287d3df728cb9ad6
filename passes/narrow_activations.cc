#include "passes/narrow_activations.h"

#include <algorithm>
#include <vector>

#include "ir/pattern_match.h"

namespace kiln {
namespace {

namespace m = match;

bool IsOutput(const Function& f, const Node& n) {
  return std::find(f.outputs().begin(), f.outputs().end(), &n) != f.outputs().end();
}

bool HasFp8Slots(const Node& n) {
  for (const char* slot : {"scaled", "amax"}) {
    if (n.attrs().Has(slot) && *n.attrs().GetInt(slot) != 0) return true;
  }
  return false;
}

// A gemm that may write bf16 instead of its f32 result.
m::Pattern NarrowableGemm() {
  return m::Op(Opcode::kGemm)
      .WithNumOperands(2)
      .WithDType(DType::kF32)
      .WithAttr("beta", 0.0)
      .WithOperand(0, m::Any().WithDType(DType::kBF16))
      .WithOperand(1, m::Any().WithDType(DType::kBF16))
      .Where("without FP8 slots", [](const Node& n) { return !HasFp8Slots(n); })
      .Where("not a function output", [](const Node& n) { return !IsOutput(*n.parent(), n); })
      .Where("read only by converts to bf16", [](const Node& n) {
        return !n.users().empty() && std::all_of(n.users().begin(), n.users().end(), [](const Node* u) {
          return u->opcode() == Opcode::kConvert && u->type().dtype == DType::kBF16;
        });
      });
}

}  // namespace

absl::StatusOr<bool> NarrowActivationsPass::RunOnFunction(Function& f) {
  const m::Pattern narrowable = NarrowableGemm();
  std::vector<Node*> gemms;
  for (const auto& n : f.nodes()) {
    if (m::Match(n.get(), narrowable)) gemms.push_back(n.get());
  }
  for (Node* gemm : gemms) {
    TensorType narrow = gemm->type();
    narrow.dtype = DType::kBF16;
    gemm->set_type(narrow);
    const std::vector<Node*> converts = gemm->users();  // a copy (each convert once: one operand)
    for (Node* convert : converts) {
      convert->ReplaceAllUsesWith(gemm);
      f.RemoveNode(convert);
    }
  }
  return !gemms.empty();
}

}  // namespace kiln
