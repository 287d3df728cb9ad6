#include "passes/fuse_norm_gemm.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "ir/fusion.h"
#include "ir/graph.h"
#include "ir/node_predicates.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

// The rms_norm `gemm` reads as A and nothing else reads, when it rounds to an out_dtype (its
// x is then f32, the form the kernel normalizes); else null.
Node* NormOf(const Node& gemm) {
  Node* norm = gemm.operand(0);
  if (norm->opcode() != Opcode::kRmsNorm || !norm->attrs().GetSymbol("out_dtype").ok()) return nullptr;
  if (norm->users().size() != 1 || IsFunctionOutput(*norm)) return nullptr;
  for (size_t i = 1; i < gemm.operands().size(); ++i) {
    if (gemm.operand(i) == norm) return nullptr;  // read as B or C too
  }
  return norm;
}

absl::Status Fuse(Function& f, Node* gemm, Node* norm) {
  auto body = std::make_unique<Function>(FusionBodyName(gemm->name()));
  // The fusion's operands: the norm's x and w, then the gemm's B, C and any scales, each once.
  std::vector<Node*> operands;
  absl::flat_hash_map<const Node*, Node*> param_of;
  auto param = [&](Node* value) -> Node* {
    if (auto it = param_of.find(value); it != param_of.end()) return it->second;
    Node* p = body->AppendNode(Opcode::kParameter, {}, AttrMap{{"index", static_cast<int64_t>(operands.size())}},
                               value->type(), body->UniqueName(value->name()), value->scope());
    if (p == nullptr) return nullptr;
    operands.push_back(value);
    param_of[value] = p;
    return p;
  };
  std::vector<Node*> norm_operands;
  for (Node* o : norm->operands()) norm_operands.push_back(param(o));
  std::vector<Node*> gemm_operands = {nullptr};
  for (size_t i = 1; i < gemm->operands().size(); ++i) gemm_operands.push_back(param(gemm->operand(i)));
  for (Node* p : norm_operands) {
    if (p == nullptr) return absl::InternalError(absl::StrCat("fuse-norm-gemm: cannot add the parameters of %", norm->name()));
  }
  for (size_t i = 1; i < gemm_operands.size(); ++i) {
    if (gemm_operands[i] == nullptr) {
      return absl::InternalError(absl::StrCat("fuse-norm-gemm: cannot add the parameters of %", gemm->name()));
    }
  }
  Node* body_norm = body->AppendNode(Opcode::kRmsNorm, std::move(norm_operands), norm->attrs(), norm->type(),
                                     body->UniqueName(norm->name()), norm->scope());
  if (body_norm == nullptr) return absl::InternalError(absl::StrCat("fuse-norm-gemm: cannot copy %", norm->name()));
  gemm_operands[0] = body_norm;
  Node* body_gemm = body->AppendNode(Opcode::kGemm, std::move(gemm_operands), gemm->attrs(), gemm->type(),
                                     body->UniqueName(gemm->name()), gemm->scope());
  if (body_gemm == nullptr) return absl::InternalError(absl::StrCat("fuse-norm-gemm: cannot copy %", gemm->name()));
  body->SetOutputs({body_gemm});

  const std::string name = gemm->name();
  if (!f.RenameNode(gemm, f.UniqueName(absl::StrCat(name, ".unfused")))) {
    return absl::InternalError(absl::StrCat("fuse-norm-gemm: cannot rename %", name));
  }
  std::vector<Node*> fusion =
      AddFusionNode(f, FusionKind::kNormGemm, std::move(operands), std::move(body), {name}, gemm->scope(), gemm);
  if (fusion.empty()) return absl::InternalError(absl::StrCat("fuse-norm-gemm: cannot add the fusion %", name));
  gemm->ReplaceAllUsesWith(fusion[0]);
  f.RemoveNode(gemm);
  f.RemoveNode(norm);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<bool> FuseNormGemmPass::RunOnFunction(Function& f) {
  if (capabilities_ == nullptr) return false;
  std::vector<std::pair<Node*, Node*>> matches;
  for (const auto& n : f.nodes()) {
    if (n->opcode() != Opcode::kGemm) continue;
    Node* norm = NormOf(*n);
    if (norm == nullptr || !capabilities_->NormGemmUnsupportedReason(*n, target_).empty()) continue;
    matches.emplace_back(n.get(), norm);
  }
  for (auto [gemm, norm] : matches) RETURN_IF_ERROR(Fuse(f, gemm, norm));
  return !matches.empty();
}

}  // namespace kiln
