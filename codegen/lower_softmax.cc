// Lowering of softmax and softmax_grad to the templates of kernels/softmax.cuh.
#include "codegen/composite_lowerings.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/composite_wrapper.h"
#include "codegen/kernel_source.h"
#include "ir/status_macros.h"

namespace kiln::codegen::composite {

absl::StatusOr<LoweredNode> LowerSoftmax(const Node& node, const CodegenOptions& options) {
  const Rows rows = RowsOf(node.type());
  if (rows.count == 0 || rows.length == 0) return Kernels({});
  RETURN_IF_ERROR(CheckRowLength(node, rows.length));
  const bool forward = node.opcode() == Opcode::kSoftmax;
  std::vector<DType> dtypes = {node.type().dtype};
  for (const Node* operand : node.operands()) dtypes.push_back(operand->type().dtype);
  const RowGeometry g = ChooseRowGeometry(rows.count, rows.length, ChunkWidth(rows.length, dtypes), options);
  RETURN_IF_ERROR(CheckGrid(node, g.blocks));
  const char* out = CudaTypeName(node.type().dtype);
  const DType in = node.operand(0)->type().dtype;
  Wrapper wrapper{"softmax", RowComment(rows.count, rows.length, g), "", {}, ""};
  if (forward) {
    wrapper.params = {Param(in, "x")};
    wrapper.call = absl::StrCat("SoftmaxForward<", CudaTypeName(in), ", ", out, ", ",
                                RowArgs(rows.count, rows.length, g), ">(out, x)");
  } else {
    const DType dy = node.operand(1)->type().dtype;
    wrapper.params = {Param(in, "y"), Param(dy, "dy")};
    wrapper.call = absl::StrCat("SoftmaxBackward<", CudaTypeName(in), ", ", CudaTypeName(dy), ", ", out, ", ",
                                RowArgs(rows.count, rows.length, g), ">(out, y, dy)");
  }
  return Kernels({Emit(node, codegen::KernelName(node), wrapper, g.blocks, g.block_threads())});
}

}  // namespace kiln::codegen::composite
