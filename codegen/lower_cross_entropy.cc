// Lowering of cross_entropy and cross_entropy_grad to the templates of
// kernels/cross_entropy.cuh.
#include "codegen/composite_lowerings.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/composite_wrapper.h"
#include "codegen/kernel_source.h"
#include "ir/node_predicates.h"
#include "ir/status_macros.h"

namespace kiln::codegen::composite {

absl::StatusOr<LoweredNode> LowerCrossEntropy(const Node& node, const CodegenOptions& options) {
  const TensorType& logits = node.operand(0)->type();
  // `classes` is the row length here (RowGeometry's word); CrossEntropyClasses(node) the
  // prefix of it that is classes, the rest padding.
  const int64_t rows = logits.dims[0], classes = logits.dims[1];
  if (rows == 0 || (node.opcode() == Opcode::kCrossEntropyGrad && classes == 0)) return Kernels({});
  RETURN_IF_ERROR(CheckRowLength(node, classes));
  const bool forward = node.opcode() == Opcode::kCrossEntropy;
  const DType labels = node.operand(1)->type().dtype;
  // The loss writes two scalars per row; only the gradient's rows share the chunking.
  std::vector<DType> dtypes = {logits.dtype};
  if (!forward) dtypes.push_back(node.type().dtype);
  const RowGeometry g = ChooseRowGeometry(rows, classes, ChunkWidth(classes, dtypes), options);
  RETURN_IF_ERROR(CheckGrid(node, g.blocks));
  Wrapper wrapper{"cross_entropy",
                  RowComment(rows, classes, g),
                  "",
                  {Param(logits.dtype, "logits"), Param(labels, "labels")},
                  ""};
  if (forward) {
    wrapper.comment += "; writes each row's loss and log-sum-exp";
    wrapper.outputs = {"float* loss", "float* lse"};
    wrapper.call = absl::StrCat("CrossEntropyForward<", CudaTypeName(logits.dtype), ", ", CudaTypeName(labels), ", ",
                                RowArgs(rows, classes, g), ", ", CrossEntropyClasses(node),
                                ">(loss, lse, logits, labels)");
  } else {
    wrapper.comment += "; elementwise given each row's log-sum-exp";
    wrapper.params.push_back(Param(DType::kF32, "dloss"));
    wrapper.params.push_back(Param(DType::kF32, "lse"));
    wrapper.call = absl::StrCat("CrossEntropyBackward<", CudaTypeName(logits.dtype), ", ", CudaTypeName(labels), ", ",
                                CudaTypeName(node.type().dtype), ", ", RowArgs(rows, classes, g), ", ",
                                CrossEntropyClasses(node), ">(out, logits, labels, dloss, lse)");
  }
  LoweredNode lowered = Kernels({Emit(node, codegen::KernelName(node), wrapper, g.blocks, g.block_threads())});
  // Each thread reads a chunk of logits and then writes the same chunk of dlogits, and nothing
  // else reads the logits: the plan may write dlogits over them (same size only).
  if (!forward) lowered.in_place_operand = 0;
  return lowered;
}

}  // namespace kiln::codegen::composite
