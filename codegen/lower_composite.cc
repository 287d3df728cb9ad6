// LowerCompositeNode: the one entry point for the composite ops, dispatching each family to
// its file (codegen/lower_<family>.cc, mirroring kernels/<family>.cuh). The generated wrapper
// and the geometry of the row kernels are described in codegen/composite_wrapper.h.
#include "codegen/lower_composite.h"

#include "absl/strings/str_cat.h"
#include "codegen/composite_lowerings.h"
#include "codegen/composite_wrapper.h"
#include "ir/status_macros.h"

namespace kiln {
namespace {

namespace composite = codegen::composite;
using composite::kMaxThreadsPerBlock;
using composite::kWarpSize;
using composite::Where;

absl::Status CheckOptions(const Node& node, const CodegenOptions& options) {
  const int t = options.threads_per_block;
  if (t < kWarpSize || t > kMaxThreadsPerBlock || t % kWarpSize != 0) {
    return absl::InvalidArgumentError(absl::StrCat(Where(node), ": threads_per_block ", t,
                                                   " must be a multiple of 32 in [32, 1024]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LoweredNode> LowerCompositeNode(const Node& node, const CodegenOptions& options) {
  RETURN_IF_ERROR(CheckOptions(node, options));
  switch (node.opcode()) {
    case Opcode::kRmsNorm:
    case Opcode::kRmsNormGradInput:
    case Opcode::kAddRmsNorm:
    case Opcode::kAddRmsNormGradInput:
      return composite::LowerRmsNorm(node, options);
    case Opcode::kRmsNormGradWeight:
      return composite::LowerRmsNormGradWeight(node, options);
    case Opcode::kLayerNorm:
    case Opcode::kAddLayerNorm:
      return composite::LowerLayerNorm(node, options);
    case Opcode::kLayerNormGradInput:
    case Opcode::kAddLayerNormGradInput:
      return composite::LowerLayerNormGradInput(node, options);
    case Opcode::kSoftmax:
    case Opcode::kSoftmaxGrad:
      return composite::LowerSoftmax(node, options);
    case Opcode::kCrossEntropy:
    case Opcode::kCrossEntropyGrad:
      return composite::LowerCrossEntropy(node, options);
    case Opcode::kRope:
      return composite::LowerRope(node, options);
    case Opcode::kRopeTable:
      return composite::LowerRopeTable(node, options);
    case Opcode::kAdamWUpdate:
      return composite::LowerAdamWUpdate(node, options);
    case Opcode::kSumOfSquares:
      return composite::LowerSumOfSquares(node, options);
    case Opcode::kFp8Quantize:
      return composite::LowerFp8Quantize(node, options);
    case Opcode::kFp8Dequantize:
      return composite::LowerFp8Dequantize(node, options);
    case Opcode::kFp8ScaleUpdate:
      return composite::LowerFp8ScaleUpdate(node, options);
    case Opcode::kGather:
      return composite::LowerGather(node, options);
    case Opcode::kScatterAdd:
      return composite::LowerScatterAdd(node, options);
    case Opcode::kAttention:
      return composite::LowerAttention(node, options);
    case Opcode::kAttentionGrad:
      return composite::LowerAttentionGrad(node, options);
    case Opcode::kAttentionDelta:
      return composite::LowerAttentionDelta(node, options);
    case Opcode::kKvCacheWrite:
      return composite::LowerKvCacheWrite(node, options);
    case Opcode::kPagedAttention:
      return composite::LowerPagedAttention(node, options);
    case Opcode::kSampleTokens:
      return composite::LowerSampleTokens(node, options);
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(Where(node), " is not a composite op: LowerNode lowers it elsewhere"));
}

}  // namespace kiln
