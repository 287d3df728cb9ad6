#include "passes/default_pipeline.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "passes/canonicalize.h"
#include "passes/chunk_lm_head.h"
#include "passes/cse.h"
#include "passes/dce.h"
#include "passes/elide_grad_zeroing.h"
#include "passes/expand_rope.h"
#include "passes/fuse_cache_write.h"
#include "passes/merge_cache_write_siblings.h"
#include "passes/fuse_gemv_glu.h"
#include "passes/fuse_norm_between_gemvs.h"
#include "passes/fuse_fp8_scale_update.h"
#include "passes/fuse_residual_norm.h"
#include "passes/fusion.h"
#include "passes/gemm_bias_epilogue.h"
#include "passes/group_optimizer_updates.h"
#include "passes/lower_gemm.h"
#include "passes/merge_sibling_gemms.h"
#include "passes/narrow_activations.h"
#include "passes/rematerialize.h"
#include "passes/pass_registry.h"
#include "passes/select_flash_attention.h"
#include "passes/select_fp8_gemm.h"

namespace kiln {

// `options` is unused until a step depends on it (the precision policy for narrowing, the
// target for fusion); the signatures are the ones those steps will need.
std::unique_ptr<Pass> BuildSimplifyPass(const CompileOptions&) {
  // Folding and identities expose duplicates, merging duplicates exposes new identities, and
  // dce keeps each round's graph small.
  std::vector<std::unique_ptr<Pass>> members;
  members.push_back(std::make_unique<CanonicalizePass>());
  members.push_back(std::make_unique<CsePass>());
  members.push_back(std::make_unique<DcePass>());
  return std::make_unique<FixpointPass>(std::string(kSimplifyPassName), std::move(members));
}

Pipeline BuildDefaultPipeline(const CompileOptions& options) {
  Pipeline p("default");
  p.Add(BuildSimplifyPass(options));
  // Whatever the last round left unused.
  p.Add(std::make_unique<DcePass>());
  // The backend form of every GEMM; before fusion, so that a transpose it inserts can be
  // fused into the kernel that produces its operand.
  p.Add(std::make_unique<LowerGemmPass>());
  // Row biases added by cuBLASLt's epilogue; before elide-grad-zeroing, which would take
  // the bias add for an accumulation and materialize the broadcast as C.
  p.Add(std::make_unique<GemmBiasEpiloguePass>());
  // Gradient sums accumulate in their GEMMs (beta=1) instead of separate adds; before
  // narrowing, so that a gemm that accumulates keeps its f32 result.
  p.Add(std::make_unique<ElideGradZeroingPass>());
  // GEMMs whose results are only converted to bf16 write bf16; before fusion, which would
  // hide the converts inside fusion bodies.
  p.Add(std::make_unique<NarrowActivationsPass>());
  // The FP8 policy's GEMMs read FP8 operands (passes/select_fp8_gemm.h); after narrowing, so
  // that a gemm whose result is only read as bf16 writes bf16 before it becomes FP8. A step
  // without the policy has no fp8_dequantize for it to find.
  p.Add(std::make_unique<SelectFp8GemmPass>(options.capabilities, options.target.value_or(Target{})));
  // Each FP8 tensor's scale update in its quantize's kernel (one launch fewer per tensor);
  // after select-fp8-gemm, which rebuilds the quantizes it gives a transposed copy.
  p.Add(std::make_unique<FuseFp8ScaleUpdatePass>());
  // A residual add and its norm in one kernel, norms written in the dtype their consumers
  // convert to, the residual gradient's add in the norm's backward kernel. After
  // elide-grad-zeroing, which has made a residual add whose branch is a GEMM that GEMM's C
  // (fewer bytes; passes/fuse_residual_norm.h), and before fusion, which would take the adds
  // and converts into loop fusions.
  p.Add(std::make_unique<FuseResidualNormPass>());
  // Sibling GEMMs (q/k/v, gate/up, their weight gradients) and GEMM chains summing through C
  // (their input gradients) become one GEMM each. After elide-grad-zeroing, whose beta=1
  // chains it merges, and after narrow-activations-bf16 and fuse-residual-norm, so that
  // those match the GEMMs and norms they always have (a merged projection's result is
  // already bf16; its slices would hide the converts from narrowing); before fusion, which
  // puts the concatenates and slices into the loop kernels beside them.
  p.Add(std::make_unique<MergeSiblingGemmsPass>());
  // The LM head and its loss in row chunks, when CompileOptions::lm_head_chunk_rows asks for
  // it; after merge-sibling-gemms, which would merge the chunks' GEMMs (siblings on the
  // weight) back into one, and before fusion, which fuses the slices and concatenates.
  p.Add(std::make_unique<ChunkLmHeadPass>(options.lm_head_chunk_rows));
  // RoPE as the elementwise ops it is, so that fusion puts it in the loop kernel of the
  // slice before it and the transpose after it (and their gradients'); after
  // narrow-activations-bf16, which has given each rope its result dtype.
  p.Add(std::make_unique<ExpandRopePass>());
  // Fusion nodes for the elementwise chains; after lower-gemm, whose transposes it may fuse.
  // A pass added after it sees each fusion as one node.
  p.Add(std::make_unique<FusionPass>());
  // A kv_cache_write and the loop fusion computing its rows become one kernel that stores the
  // rows into their pool slots (inference: a layer's K and V); after fusion, whose fusions
  // it extends.
  p.Add(std::make_unique<FuseCacheWritePass>());
  // The cache writes and loop fusions reading one value in one kernel (inference: a layer's
  // K write, V write and q RoPE, all of the qkv projection); after fuse-cache-write, whose
  // fusions it merges.
  p.Add(std::make_unique<MergeCacheWriteSiblingsPass>());
  // A few-row gemm's SwiGLU (decode: silu(gate) * up) is computed by the GEMV itself; after
  // fusion, whose loop fusion it takes in.
  p.Add(std::make_unique<FuseGemvGluPass>());
  // The rms_norm between two few-row gemms (decode: the residual stream normalized for the
  // next projection) is applied by the second as it reads, from sums of squares the first adds
  // up; after fuse-gemv-glu, whose fusions it takes in as the second GEMV.
  p.Add(std::make_unique<FuseNormBetweenGemvsPass>());
  // Activations saved only for a late weight-gradient GEMM are recomputed by the backward's
  // loop fusions that read their inputs; after fusion, whose kernels it extends.
  p.Add(std::make_unique<RematerializePass>());
  // The optimizer's updates that share their per-step scalars become grouped nodes, one
  // kernel each for up to 72 parameters. Last: no pass after it matches adamw_update, and
  // each group is placed where its operands (the final gradients) are.
  p.Add(std::make_unique<GroupOptimizerUpdatesPass>());
  return p;
}

absl::StatusOr<Pipeline> BuildPipelineFromNames(const std::vector<std::string>& names,
                                                const CompileOptions& options) {
  if (names.size() == 1 && names[0] == "default") return BuildDefaultPipeline(options);
  Pipeline p(absl::StrJoin(names, ","));
  for (const std::string& name : names) {
    const PassInfo* info = FindRegisteredPass(name);
    if (info == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown pass '", name, "' (known: default, ", RegisteredPassNames(), ")"));
    }
    p.Add(info->make(options));
  }
  return p;
}

absl::StatusOr<PipelineReport> RunDefaultPipeline(Module& module, const CompileOptions& options) {
  return BuildDefaultPipeline(options).Run(module, options);
}

Pipeline BuildForwardPipeline(const CompileOptions& options) {
  Pipeline p("forward");
  p.Add(std::make_unique<SelectFlashAttentionPass>(options.capabilities, options.target.value_or(Target{})));
  p.Add(std::make_unique<DcePass>());  // the decomposed attention it replaced
  return p;
}

absl::StatusOr<PipelineReport> RunForwardPipeline(Module& module, const CompileOptions& options) {
  return BuildForwardPipeline(options).Run(module, options);
}

}  // namespace kiln
