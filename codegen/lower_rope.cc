// Lowering of rope to the template of kernels/rope.cuh.
#include "codegen/composite_lowerings.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "codegen/composite_wrapper.h"
#include "codegen/kernel_source.h"
#include "ir/status_macros.h"

namespace kiln::codegen::composite {
namespace {

// Blocks per SM a RoPE launch aims for at least (its blocks are short; several per SM hide
// the cos/sin prologue of one behind the loads of another).
constexpr int64_t kMinBlocksPerSm = 4;

}  // namespace

absl::StatusOr<LoweredNode> LowerRope(const Node& node, const CodegenOptions& options) {
  ASSIGN_OR_RETURN(double theta, FiniteFloatAttr(node, "theta"));
  ASSIGN_OR_RETURN(int64_t inverse, node.attrs().GetInt("inverse"));
  const TensorType& x = node.operand(0)->type();
  if (x.num_elements() == 0) return Kernels({});
  const int64_t batch = x.dims[0], seq = x.dims[1], heads = x.dims[2], head_dim = x.dims[3];
  RETURN_IF_ERROR(CheckRowLength(node, std::max(heads, head_dim)));
  const int vec = ChunkWidth(head_dim / 2, {x.dtype, node.type().dtype});
  // A block per (position, run of batch rows): as many rows per block as keep at least
  // kMinBlocksPerSm blocks on each SM, so that a short sequence (decoding, T = 1) still spreads
  // over the card while a training batch computes each position's cos/sin once or a few times.
  const int64_t row_runs = std::min(batch, CeilDiv(kMinBlocksPerSm * options.target.sm_count, seq));
  const int64_t rows_per_block = CeilDiv(batch, row_runs);
  const int64_t blocks = seq * CeilDiv(batch, rows_per_block);
  const int threads = options.threads_per_block;
  RETURN_IF_ERROR(CheckGrid(node, blocks));
  Wrapper wrapper;
  wrapper.header = "rope";
  wrapper.comment = absl::StrCat("a block per (position, ", Count(rows_per_block, "batch row"), "), ",
                                 Count(vec, "rotation pair"), " per access, cos/sin once per block and frequency");
  wrapper.params = {Param(x.dtype, "x"), Param(DType::kI32, "positions")};
  wrapper.call = absl::StrCat("Rope<", CudaTypeName(x.dtype), ", ", CudaTypeName(node.type().dtype), ", ", batch,
                              "LL, ", seq, "LL, ", heads, ", ", head_dim, ", ", vec, ", ", rows_per_block, ", ",
                              inverse != 0 ? "true" : "false", ">(out, x, positions, ", DoubleLiteral(theta), ")");
  return Kernels({Emit(node, codegen::KernelName(node), wrapper, blocks, threads)});
}

absl::StatusOr<LoweredNode> LowerRopeTable(const Node& node, const CodegenOptions& options) {
  ASSIGN_OR_RETURN(double theta, FiniteFloatAttr(node, "theta"));
  ASSIGN_OR_RETURN(int64_t head_dim, node.attrs().GetInt("head_dim"));
  ASSIGN_OR_RETURN(int64_t inverse, node.attrs().GetInt("inverse"));
  const int64_t seq = node.type().dims[0];
  if (seq == 0) return Kernels({});
  RETURN_IF_ERROR(CheckRowLength(node, head_dim));
  const int threads = options.threads_per_block;
  const int64_t blocks = CeilDiv(seq * (head_dim / 2), threads);
  RETURN_IF_ERROR(CheckGrid(node, blocks));
  Wrapper wrapper;
  wrapper.header = "rope";
  wrapper.comment = absl::StrCat("a thread per (position, frequency): ", Count(seq * head_dim / 2, "double cos/sin"));
  wrapper.params = {Param(DType::kI32, "positions")};
  wrapper.call = absl::StrCat("RopeTable<", seq, "LL, ", head_dim, ", ", inverse != 0 ? "true" : "false",
                              ">(out, positions, ", DoubleLiteral(theta), ")");
  return Kernels({Emit(node, codegen::KernelName(node), wrapper, blocks, threads)});
}

}  // namespace kiln::codegen::composite
