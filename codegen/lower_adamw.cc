// Lowering of adamw_update to the template of kernels/adamw.cuh.
#include "codegen/composite_lowerings.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "codegen/composite_wrapper.h"
#include "codegen/kernel_source.h"
#include "ir/status_macros.h"

namespace kiln::codegen::composite {
namespace {

// Grid-stride kernels (AdamW): enough blocks to fill the target's SMs several times over;
// past that, each thread loops instead of the grid growing.
constexpr int64_t kGridStrideBlocksPerSm = 16;

}  // namespace

// One grid-stride kernel writing p', m', v' in place (each may be null where that result is
// not needed); the four per-step scalars stay operands (device memory).
absl::StatusOr<LoweredNode> LowerAdamWUpdate(const Node& node, const CodegenOptions& options) {
  ASSIGN_OR_RETURN(double beta1, FiniteFloatAttr(node, "beta1"));
  ASSIGN_OR_RETURN(double beta2, FiniteFloatAttr(node, "beta2"));
  ASSIGN_OR_RETURN(double eps, FiniteFloatAttr(node, "eps"));
  const int64_t n = node.result_type(0).num_elements();
  LoweredNode lowered = Kernels({});
  lowered.elementwise_in_place = true;
  if (n == 0) return lowered;
  const int vec = ChunkWidth(n, {DType::kF32});
  const int threads = options.threads_per_block;
  const int64_t blocks = std::min(CeilDiv(n / vec, threads), kGridStrideBlocksPerSm * options.target.sm_count);
  Wrapper wrapper;
  wrapper.header = "adamw";
  wrapper.comment = absl::StrCat("adamw p', m', v' at once (in place) over ", Count(n, "element"), ", ",
                                 Count(vec, "element"), " per access, grid-stride over ", Count(blocks, "block"));
  wrapper.outputs = {"float* p_new", "float* m_new", "float* v_new"};
  for (const char* name : {"p", "g", "m", "v", "step_size", "decay", "sqrt_bc2", "grad_scale"}) {
    wrapper.params.push_back(Param(DType::kF32, name));
  }
  wrapper.call = absl::StrCat("AdamWUpdate<", n, "LL, ", vec, ">(p_new, m_new, v_new, p, g, m, v, step_size, ",
                              "decay, sqrt_bc2, grad_scale, ", FloatLiteral(beta1), ", ", FloatLiteral(1 - beta1), ", ",
                              FloatLiteral(beta2), ", ", FloatLiteral(1 - beta2), ", ", FloatLiteral(eps), ")");
  lowered.kernels.push_back(Emit(node, codegen::KernelName(node), wrapper, blocks, threads));
  return lowered;
}

}  // namespace kiln::codegen::composite
