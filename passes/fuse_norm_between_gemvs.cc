#include "passes/fuse_norm_between_gemvs.h"

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
constexpr absl::string_view kPass = FuseNormBetweenGemvsPass::kName;

// A gemm SmallMGemm takes, as far as the IR says: batch 1, at most 8 rows, a_layout=mk,
// b_layout=nk, no epilogue, scales or amax (C allowed).
bool IsGemvCandidate(const Node& gemm) {
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

// The gemm a gemv_glu fusion holds, or null for any other node.
const Node* GluGemmOf(const Node& node) {
  if (node.opcode() != Opcode::kFusion || node.has_multiple_results() || node.body() == nullptr) return nullptr;
  const absl::StatusOr<FusionKind> kind = FusionKindOf(node);
  if (!kind.ok() || *kind != FusionKind::kGemvGlu) return nullptr;
  for (const auto& n : node.body()->nodes()) {
    if (n->opcode() == Opcode::kGemm) return n.get();
  }
  return nullptr;
}

struct Match {
  Node* first = nullptr;   // the gemm making x
  Node* norm = nullptr;    // rms_norm(x, w)
  Node* second = nullptr;  // the gemm of the norm, or the gemv_glu fusion holding it
};

// The norm of `first`'s result and the GEMV reading it, when they take this form.
bool MatchAt(Node* first, Match* match) {
  if (!IsGemvCandidate(*first) || first->type().dtype != DType::kF32) return false;
  for (Node* norm : first->users()) {
    if (norm->opcode() != Opcode::kRmsNorm || norm->operand(0) != first || norm->operand(1) == first ||
        norm->operand(1)->opcode() != Opcode::kParameter || norm->users().size() != 1 || IsFunctionOutput(*norm)) {
      continue;
    }
    Node* second = norm->users()[0];
    const Node* gemm = second->opcode() == Opcode::kGemm ? second : GluGemmOf(*second);
    if (gemm == nullptr || !IsGemvCandidate(*gemm) || second->operand(0) != norm) continue;
    bool parameters = true;  // the second's other operands: defined before the first
    for (int i = 1; i < second->num_operands(); ++i) {
      parameters &= second->operand(i)->opcode() == Opcode::kParameter;
    }
    if (!parameters) continue;
    *match = {first, norm, second};
    return true;
  }
  return false;
}

absl::Status Fuse(Function& f, const Match& match) {
  Node* first = match.first;
  Node* norm = match.norm;
  Node* second = match.second;
  auto body = std::make_unique<Function>(FusionBodyName(first->name()));
  std::vector<Node*> operands;
  auto parameter = [&](Node* operand) -> absl::StatusOr<Node*> {
    ASSIGN_OR_RETURN(Node* p, AppendBodyParameter(*body, static_cast<int64_t>(operands.size()), *operand, kPass));
    operands.push_back(operand);
    return p;
  };
  std::vector<Node*> first_params;
  for (Node* operand : first->operands()) {
    ASSIGN_OR_RETURN(Node* p, parameter(operand));
    first_params.push_back(p);
  }
  ASSIGN_OR_RETURN(Node* weight, parameter(norm->operand(1)));
  Node* x = body->AppendNode(Opcode::kGemm, first_params, first->attrs(), first->type(),
                             body->UniqueName(first->name()), first->scope());
  if (x == nullptr) return absl::InternalError(absl::StrCat(kPass, ": cannot copy %", first->name()));
  Node* normed = body->AppendNode(Opcode::kRmsNorm, {x, weight}, norm->attrs(), norm->type(),
                                  body->UniqueName(norm->name()), norm->scope());
  if (normed == nullptr) return absl::InternalError(absl::StrCat(kPass, ": cannot copy %", norm->name()));
  Node* last = nullptr;
  if (second->opcode() == Opcode::kGemm) {
    std::vector<Node*> second_params = {normed};
    for (int i = 1; i < second->num_operands(); ++i) {
      ASSIGN_OR_RETURN(Node* p, parameter(second->operand(i)));
      second_params.push_back(p);
    }
    last = body->AppendNode(Opcode::kGemm, second_params, second->attrs(), second->type(),
                            body->UniqueName(second->name()), second->scope());
    if (last == nullptr) return absl::InternalError(absl::StrCat(kPass, ": cannot copy %", second->name()));
  } else {
    // The gemv_glu fusion's body: its parameter 0 is the norm, the others the fusion's operands.
    const Function& glu_body = *second->body();
    absl::flat_hash_map<const Node*, Node*> copy_of;
    for (const Node* p : glu_body.parameters()) {
      ASSIGN_OR_RETURN(const int64_t index, p->attrs().GetInt("index"));
      if (index == 0) {
        copy_of[p] = normed;
      } else {
        ASSIGN_OR_RETURN(copy_of[p], parameter(second->operand(static_cast<int>(index))));
      }
    }
    ASSIGN_OR_RETURN(last, CopyBodyOps(glu_body, *body, copy_of, kPass));
  }
  body->SetOutputs({x, last});
  const std::vector<std::string> names = {first->name(), second->name()};
  for (Node* old : {first, second}) {
    if (!f.RenameNode(old, f.UniqueName(absl::StrCat(old->name(), ".unfused")))) {
      return absl::InternalError(absl::StrCat(kPass, ": cannot rename %", old->name()));
    }
  }
  const std::vector<Node*> results = AddFusionNode(f, FusionKind::kGemvNormGemv, std::move(operands), std::move(body),
                                                   names, first->scope(), first);
  if (results.size() != 2) return absl::InternalError(absl::StrCat(kPass, ": cannot add the fusion %", names[0]));
  second->ReplaceAllUsesWith(results[1]);
  f.RemoveNode(second);
  f.RemoveNode(norm);
  first->ReplaceAllUsesWith(results[0]);
  f.RemoveNode(first);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<bool> FuseNormBetweenGemvsPass::RunOnFunction(Function& f) {
  std::vector<Match> matches;
  absl::flat_hash_map<const Node*, bool> taken;  // a GEMV is the first of one match or the second of one
  for (const auto& n : f.nodes()) {
    Match match;
    if (!MatchAt(n.get(), &match) || taken[match.first] || taken[match.second]) continue;
    taken[match.first] = taken[match.second] = true;
    matches.push_back(match);
  }
  for (const Match& match : matches) RETURN_IF_ERROR(Fuse(f, match));
  return !matches.empty();
}

}  // namespace kiln
