// Lowering of layer_norm to the template of kernels/layer_norm.cuh (its gradients are
// rms_norm_grad_input/_weight nodes, lowered by lower_rms_norm.cc).
#include "absl/strings/str_cat.h"
#include "codegen/composite_lowerings.h"
#include "codegen/composite_wrapper.h"
#include "codegen/kernel_source.h"
#include "ir/status_macros.h"

namespace kiln::codegen::composite {

absl::StatusOr<LoweredNode> LowerLayerNorm(const Node& node, const CodegenOptions& options) {
  ASSIGN_OR_RETURN(double eps, FiniteFloatAttr(node, "eps"));
  const Rows rows = RowsOf(node.operand(0)->type());
  if (rows.count == 0 || rows.length == 0) return Kernels({});
  RETURN_IF_ERROR(CheckRowLength(node, rows.length));
  const DType x = node.operand(0)->type().dtype, w = node.operand(1)->type().dtype,
              b = node.operand(2)->type().dtype, y = node.type().dtype;
  const RowGeometry g = ChooseRowGeometry(rows.count, rows.length, ChunkWidth(rows.length, {x, w, b, y}), options);
  RETURN_IF_ERROR(CheckGrid(node, g.blocks));
  Wrapper wrapper{"layer_norm", RowComment(rows.count, rows.length, g), "", {Param(x, "x"), Param(w, "w"), Param(b, "b")},
                  ""};
  wrapper.call = absl::StrCat("LayerNormForward<", CudaTypeName(x), ", ", CudaTypeName(w), ", ", CudaTypeName(b), ", ",
                              CudaTypeName(y), ", ", RowArgs(rows.count, rows.length, g), ">(out, x, w, b, ",
                              FloatLiteral(eps), ")");
  return Kernels({Emit(node, codegen::KernelName(node), wrapper, g.blocks, g.block_threads())});
}

}  // namespace kiln::codegen::composite
