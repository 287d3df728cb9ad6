#include "passes/fuse_gemv_glu.h"

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

absl::Status Fuse(Function& f, Node* gemm, Node* loop) {
  const Function& old_body = *loop->body();
  auto body = std::make_unique<Function>(FusionBodyName(loop->name()));
  absl::flat_hash_map<const Node*, Node*> copy_of;
  std::vector<Node*> params;
  for (int i = 0; i < gemm->num_operands(); ++i) {
    ASSIGN_OR_RETURN(Node* p, AppendBodyParameter(*body, i, *gemm->operand(i), FuseGemvGluPass::kName));
    params.push_back(p);
  }
  Node* product = body->AppendNode(Opcode::kGemm, params, gemm->attrs(), gemm->type(), body->UniqueName(gemm->name()),
                                   gemm->scope());
  if (product == nullptr) return absl::InternalError(absl::StrCat("fuse-gemv-glu: cannot copy %", gemm->name()));
  copy_of[old_body.parameters()[0]] = product;
  ASSIGN_OR_RETURN(Node* out, CopyBodyOps(old_body, *body, copy_of, FuseGemvGluPass::kName));
  body->SetOutputs({out});
  return ReplaceWithFusion(f, loop, gemm, FusionKind::kGemvGlu, gemm->operands(), std::move(body),
                           FuseGemvGluPass::kName);
}

}  // namespace

bool IsGluGemmCandidate(const Node& gemm) {
  if (gemm.opcode() != Opcode::kGemm) return false;
  const AttrMap& a = gemm.attrs();
  const absl::StatusOr<int64_t> batch = a.GetInt("batch"), m = a.GetInt("m"), n = a.GetInt("n");
  const absl::StatusOr<std::string> al = a.GetSymbol("a_layout"), bl = a.GetSymbol("b_layout"),
                                    epilogue = a.GetSymbol("epilogue");
  const absl::StatusOr<GemmSlots> slots = GemmSlotsOf(a);
  if (!batch.ok() || !m.ok() || !n.ok() || !al.ok() || !bl.ok() || !epilogue.ok() || !slots.ok()) return false;
  if (*batch != 1 || *m < 1 || *m > kMaxRows || *n % 2 != 0 || *al != "mk" || *bl != "nk" || *epilogue != "none") {
    return false;
  }
  return slots->c < 0 && slots->bias < 0 && slots->a_scale < 0 && !slots->amax;
}

absl::StatusOr<bool> FuseGemvGluPass::RunOnFunction(Function& f) {
  std::vector<std::pair<Node*, Node*>> matches;  // (gemm, loop fusion)
  for (const auto& n : f.nodes()) {
    Node* loop = n.get();
    if (loop->opcode() != Opcode::kFusion || loop->has_multiple_results() || loop->operands().size() != 1) continue;
    const absl::StatusOr<FusionKind> kind = FusionKindOf(*loop);
    if (!kind.ok() || *kind != FusionKind::kLoop || loop->body() == nullptr) continue;
    Node* gemm = loop->operand(0);
    if (!IsGluGemmCandidate(*gemm) || gemm->users().size() != 1 || IsFunctionOutput(*gemm)) continue;
    const std::vector<Node*> params = loop->body()->parameters();
    if (params.size() != 1 || MatchSwiGlu(*loop->body(), *params[0]).out == nullptr) continue;
    matches.emplace_back(gemm, loop);
  }
  for (auto [gemm, loop] : matches) RETURN_IF_ERROR(Fuse(f, gemm, loop));
  return !matches.empty();
}

}  // namespace kiln
