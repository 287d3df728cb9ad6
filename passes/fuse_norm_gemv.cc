#include "passes/fuse_norm_gemv.h"

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
// The normalized A a GEMV block holds in shared memory (kernels/gemv.cuh, RmsNormA's
// kMaxTileBytes): past it each chunk would be formed in the GEMV's inner loop, more
// instructions a weight byte than measured; those norms keep their kernel.
constexpr int64_t kMaxNormedABytes = 8 * 1024;

// A gemm SmallMGemm takes, as far as the IR says: batch 1, at most 8 rows, a_layout=mk,
// b_layout=nk, no epilogue, bias, scales or amax (C allowed).
bool IsGemvGemm(const Node& gemm) {
  if (gemm.opcode() != Opcode::kGemm) return false;
  const AttrMap& a = gemm.attrs();
  const absl::StatusOr<int64_t> batch = a.GetInt("batch"), m = a.GetInt("m");
  const absl::StatusOr<std::string> al = a.GetSymbol("a_layout"), bl = a.GetSymbol("b_layout"),
                                    epilogue = a.GetSymbol("epilogue");
  const absl::StatusOr<GemmSlots> slots = GemmSlotsOf(a);
  if (!batch.ok() || !m.ok() || !al.ok() || !bl.ok() || !epilogue.ok() || !slots.ok()) return false;
  if (*batch != 1 || *m < 1 || *m > kMaxRows || *al != "mk" || *bl != "nk" || *epilogue != "none") return false;
  return slots->bias < 0 && slots->a_scale < 0 && !slots->amax;
}

// The GEMV reading `norm` as its A alone (a gemm, or a gemv_glu fusion), or null.
Node* GemvOf(const Node& norm) {
  if (norm.opcode() != Opcode::kRmsNorm || norm.has_multiple_results() || norm.users().size() != 1 ||
      IsFunctionOutput(norm)) {
    return nullptr;
  }
  Node* user = norm.users()[0];
  if (user->operand(0) != &norm) return nullptr;
  for (int i = 1; i < user->num_operands(); ++i) {
    if (user->operand(i) == &norm) return nullptr;
  }
  if (norm.type().num_bytes() > kMaxNormedABytes) return nullptr;
  if (user->opcode() == Opcode::kGemm) return IsGemvGemm(*user) ? user : nullptr;
  if (user->opcode() == Opcode::kFusion && !user->has_multiple_results() &&
      FusionKindOf(*user).value_or(FusionKind::kLoop) == FusionKind::kGemvGlu) {
    return user;
  }
  return nullptr;
}

absl::Status Fuse(Function& f, Node* norm, Node* gemv) {
  constexpr absl::string_view kPass = FuseNormGemvPass::kName;
  auto body = std::make_unique<Function>(FusionBodyName(gemv->name()));
  std::vector<Node*> operands = {norm->operand(0), norm->operand(1)};
  for (int i = 1; i < gemv->num_operands(); ++i) operands.push_back(gemv->operand(i));
  std::vector<Node*> params;
  for (size_t i = 0; i < operands.size(); ++i) {
    ASSIGN_OR_RETURN(Node* p, AppendBodyParameter(*body, static_cast<int64_t>(i), *operands[i], kPass));
    params.push_back(p);
  }
  Node* normed = body->AppendNode(Opcode::kRmsNorm, {params[0], params[1]}, norm->attrs(), norm->type(),
                                  body->UniqueName(norm->name()), norm->scope());
  if (normed == nullptr) return absl::InternalError(absl::StrCat(kPass, ": cannot copy %", norm->name()));
  Node* out = nullptr;
  if (gemv->opcode() == Opcode::kGemm) {
    std::vector<Node*> gemm_operands = {normed};
    for (size_t i = 2; i < params.size(); ++i) gemm_operands.push_back(params[i]);
    out = body->AppendNode(Opcode::kGemm, gemm_operands, gemv->attrs(), gemv->type(), body->UniqueName(gemv->name()),
                           gemv->scope());
    if (out == nullptr) return absl::InternalError(absl::StrCat(kPass, ": cannot copy %", gemv->name()));
  } else {
    // The gemv_glu body's parameters are its operands: A (the norm's copy here), then the rest.
    const Function& old_body = *gemv->body();
    const std::vector<Node*> old_params = old_body.parameters();
    absl::flat_hash_map<const Node*, Node*> copy_of;
    copy_of[old_params[0]] = normed;
    for (size_t i = 1; i < old_params.size(); ++i) copy_of[old_params[i]] = params[i + 1];
    ASSIGN_OR_RETURN(out, CopyBodyOps(old_body, *body, copy_of, kPass));
  }
  body->SetOutputs({out});
  return ReplaceWithFusion(f, gemv, norm, FusionKind::kGemvNorm, std::move(operands), std::move(body), kPass);
}

}  // namespace

absl::StatusOr<bool> FuseNormGemvPass::RunOnFunction(Function& f) {
  std::vector<std::pair<Node*, Node*>> matches;  // (norm, gemv)
  for (const auto& n : f.nodes()) {
    if (Node* gemv = GemvOf(*n)) matches.emplace_back(n.get(), gemv);
  }
  for (auto [norm, gemv] : matches) RETURN_IF_ERROR(Fuse(f, norm, gemv));
  return !matches.empty();
}

}  // namespace kiln
