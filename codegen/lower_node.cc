#include "codegen/lower_node.h"

#include "absl/strings/str_cat.h"
#include "codegen/lower_composite.h"
#include "codegen/lower_fusion.h"
#include "codegen/lower_gemv.h"
#include "codegen/lowerings.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

// How an op is lowered; the one switch that both LowerNode and CodegenSupports read.
enum class Lowering {
  kInput,
  kAlias,
  kGemm,
  kConstant,
  kIota,
  kElementwise,
  kStridedCopy,
  kConcatenate,
  kReduce,
  kComposite,  // hand-written templates: codegen/lower_composite.cc
  kResult,     // get_result: written by its multi-result node's kernels
  kFusion,     // one generated kernel for the body: codegen/lower_fusion.h
  kByLowerGemm,  // dot_general: the lower-gemm pass makes it a gemm before codegen
  kNone,       // not an op of the table (a corrupt value): LowerNode reports it
};

// No default case: -Wswitch names a new op of ir/op_table.h until it gets a lowering here.

Lowering LoweringOf(Opcode op) {
  switch (op) {
    case Opcode::kParameter:
      return Lowering::kInput;
    case Opcode::kConstant:
      return Lowering::kConstant;
    case Opcode::kIota:
      return Lowering::kIota;
    case Opcode::kNeg:
    case Opcode::kAbs:
    case Opcode::kExp:
    case Opcode::kLog:
    case Opcode::kSqrt:
    case Opcode::kRsqrt:
    case Opcode::kTanh:
    case Opcode::kSigmoid:
    case Opcode::kGelu:
    case Opcode::kAdd:
    case Opcode::kSub:
    case Opcode::kMul:
    case Opcode::kDiv:
    case Opcode::kMax:
    case Opcode::kMin:
    case Opcode::kCompare:
    case Opcode::kSelect:
    case Opcode::kConvert:
      return Lowering::kElementwise;
    case Opcode::kBroadcast:
    case Opcode::kTranspose:
    case Opcode::kSlice:
      return Lowering::kStridedCopy;
    case Opcode::kReshape:
      return Lowering::kAlias;
    case Opcode::kConcatenate:
      return Lowering::kConcatenate;
    case Opcode::kReduceSum:
    case Opcode::kReduceMax:
      return Lowering::kReduce;
    case Opcode::kDotGeneral:
      return Lowering::kByLowerGemm;
    case Opcode::kGemm:
      return Lowering::kGemm;
    case Opcode::kGather:
    case Opcode::kScatterAdd:
    case Opcode::kRmsNorm:
    case Opcode::kRmsNormGradInput:
    case Opcode::kRmsNormGradWeight:
    case Opcode::kLayerNorm:
    case Opcode::kAddRmsNorm:
    case Opcode::kAddLayerNorm:
    case Opcode::kAddRmsNormGradInput:
    case Opcode::kLayerNormGradInput:
    case Opcode::kAddLayerNormGradInput:
    case Opcode::kSoftmax:
    case Opcode::kSoftmaxGrad:
    case Opcode::kCrossEntropy:
    case Opcode::kCrossEntropyGrad:
    case Opcode::kRope:
    case Opcode::kRopeTable:
    case Opcode::kAdamWUpdate:
    case Opcode::kSumOfSquares:
    case Opcode::kFp8Quantize:
    case Opcode::kFp8Dequantize:
    case Opcode::kFp8ScaleUpdate:
    case Opcode::kAttention:
    case Opcode::kAttentionDelta:
    case Opcode::kAttentionGrad:
    case Opcode::kKvCacheWrite:
    case Opcode::kPagedAttention:
    case Opcode::kSampleTokens:
      return Lowering::kComposite;
    case Opcode::kGetResult:
      return Lowering::kResult;
    case Opcode::kFusion:
      return Lowering::kFusion;
  }
  return Lowering::kNone;
}

