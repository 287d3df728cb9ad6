#include "passes/pass_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "passes/canonicalize.h"
#include "passes/chunk_lm_head.h"
#include "passes/cse.h"
#include "passes/dce.h"
#include "passes/default_pipeline.h"
#include "passes/elide_grad_zeroing.h"
#include "passes/expand_rope.h"
#include "passes/fuse_cache_write.h"
#include "passes/fuse_gemv_glu.h"
#include "passes/fuse_norm_between_gemvs.h"
#include "passes/fuse_fp8_scale_update.h"
#include "passes/fuse_residual_norm.h"
#include "passes/fusion.h"
#include "passes/gemm_bias_epilogue.h"
#include "passes/group_optimizer_updates.h"
#include "passes/lower_gemm.h"
#include "passes/merge_cache_write_siblings.h"
#include "passes/merge_sibling_gemms.h"
#include "passes/narrow_activations.h"
#include "passes/rematerialize.h"
#include "passes/select_flash_attention.h"
#include "passes/select_fp8_gemm.h"

namespace kiln {
namespace {

template <typename P>
std::unique_ptr<Pass> Make(const CompileOptions&) {
  return std::make_unique<P>();
}

std::unique_ptr<Pass> MakeChunkLmHead(const CompileOptions& options) {
  return std::make_unique<ChunkLmHeadPass>(options.lm_head_chunk_rows);
}

std::unique_ptr<Pass> MakeSelectFlashAttention(const CompileOptions& options) {
  return std::make_unique<SelectFlashAttentionPass>(options.capabilities, options.target.value_or(Target{}));
}

std::unique_ptr<Pass> MakeSelectFp8Gemm(const CompileOptions& options) {
  return std::make_unique<SelectFp8GemmPass>(options.capabilities, options.target.value_or(Target{}));
}

// Sorted by name.
constexpr PassInfo kPasses[] = {
    {CanonicalizePass::kName, "folds small constants; removes x*1, x+-0 and reshape/transpose/convert chains",
     Make<CanonicalizePass>},
    {ChunkLmHeadPass::kName,
     "LM head and loss, forward and backward, in row chunks (--lm-head-chunk-rows)",
     MakeChunkLmHead, /*reassociates_f32_sums=*/true},
    {CsePass::kName, "merges nodes that compute the same value", Make<CsePass>},
    {DcePass::kName, "removes nodes that no output depends on", Make<DcePass>},
    {ElideGradZeroingPass::kName,
     "add(gemm, x) -> gemm accumulating into x (beta=1); a 2^n scale -> alpha",
     Make<ElideGradZeroingPass>},
    {ExpandRopePass::kName, "rope -> the f32 ops it is (one rope_table per positions), for fuse-loops",
     Make<ExpandRopePass>},
    {FuseCacheWritePass::kName, "kv_cache_write of a loop fusion's rows -> one kernel storing them into their slots",
     Make<FuseCacheWritePass>},
    {FuseFp8ScaleUpdatePass::kName, "fp8_scale_update of a quantize's amax -> computed by that quantize's kernel",
     Make<FuseFp8ScaleUpdatePass>},
    {FuseGemvGluPass::kName, "silu(gate) * up of a few-row gemm's halves -> computed by the GEMV that makes them",
     Make<FuseGemvGluPass>},
    {FusionPass::kName, "outlines elementwise and reduction chains into fusion nodes, one generated kernel each",
     Make<FusionPass>},
    {FuseNormBetweenGemvsPass::kName, "rms_norm between GEMVs -> applied by the second as it reads (off by default)",
     Make<FuseNormBetweenGemvsPass>},
    {FuseResidualNormPass::kName,
     "add + norm -> one kernel; narrow norms; backward: add, dw, all of layer_norm's",
     Make<FuseResidualNormPass>, /*reassociates_f32_sums=*/true},
    {GemmBiasEpiloguePass::kName, "add(gemm, broadcast(bias)) -> gemm with cuBLASLt's bias epilogue",
     Make<GemmBiasEpiloguePass>},
    {GroupOptimizerUpdatesPass::kName,
     "adamw_update nodes sharing their scalars -> grouped nodes, one kernel each",
     Make<GroupOptimizerUpdatesPass>},
    {LowerGemmPass::kName, "dot_general -> gemm, the op cuBLASLt runs (transposing an operand that needs it)",
     Make<LowerGemmPass>},
    {MergeCacheWriteSiblingsPass::kName,
     "cache writes + loop fusions reading one value -> one kernel",
     Make<MergeCacheWriteSiblingsPass>},
    {MergeSiblingGemmsPass::kName,
     "sibling gemms (shared operand, or a chain through C) -> one gemm of concatenates",
     Make<MergeSiblingGemmsPass>, /*reassociates_f32_sums=*/true},
    {NarrowActivationsPass::kName, "a gemm or loss gradient whose f32 result is only read as bf16 writes bf16",
     Make<NarrowActivationsPass>},
    {RematerializePass::kName,
     "recomputes a saved activation in the backward kernel that reads its inputs",
     Make<RematerializePass>},
    {SelectFlashAttentionPass::kName, "decomposed causal attention -> the flash attention op (before autodiff)",
     MakeSelectFlashAttention},
    {SelectFp8GemmPass::kName, "gemms of the FP8 policy's dequantized operands -> cuBLASLt FP8 GEMMs (TN)",
     MakeSelectFp8Gemm},
    {kSimplifyPassName, "canonicalize, cse and dce, rerun until a round changes nothing", BuildSimplifyPass},
};

}  // namespace

absl::Span<const PassInfo> RegisteredPasses() { return kPasses; }

const PassInfo* FindRegisteredPass(absl::string_view name) {
  for (const PassInfo& info : kPasses) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

std::string RegisteredPassNames() {
  return absl::StrJoin(kPasses, ", ", [](std::string* out, const PassInfo& info) { absl::StrAppend(out, info.name); });
}

std::string FormatPassTable() {
  size_t width = 0;
  for (const PassInfo& info : kPasses) width = std::max(width, info.name.size());
  std::string out;
  for (const PassInfo& info : kPasses) {
    absl::StrAppendFormat(&out, "  %-*s  %s\n", static_cast<int>(width), info.name, info.description);
  }
  return out;
}

}  // namespace kiln
