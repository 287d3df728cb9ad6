// Lowering of rope to the template of kernels/rope.cuh.
#include "codegen/composite_lowerings.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "codegen/composite_wrapper.h"
#include "codegen/kernel_source.h"
#include "ir/status_macros.h"

namespace kiln::codegen::composite {

absl::StatusOr<LoweredNode> LowerRope(const Node& node, const CodegenOptions& options) {
  ASSIGN_OR_RETURN(double theta, FiniteFloatAttr(node, "theta"));
  ASSIGN_OR_RETURN(int64_t inverse, node.attrs().GetInt("inverse"));
  const TensorType& x = node.operand(0)->type();
  if (x.num_elements() == 0) return Kernels({});
  const int64_t batch = x.dims[0], seq = x.dims[1], heads = x.dims[2], head_dim = x.dims[3];
  RETURN_IF_ERROR(CheckRowLength(node, std::max(heads, head_dim)));
  const int vec = ChunkWidth(head_dim / 2, {x.dtype, node.type().dtype});
  const int64_t items = batch * seq * (head_dim / 2 / vec);
  const int threads = options.threads_per_block;
  const int64_t blocks = CeilDiv(items, threads);
  RETURN_IF_ERROR(CheckGrid(node, blocks));
  Wrapper wrapper;
  wrapper.header = "rope";
  wrapper.comment =
      absl::StrCat("a thread per (b, t, ", Count(vec, "rotation pair"), "), looping over ", Count(heads, "head"));
  wrapper.params = {Param(x.dtype, "x"), Param(DType::kI32, "positions")};
  wrapper.call = absl::StrCat("Rope<", CudaTypeName(x.dtype), ", ", CudaTypeName(node.type().dtype), ", ", batch,
                              "LL, ", seq, "LL, ", heads, ", ", head_dim, ", ", vec, ", ", inverse != 0 ? "true" : "false",
                              ">(out, x, positions, ", DoubleLiteral(theta), ")");
  return Kernels({Emit(node, codegen::KernelName(node), wrapper, blocks, threads)});
}

}  // namespace kiln::codegen::composite
