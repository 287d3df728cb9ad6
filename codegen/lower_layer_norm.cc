// Lowering of layer_norm and add_layer_norm to the template of kernels/layer_norm.cuh (its
// gradients are rms_norm_grad_input/_weight nodes, lowered by lower_rms_norm.cc).
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/composite_lowerings.h"
#include "codegen/composite_wrapper.h"
#include "codegen/kernel_source.h"
#include "ir/status_macros.h"

namespace kiln::codegen::composite {

// layer_norm, and add_layer_norm (results sum and y): one row kernel, the residual form the
// same template with its optional pointers set.
absl::StatusOr<LoweredNode> LowerLayerNorm(const Node& node, const CodegenOptions& options) {
  ASSIGN_OR_RETURN(double eps, FiniteFloatAttr(node, "eps"));
  const bool residual = node.opcode() == Opcode::kAddLayerNorm;
  const int w_at = residual ? 2 : 1;  // add_layer_norm(h, branch, w, b)
  const Rows rows = RowsOf(node.operand(0)->type());
  if (rows.count == 0 || rows.length == 0) return Kernels({});
  RETURN_IF_ERROR(CheckRowLength(node, rows.length));
  const DType x = node.operand(0)->type().dtype, w = node.operand(w_at)->type().dtype,
              b = node.operand(w_at + 1)->type().dtype, y = node.result_types().back().dtype;
  std::vector<DType> dtypes;
  for (const TensorType& t : node.result_types()) dtypes.push_back(t.dtype);
  for (const Node* operand : node.operands()) dtypes.push_back(operand->type().dtype);
  const RowGeometry g = ChooseRowGeometry(rows.count, rows.length, ChunkWidth(rows.length, dtypes), options);
  RETURN_IF_ERROR(CheckGrid(node, g.blocks));
  Wrapper wrapper{"layer_norm", RowComment(rows.count, rows.length, g), "", {}, ""};
  const std::string types = absl::StrCat(CudaTypeName(x), ", ", CudaTypeName(w), ", ", CudaTypeName(b), ", ",
                                         CudaTypeName(y), ", ", RowArgs(rows.count, rows.length, g));
  if (residual) {
    const DType branch = node.operand(1)->type().dtype, sum = node.result_type(0).dtype;
    wrapper.comment += "; writes the residual sum h + branch and its norm";
    wrapper.outputs = {absl::StrCat(CudaTypeName(sum), "* sum"), absl::StrCat(CudaTypeName(y), "* y")};
    wrapper.params = {Param(x, "h"), Param(branch, "branch"), Param(w, "w"), Param(b, "b")};
    wrapper.call = absl::StrCat("LayerNormForward<", types, ", ", CudaTypeName(branch), ", ", CudaTypeName(sum),
                                ">(y, h, w, b, ", FloatLiteral(eps), ", branch, sum)");
  } else {
    wrapper.params = {Param(x, "x"), Param(w, "w"), Param(b, "b")};
    wrapper.call = absl::StrCat("LayerNormForward<", types, ">(out, x, w, b, ", FloatLiteral(eps), ")");
  }
  return Kernels({Emit(node, codegen::KernelName(node), wrapper, g.blocks, g.block_threads())});
}

}  // namespace kiln::codegen::composite
