// Lowering of adamw_update to the templates of kernels/adamw.cuh: AdamWUpdate for one parameter,
// AdamWUpdateGroups for a grouped node (group-optimizer-updates' several parameters in one launch).
#include "codegen/composite_lowerings.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/composite_wrapper.h"
#include "codegen/kernel_source.h"
#include "ir/status_macros.h"
#include "passes/group_optimizer_updates.h"

namespace kiln::codegen::composite {
namespace {

// Grid-stride kernels (AdamW): enough blocks to fill the target's SMs several times over;
// past that, each thread loops instead of the grid growing.
constexpr int64_t kGridStrideBlocksPerSm = 16;

// The literals every AdamW kernel ends with: the betas, their complements (computed in
// double), eps.
absl::StatusOr<std::string> AdamWLiterals(const Node& node) {
  ASSIGN_OR_RETURN(double beta1, FiniteFloatAttr(node, "beta1"));
  ASSIGN_OR_RETURN(double beta2, FiniteFloatAttr(node, "beta2"));
  ASSIGN_OR_RETURN(double eps, FiniteFloatAttr(node, "eps"));
  return absl::StrCat(FloatLiteral(beta1), ", ", FloatLiteral(1 - beta1), ", ", FloatLiteral(beta2), ", ",
                      FloatLiteral(1 - beta2), ", ", FloatLiteral(eps));
}

// Result r of an adamw_update may take the buffer of the operand it updates: group r / 3's
// p, m or v (operand 4 (r / 3) + 0, 2 or 3), never another group's, which other blocks of
// the same launch may still be reading.
std::vector<int> InPlaceOperandOfResults(const Node& node) {
  std::vector<int> operands;
  for (int r = 0; r < node.num_results(); ++r) {
    static constexpr int kUpdated[] = {0, 2, 3};
    operands.push_back(4 * (r / 3) + kUpdated[r % 3]);
  }
  return operands;
}

// A grouped node (K >= 2 parameter groups): one kernel for all of them. Each group gets
// blocks in proportion to its chunks: the fewest chunks per thread (the same for every group)
// that keeps the grid within the one-tensor kernel's cap, so every block has about the same
// work; a group of no elements gets no block.
absl::StatusOr<LoweredNode> LowerGroupedAdamWUpdate(const Node& node, const CodegenOptions& options) {
  ASSIGN_OR_RETURN(const std::string literals, AdamWLiterals(node));
  const int groups = node.num_results() / 3;
  const int64_t param_bytes = (kAdamWPointersPerGroup * groups + kAdamWScalarPointers) * 8;
  if (param_bytes > kKernelParamBytesLimit) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(node), ": ", groups, " parameter groups take ", param_bytes, " bytes of kernel parameters, over ",
        kKernelParamBytesLimit, " (at most ", kMaxAdamWGroupsPerLaunch, " groups; group-optimizer-updates keeps to it)"));
  }
  const int threads = options.threads_per_block;
  const int64_t max_blocks = kGridStrideBlocksPerSm * options.target.sm_count;
  std::vector<int64_t> sizes, chunks;
  std::vector<int> vecs;
  int64_t total_chunks = 0, elements = 0;
  for (int i = 0; i < groups; ++i) {
    sizes.push_back(node.result_type(3 * i).num_elements());
    vecs.push_back(ChunkWidth(sizes.back(), {DType::kF32}));
    chunks.push_back(sizes.back() / vecs.back());
    total_chunks += chunks.back();
    elements += sizes.back();
  }
  LoweredNode lowered = Kernels({});
  lowered.elementwise_in_place = true;
  lowered.in_place_operand_of_results = InPlaceOperandOfResults(node);
  if (total_chunks == 0) return lowered;
  auto blocks_for = [&](int64_t per_thread) {
    std::vector<int64_t> blocks;
    for (int64_t c : chunks) blocks.push_back(CeilDiv(c, threads * per_thread));
    return blocks;
  };
  auto sum = [](const std::vector<int64_t>& xs) {
    int64_t s = 0;
    for (int64_t x : xs) s += x;
    return s;
  };
  int64_t per_thread = std::max<int64_t>(1, CeilDiv(total_chunks, threads * max_blocks));
  std::vector<int64_t> blocks = blocks_for(per_thread);
  while (sum(blocks) > max_blocks) blocks = blocks_for(++per_thread);  // the last partial block of each group
  Wrapper wrapper;
  wrapper.header = "adamw";
  std::string slices, cases;
  int64_t first_block = 0;
  for (int i = 0; i < groups; ++i) {
    absl::StrAppend(&slices, "    {", sizes[i], "LL, ", vecs[i], ", ", first_block, "},  // ",
                    Count(blocks[i], "block"), "\n");
    first_block += blocks[i];
    for (absl::string_view name : {"p_new", "m_new", "v_new"}) {
      wrapper.outputs.push_back(absl::StrCat("float* ", name, "_", i));
    }
    for (absl::string_view name : {"p", "g", "m", "v"}) {
      wrapper.params.push_back(Param(DType::kF32, absl::StrCat(name, "_", i)));
    }
    absl::StrAppend(&cases, i + 1 < groups ? absl::StrCat("      case ", i, ":\n") : "      default:\n",
                    "        return kiln::kernels::AdamWGroupTensors{p_new_", i, ", m_new_", i, ", v_new_", i, ", p_", i,
                    ", g_", i, ", m_", i, ", v_", i, "};\n");
  }
  for (const char* name : {"step_size", "decay", "sqrt_bc2", "grad_scale"}) {
    wrapper.params.push_back(Param(DType::kF32, name));
  }
  wrapper.globals = absl::StrCat("// Group i runs on blocks [first_block_i, first_block_i+1).\n",
                                 "__constant__ kiln::kernels::AdamWGroupSlice kGroupSlices[", groups + 1, "] = {\n",
                                 slices, "    {0LL, 1, ", first_block, "},\n};\n\n");
  wrapper.comment = absl::StrCat("adamw p', m', v' at once (in place) for ", Count(groups, "parameter group"), ", ",
                                 Count(elements, "element"), ", ", Count(first_block, "block"),
                                 " split among the groups by size, at most ", per_thread, " chunks per thread");
  wrapper.call = absl::StrCat("AdamWUpdateGroups<", groups, ">(kGroupSlices, [&](int group) {\n    switch (group) {\n",
                              cases, "    }\n  }, step_size, decay, sqrt_bc2, grad_scale, ", literals, ")");
  lowered.kernels.push_back(Emit(node, codegen::KernelName(node), wrapper, first_block, threads));
  return lowered;
}

}  // namespace

// One grid-stride kernel writing p', m', v' in place (each may be null where that result is
// not needed); the four per-step scalars stay operands (device memory). A grouped node's
// one kernel covers all of its groups.
absl::StatusOr<LoweredNode> LowerAdamWUpdate(const Node& node, const CodegenOptions& options) {
  if (node.num_results() > 3) return LowerGroupedAdamWUpdate(node, options);
  ASSIGN_OR_RETURN(const std::string literals, AdamWLiterals(node));
  const int64_t n = node.result_type(0).num_elements();
  LoweredNode lowered = Kernels({});
  lowered.elementwise_in_place = true;
  lowered.in_place_operand_of_results = InPlaceOperandOfResults(node);
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
                              "decay, sqrt_bc2, grad_scale, ", literals, ")");
  lowered.kernels.push_back(Emit(node, codegen::KernelName(node), wrapper, blocks, threads));
  return lowered;
}

}  // namespace kiln::codegen::composite