absl::StatusOr<LoweredNode> LowerNodeKernels(const Node& node, const CodegenOptions& options) {
  switch (LoweringOf(node.opcode())) {
    case Lowering::kInput:
      return LoweredNode{LoweringKind::kInput, {}};
    case Lowering::kAlias:
      return LoweredNode{LoweringKind::kAlias, {}};
    case Lowering::kGemm:
      if (codegen::SmallMGemmRefusal(node, options).empty()) return codegen::LowerSmallMGemm(node, options);
      return LoweredNode{LoweringKind::kGemm, {}};
    case Lowering::kResult:
      return LoweredNode{LoweringKind::kResult, {}};
    case Lowering::kByLowerGemm:
      return absl::InvalidArgumentError(absl::StrCat(
          "dot_general %", node.name(), " reached codegen: the lower-gemm pass (in the default pipeline, ",
          "passes/lower_gemm.h) makes every dot_general a gemm first"));
    case Lowering::kConstant:
      return codegen::LowerConstant(node, options);
    case Lowering::kIota:
      return codegen::LowerIota(node, options);
    case Lowering::kElementwise:
      return codegen::LowerElementwise(node, options);
    case Lowering::kStridedCopy:
      return codegen::LowerStridedCopy(node, options);
    case Lowering::kConcatenate:
      return codegen::LowerConcatenate(node, options);
    case Lowering::kReduce:
      return codegen::LowerReduce(node, options);
    case Lowering::kComposite:
      return LowerCompositeNode(node, options);
    case Lowering::kFusion:
      return codegen::LowerFusion(node, options);
    case Lowering::kNone:
      break;
  }
  return absl::UnimplementedError(absl::StrCat("codegen has no lowering for op ", node.op_name(), " (node %",
                                               node.name(), ")"));
}

// Puts kGridDependencyPrologue first in the body of the source's one kernel (the part of it
// the kernel does not do itself: KernelSpec::launches_dependents_itself, waits_itself). The kernel
// sources come from a dozen emitters (elementwise, fusion, reductions, the composite
// wrappers); doing it here keeps one place that decides what a kernel waits for.
absl::Status OpenWithGridDependencyWait(KernelSpec& spec, const Node& node) {
  static constexpr char kEntry[] = "extern \"C\" __global__";
  const size_t entry = spec.source.find(kEntry);
  const size_t body = entry == std::string::npos ? entry : spec.source.find('{', entry);
  if (body == std::string::npos || spec.source.find(kEntry, entry + 1) != std::string::npos) {
    return absl::InternalError(absl::StrCat("kernel ", spec.name, " of %", node.name(),
                                            " does not hold exactly one extern \"C\" __global__ function"));
  }
  const char* prologue = spec.launches_dependents_itself ? (spec.waits_itself ? "" : kGridDependencyWait)
                                                         : (spec.waits_itself ? kGridDependencyLaunch : kGridDependencyPrologue);
  spec.source.insert(body + 1, absl::StrCat("\n", prologue));
  spec.waits_for_grid_dependency = true;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LoweredNode> LowerNode(const Node& node, const CodegenOptions& options) {
  ASSIGN_OR_RETURN(LoweredNode lowered, LowerNodeKernels(node, options));
  // griddepcontrol is PTX for sm_90 and later.
  if (options.programmatic_dependent_launch && options.target.compute_capability >= 90) {
    for (KernelSpec& spec : lowered.kernels) RETURN_IF_ERROR(OpenWithGridDependencyWait(spec, node));
  } else {
    for (const KernelSpec& spec : lowered.kernels) {
      if (spec.waits_itself) {  // a lowering sets it only under the option (EarlyReadsAllowed)
        return absl::InternalError(absl::StrCat("kernel ", spec.name, " of %", node.name(),
                                                " waits for its grid dependency itself without programmatic launch"));
      }
    }
  }
  return lowered;
}

bool CodegenSupports(Opcode op) { return LoweringOf(op) != Lowering::kNone; }

const char* CudaTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "float";
    case DType::kF16:
      return "__half";
    case DType::kBF16:
      return "__nv_bfloat16";
    case DType::kF8E4M3:
      return "__nv_fp8_e4m3";
    case DType::kF8E5M2:
      return "__nv_fp8_e5m2";
    case DType::kI32:
      return "int";
    case DType::kI64:
      return "long long";
    case DType::kPred:
      return "bool";
  }
  return "void";
}

}  // namespace kiln
