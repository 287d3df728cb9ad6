// Lowering of sum_of_squares to the two kernels of kernels/sum_of_squares.cuh.
#include "codegen/composite_lowerings.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codegen/composite_wrapper.h"
#include "codegen/kernel_source.h"
#include "ir/status_macros.h"

namespace kiln::codegen::composite {
namespace {

// Elements per block of the first kernel: 64 KiB of f32, 16 16-byte loads per thread of a
// 256-thread block, so a block's fixed cost (its reduction, one store) stays small beside its
// loads, and a 590K-element gradient still spreads over 36 blocks.
constexpr int64_t kChunkElements = 16384;
constexpr int kPartialsThreads = 256;
constexpr int kFinishThreads = 1024;

}  // namespace

absl::StatusOr<LoweredNode> LowerSumOfSquares(const Node& node, const CodegenOptions&) {
  const DType dtype = node.operand(0)->type().dtype;
  std::vector<std::string> sizes, names;
  int64_t blocks = 0, elements = 0;
  Wrapper partials;
  for (int i = 0; i < node.num_operands(); ++i) {
    const int64_t n = node.operand(i)->type().num_elements();
    sizes.push_back(absl::StrCat(n, "LL"));
    names.push_back(absl::StrCat("x", i));
    partials.params.push_back(Param(dtype, names.back()));
    blocks += CeilDiv(n, kChunkElements);
    elements += n;
  }
  LoweredNode lowered = Kernels({});
  // Every operand empty: no partials; the finishing block alone writes the sum, 0.
  lowered.scratch_bytes = std::max<int64_t>(blocks, 1) * static_cast<int64_t>(sizeof(float));
  partials.params.push_back("float* partials");
  auto instance = [&](int threads) {
    return absl::StrCat("SumOfSquares<", CudaTypeName(dtype), ", ", threads, ", ", kChunkElements, "LL, ",
                        absl::StrJoin(sizes, ", "), ">");
  };
  partials.header = "sum_of_squares";
  partials.comment = absl::StrCat("partial sums of squares: ", Count(node.num_operands(), "operand"), ", ",
                                  Count(elements, "element"), ", a block per chunk of ", kChunkElements);
  partials.call = absl::StrCat(instance(kPartialsThreads), "::Partials(partials, ", absl::StrJoin(names, ", "), ")");
  Wrapper finish = partials;
  finish.comment = absl::StrCat("the ", Count(blocks, "partial"), " summed in order by one block");
  finish.call = absl::StrCat(instance(kFinishThreads), "::Finish(out, partials)");
  const std::string name = codegen::KernelName(node);
  if (blocks > 0) lowered.kernels.push_back(Emit(node, name + "_partials", partials, blocks, kPartialsThreads));
  lowered.kernels.push_back(Emit(node, name + "_finish", finish, 1, kFinishThreads));
  return lowered;
}

}  // namespace kiln::codegen::composite
