#include "passes/gemm_bias_epilogue.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ir/gemm_slots.h"
#include "ir/node_predicates.h"

namespace kiln {
namespace {

// The gemm of add(gemm, broadcast(b)) that may take b as its bias epilogue, or null.
Node* BiasableGemm(Node* candidate, const Node* add) {
  if (candidate->opcode() != Opcode::kGemm || candidate->type() != add->type() ||
      candidate->type().dtype != DType::kF32 || HasFp8Slots(*candidate) || candidate->users().size() != 1 ||
      IsFunctionOutput(*candidate)) {
    return nullptr;
  }
  absl::StatusOr<std::string> epilogue = candidate->attrs().GetSymbol("epilogue");
  return epilogue.ok() && *epilogue == "none" ? candidate : nullptr;
}

// b of broadcast(b) {dims=[rank-1]}, b f32 [n] with n the last dim of the result, or null.
Node* RowBias(Node* candidate, int64_t n) {
  if (candidate->opcode() != Opcode::kBroadcast) return nullptr;
  Node* b = candidate->operand(0);
  const TensorType& out = candidate->type();
  absl::StatusOr<std::vector<int64_t>> dims = candidate->attrs().GetInts("dims");
  if (!dims.ok() || out.rank() < 1 || *dims != std::vector<int64_t>{out.rank() - 1} || b->type().dtype != DType::kF32 ||
      b->type().dims != std::vector<int64_t>{n} || out.dims.back() != n) {
    return nullptr;
  }
  return b;
}

bool Fold(Function& f, Node* add) {
  for (int side : {0, 1}) {
    Node* gemm = BiasableGemm(add->operand(side), add);
    if (gemm == nullptr) continue;
    absl::StatusOr<int64_t> n = gemm->attrs().GetInt("n");
    if (!n.ok()) continue;
    Node* broadcast = add->operand(1 - side);
    Node* bias = RowBias(broadcast, *n);
    if (bias == nullptr) continue;
    AttrMap attrs = gemm->attrs();
    attrs.Set("epilogue", Symbol{"bias"});
    std::vector<Node*> operands = gemm->operands();
    absl::StatusOr<GemmSlots> slots = GemmSlotsOf(attrs);
    if (!slots.ok() || slots->bias != static_cast<int>(operands.size())) continue;
    operands.push_back(bias);
    const std::string name = add->name();
    Node* fused = f.InsertNodeBefore(add, Opcode::kGemm, std::move(operands), std::move(attrs), add->type(),
                                     f.UniqueName(absl::StrCat(name, ".bias")), gemm->scope());
    add->ReplaceAllUsesWith(fused);
    f.RemoveNode(add);
    f.RemoveNode(gemm);
    if (broadcast->users().empty() && !IsFunctionOutput(*broadcast)) f.RemoveNode(broadcast);
    f.RenameNode(fused, name);
    return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<bool> GemmBiasEpiloguePass::RunOnFunction(Function& f) {
  std::vector<Node*> adds;
  for (const auto& n : f.nodes()) {
    if (n->opcode() == Opcode::kAdd) adds.push_back(n.get());
  }
  bool changed = false;
  for (Node* add : adds) changed |= Fold(f, add);
  return changed;
}

}  // namespace kiln
