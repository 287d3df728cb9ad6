#include "passes/fuse_gemv_norm.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "ir/fusion.h"
#include "ir/gemm_slots.h"
#include "ir/node_predicates.h"
#include "ir/status_macros.h"
#include "passes/extend_fusion.h"

namespace kiln {
namespace {

// The rows SmallMGemm takes (codegen/lower_gemv.h's kSmallMGemmMaxRows; codegen checks again).
constexpr int64_t kMaxRows = 8;

// A gemm SmallMGemm takes, as far as the IR says, with an f32 D: batch 1, at most 8 rows,
// a_layout=mk, b_layout=nk, no epilogue, scales or amax (C allowed).
bool IsNormGemmCandidate(const Node& gemm) {
  if (gemm.opcode() != Opcode::kGemm || gemm.type().dtype != DType::kF32) return false;
  const AttrMap& a = gemm.attrs();
  const absl::StatusOr<int64_t> batch = a.GetInt("batch"), m = a.GetInt("m");
  const absl::StatusOr<std::string> al = a.GetSymbol("a_layout"), bl = a.GetSymbol("b_layout"),
                                    epilogue = a.GetSymbol("epilogue");
  const absl::StatusOr<GemmSlots> slots = GemmSlotsOf(a);
  if (!batch.ok() || !m.ok() || !al.ok() || !bl.ok() || !epilogue.ok() || !slots.ok()) return false;
  if (*batch != 1 || *m < 1 || *m > kMaxRows || *al != "mk" || *bl != "nk" || *epilogue != "none") return false;
  return slots->bias < 0 && slots->a_scale < 0 && !slots->amax;
}

// The one rms_norm of `gemm`'s result by a parameter's weight, or null.
Node* NormOf(const Node& gemm) {
  Node* norm = nullptr;
  for (Node* user : gemm.users()) {
    if (user->opcode() != Opcode::kRmsNorm || user->operand(0) != &gemm) continue;
    if (user->operand(1)->opcode() != Opcode::kParameter || IsFunctionOutput(*user)) continue;
    if (norm != nullptr) return nullptr;  // two norms of one value: left apart
    norm = user;
  }
  return norm;
}

absl::Status Fuse(Function& f, Node* gemm, Node* norm) {
  constexpr absl::string_view kPass = FuseGemvNormPass::kName;
  auto body = std::make_unique<Function>(FusionBodyName(gemm->name()));
  std::vector<Node*> operands(gemm->operands().begin(), gemm->operands().end());
  std::vector<Node*> params;
  for (size_t i = 0; i < operands.size(); ++i) {
    ASSIGN_OR_RETURN(Node* p, AppendBodyParameter(*body, static_cast<int64_t>(i), *operands[i], kPass));
    params.push_back(p);
  }
  ASSIGN_OR_RETURN(Node* weight,
                   AppendBodyParameter(*body, static_cast<int64_t>(operands.size()), *norm->operand(1), kPass));
  operands.push_back(norm->operand(1));
  Node* product = body->AppendNode(Opcode::kGemm, params, gemm->attrs(), gemm->type(), body->UniqueName(gemm->name()),
                                   gemm->scope());
  if (product == nullptr) return absl::InternalError(absl::StrCat(kPass, ": cannot copy %", gemm->name()));
  Node* normed = body->AppendNode(Opcode::kRmsNorm, {product, weight}, norm->attrs(), norm->type(),
                                  body->UniqueName(norm->name()), norm->scope());
  if (normed == nullptr) return absl::InternalError(absl::StrCat(kPass, ": cannot copy %", norm->name()));
  body->SetOutputs({product, normed});
  const std::vector<std::string> names = {gemm->name(), norm->name()};
  for (Node* old : {gemm, norm}) {
    if (!f.RenameNode(old, f.UniqueName(absl::StrCat(old->name(), ".unfused")))) {
      return absl::InternalError(absl::StrCat(kPass, ": cannot rename %", old->name()));
    }
  }
  const std::vector<Node*> results =
      AddFusionNode(f, FusionKind::kGemvNorm, std::move(operands), std::move(body), names, gemm->scope(), gemm);
  if (results.size() != 2) return absl::InternalError(absl::StrCat(kPass, ": cannot add the fusion %", names[0]));
  norm->ReplaceAllUsesWith(results[1]);
  f.RemoveNode(norm);
  gemm->ReplaceAllUsesWith(results[0]);
  f.RemoveNode(gemm);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<bool> FuseGemvNormPass::RunOnFunction(Function& f) {
  std::vector<std::pair<Node*, Node*>> matches;  // (gemm, norm)
  for (const auto& n : f.nodes()) {
    if (!IsNormGemmCandidate(*n)) continue;
    if (Node* norm = NormOf(*n); norm != nullptr) matches.emplace_back(n.get(), norm);
  }
  for (auto [gemm, norm] : matches) RETURN_IF_ERROR(Fuse(f, gemm, norm));
  return !matches.empty();
}

}  // namespace kiln
