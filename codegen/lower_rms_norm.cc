// Lowering of rms_norm and its gradients (rms_norm_grad_input, rms_norm_grad_weight) to the
// templates of kernels/rms_norm.cuh.
#include "codegen/composite_lowerings.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/composite_wrapper.h"
#include "codegen/kernel_source.h"
#include "ir/status_macros.h"

namespace kiln::codegen::composite {
namespace {

// rms_norm_grad_weight: at most this many per-block partial rows for the last block to sum.
constexpr int64_t kMaxPartialBlocks = 256;
constexpr int kGradWeightMinThreads = 256;  // 8 rows' r in flight per block

}  // namespace

// rms_norm and rms_norm_grad_input, and their residual forms (add_rms_norm: sum and y;
// add_rms_norm_grad_input: dx and its optional copy), each one row kernel: the residual
// forms instantiate the same templates with their optional pointers set. An input gradient
// {weight_grad=1} is two kernels (LowerNormGradInputAndWeight: stage 1 sums dy * x * r of its
// rows into partial rows of dw; the fold adds them in block order).
absl::StatusOr<LoweredNode> LowerRmsNorm(const Node& node, const CodegenOptions& options) {
  ASSIGN_OR_RETURN(double eps, FiniteFloatAttr(node, "eps"));
  const Opcode op = node.opcode();
  // The normed input: h of add_rms_norm (the sum has its type), x of the gradients.
  const int x_at = op == Opcode::kAddRmsNormGradInput ? 1 : 0;
  const int w_at = op == Opcode::kAddRmsNorm ? 2 : x_at + 1;
  const Rows rows = RowsOf(node.operand(x_at)->type());
  // No rows: nothing to compute, but a weight gradient (zeros) is still written.
  if (rows.length == 0 || (rows.count == 0 && !WritesWeightGrad(node))) return Kernels({});
  RETURN_IF_ERROR(CheckRowLength(node, rows.length));
  const DType x = node.operand(x_at)->type().dtype, w = node.operand(w_at)->type().dtype;
  // The normed output (y, or dx) is the last result of add_rms_norm, the first otherwise.
  const DType y = op == Opcode::kAddRmsNorm ? node.result_type(1).dtype : node.result_type(0).dtype;
  std::vector<DType> dtypes;
  for (const TensorType& t : node.result_types()) dtypes.push_back(t.dtype);
  for (const Node* operand : node.operands()) dtypes.push_back(operand->type().dtype);
  const RowGeometry g = ChooseRowGeometry(rows.count, rows.length, ChunkWidth(rows.length, dtypes), options);
  RETURN_IF_ERROR(CheckGrid(node, g.blocks));
  const std::string eps_literal = FloatLiteral(eps);
  Wrapper wrapper{"rms_norm", RowComment(rows.count, rows.length, g), "", {}, ""};
  switch (op) {
    case Opcode::kRmsNorm: {
      wrapper.params = {Param(x, "x"), Param(w, "w")};
      // w read before the wait where nothing in the step writes it (the decode step's norms),
      // held in registers (kernels/rms_norm.cuh: at most 32 elements a thread, 16-byte loads).
      const int64_t held = CeilDiv(CeilDiv(rows.length, g.vec), g.threads_per_row) * g.vec;
      const bool weight_first = EarlyReadsAllowed(options) && IsStepInvariant(*node.operand(w_at)) && g.vec > 1 &&
                                held <= kRowElementsPerThread;
      wrapper.call = absl::StrCat("RmsNormForward<", CudaTypeName(x), ", ", CudaTypeName(w), ", ", CudaTypeName(y),
                                  ", ", RowArgs(rows.count, rows.length, g),
                                  weight_first ? ", float, float, true" : "", ">(out, x, w, ", eps_literal, ")");
      if (weight_first) {
        wrapper.comment += "; w read before the grid-dependency wait";
        LoweredNode lowered = Kernels({Emit(node, codegen::KernelName(node), wrapper, g.blocks, g.block_threads())});
        lowered.kernels[0].waits_itself = true;
        return lowered;
      }
      break;
    }
    case Opcode::kAddRmsNorm: {
      const DType branch = node.operand(1)->type().dtype, sum = node.result_type(0).dtype;
      wrapper.comment += "; writes the residual sum h + branch and its norm";
      wrapper.outputs = {absl::StrCat(CudaTypeName(sum), "* sum"), absl::StrCat(CudaTypeName(y), "* y")};
      wrapper.params = {Param(x, "h"), Param(branch, "branch"), Param(w, "w")};
      wrapper.call = absl::StrCat("RmsNormForward<", CudaTypeName(x), ", ", CudaTypeName(w), ", ", CudaTypeName(y),
                                  ", ", RowArgs(rows.count, rows.length, g), ", ", CudaTypeName(branch), ", ",
                                  CudaTypeName(sum), ">(y, h, w, ", eps_literal, ", branch, sum)");
      break;
    }
    case Opcode::kRmsNormGradInput:
    case Opcode::kAddRmsNormGradInput: {
      if (WritesWeightGrad(node)) return LowerNormGradInputAndWeight(node, options, g, {"rms_norm", "RmsNorm", {"dw"}});
      const DType dy = node.operand(x_at + 2)->type().dtype;
      const bool residual = op == Opcode::kAddRmsNormGradInput;
      const bool copy = node.num_results() == 2;
      if (residual) wrapper.params.push_back(Param(node.operand(0)->type().dtype, "dres"));
      wrapper.params.insert(wrapper.params.end(), {Param(x, "x"), Param(w, "w"), Param(dy, "dy")});
      std::string dx_name = "out";
      if (copy) {
        wrapper.outputs = {absl::StrCat(CudaTypeName(y), "* dx"),
                           absl::StrCat(CudaTypeName(node.result_type(1).dtype), "* dx_copy")};
        dx_name = "dx";
      }
      if (residual) {
        wrapper.comment += copy ? "; adds the residual gradient and writes a copy of dx" : "; adds the residual gradient";
      }
      wrapper.call = absl::StrCat(
          "RmsNormGradInput<", CudaTypeName(x), ", ", CudaTypeName(w), ", ", CudaTypeName(dy), ", ", CudaTypeName(y),
          ", ", RowArgs(rows.count, rows.length, g),
          residual ? absl::StrCat(", ", CudaTypeName(node.operand(0)->type().dtype), ", ",
                                  CudaTypeName(copy ? node.result_type(1).dtype : y))
                   : "",
          ">(", dx_name, ", x, w, dy, ", eps_literal, residual ? absl::StrCat(", dres, ", copy ? "dx_copy" : "nullptr") : "",
          ")");
      break;
    }
    default:
      return absl::InternalError(absl::StrCat(Where(node), " is not of the rms_norm family"));
  }
  return Kernels({Emit(node, codegen::KernelName(node), wrapper, g.blocks, g.block_threads())});
}


// One kernel, deterministic: per-block partial column sums in a module-scope buffer, summed
// in block order by the last block (kernels/rms_norm.cuh, RmsNormGradWeight).
absl::StatusOr<LoweredNode> LowerRmsNormGradWeight(const Node& node, const CodegenOptions&) {
  ASSIGN_OR_RETURN(double eps, FiniteFloatAttr(node, "eps"));
  const Rows rows = RowsOf(node.operand(0)->type());
  if (rows.length == 0) return Kernels({});  // dw is empty; with no rows it is zeros, computed below
  RETURN_IF_ERROR(CheckRowLength(node, rows.length));
  const DType x = node.operand(0)->type().dtype, w = node.operand(1)->type().dtype,
              dy = node.operand(2)->type().dtype, dw = node.type().dtype;
  const int vec = ChunkWidth(rows.length, {x, dy, dw, DType::kF32});  // f32: the partials
  const int64_t chunks = CeilDiv(rows.length, vec);
  const int threads = static_cast<int>(std::clamp<int64_t>(
      RoundUp(CeilDiv(chunks, std::max(1, kRowElementsPerThread / vec)), kWarpSize), kGradWeightMinThreads,
      kMaxThreadsPerBlock));
  const int warps = threads / kWarpSize;
  const int64_t rows_per_block = RoundUp(std::max<int64_t>(1, CeilDiv(rows.count, kMaxPartialBlocks)), warps);
  const int64_t blocks = std::max<int64_t>(1, CeilDiv(rows.count, rows_per_block));
  Wrapper wrapper;
  wrapper.header = "rms_norm";
  wrapper.comment = absl::StrCat(Count(rows.count, "row"), " of ", rows.length, ", ", Count(vec, "element"),
                                 " per access; ", Count(blocks, "block"), " of ", threads, " threads, ",
                                 rows_per_block, " rows each; the last block sums the partials");
  wrapper.globals = absl::StrCat("// Per-block column sums and the count of finished blocks (zero at load).\n",
                                 "static __device__ __align__(16) float g_partials[", blocks * rows.length, "];\n",
                                 "static __device__ unsigned int g_blocks_done = 0;\n\n");
  wrapper.params = {Param(x, "x"), Param(w, "w"), Param(dy, "dy")};  // w: unused, part of the signature
  wrapper.call = absl::StrCat("RmsNormGradWeight<", CudaTypeName(x), ", ", CudaTypeName(dy), ", ", CudaTypeName(dw),
                              ", ", rows.count, "LL, ", rows.length, ", ", vec, ", ", threads, ", ", rows_per_block,
                              ">(out, x, dy, ", FloatLiteral(eps), ", g_partials, &g_blocks_done)");
  return Kernels({Emit(node, codegen::KernelName(node), wrapper, blocks, threads)});
}

}  // namespace kiln::codegen::composite
