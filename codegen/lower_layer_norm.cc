// Lowering of layer_norm and add_layer_norm, and of the fused input gradient
// layer_norm_grad_input and add_layer_norm_grad_input, to the templates of
// kernels/layer_norm.cuh. (LayerNormVjp's own gradients are rms_norm_grad_input/_weight
// nodes, lowered by lower_rms_norm.cc, until fuse-residual-norm makes them one of these.)
#include <string>
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

// layer_norm_grad_input, and add_layer_norm_grad_input (dx and its optional copy): one row
// kernel, the residual form the same template with its optional pointers set; with
// {weight_grad=1} two kernels (LowerNormGradInputAndWeight: stage 1 sums dy * c * r and dy of
// its rows into partial rows of dw and db, 2 D floats; the fold adds them in block order).
absl::StatusOr<LoweredNode> LowerLayerNormGradInput(const Node& node, const CodegenOptions& options) {
  ASSIGN_OR_RETURN(double eps, FiniteFloatAttr(node, "eps"));
  const bool residual = node.opcode() == Opcode::kAddLayerNormGradInput;
  const int x_at = residual ? 1 : 0;
  const Rows rows = RowsOf(node.operand(x_at)->type());
  // No rows: nothing to compute, but a weight and bias gradient (zeros) are still written.
  if (rows.length == 0 || (rows.count == 0 && !WritesWeightGrad(node))) return Kernels({});
  RETURN_IF_ERROR(CheckRowLength(node, rows.length));
  const DType x = node.operand(x_at)->type().dtype, w = node.operand(x_at + 1)->type().dtype,
              dy = node.operand(x_at + 2)->type().dtype, dx = node.result_type(0).dtype;
  std::vector<DType> dtypes;
  for (const TensorType& t : node.result_types()) dtypes.push_back(t.dtype);
  for (const Node* operand : node.operands()) dtypes.push_back(operand->type().dtype);
  const RowGeometry g = ChooseRowGeometry(rows.count, rows.length, ChunkWidth(rows.length, dtypes), options);
  RETURN_IF_ERROR(CheckGrid(node, g.blocks));
  if (WritesWeightGrad(node)) return LowerNormGradInputAndWeight(node, options, g, {"layer_norm", "LayerNorm", {"dw", "db"}});
  const bool copy = node.num_results() == 2;
  Wrapper wrapper{"layer_norm", RowComment(rows.count, rows.length, g), "", {}, ""};
  if (residual) wrapper.params.push_back(Param(node.operand(0)->type().dtype, "dres"));
  wrapper.params.insert(wrapper.params.end(), {Param(x, "x"), Param(w, "w"), Param(dy, "dy")});
  std::string dx_name = "out";
  if (copy) {
    wrapper.outputs = {absl::StrCat(CudaTypeName(dx), "* dx"),
                       absl::StrCat(CudaTypeName(node.result_type(1).dtype), "* dx_copy")};
    dx_name = "dx";
  }
  if (residual) {
    wrapper.comment += copy ? "; adds the residual gradient and writes a copy of dx" : "; adds the residual gradient";
  }
  wrapper.call = absl::StrCat(
      "LayerNormGradInput<", CudaTypeName(x), ", ", CudaTypeName(w), ", ", CudaTypeName(dy), ", ", CudaTypeName(dx),
      ", ", RowArgs(rows.count, rows.length, g),
      residual ? absl::StrCat(", ", CudaTypeName(node.operand(0)->type().dtype), ", ",
                              CudaTypeName(copy ? node.result_type(1).dtype : dx))
               : "",
      ">(", dx_name, ", x, w, dy, ", FloatLiteral(eps),
      residual ? absl::StrCat(", dres, ", copy ? "dx_copy" : "nullptr") : "", ")");
  return Kernels({Emit(node, codegen::KernelName(node), wrapper, g.blocks, g.block_threads())});
}

}  // namespace kiln::codegen::composite
