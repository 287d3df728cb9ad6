// Lowering of sample_tokens to kernels/sampling.cuh: a block of kSamplingThreads per row.
#include <string>

#include "absl/strings/str_cat.h"
#include "codegen/composite_lowerings.h"
#include "codegen/composite_wrapper.h"
#include "codegen/kernel_source.h"
#include "ir/status_macros.h"

namespace kiln::codegen::composite {
namespace {

// A block per row, as many threads as a block takes: a decode batch is tens of rows (tens of
// the GPU's SMs busy), each a vocabulary of tens of thousands of logits read a dozen times
// (the radix selects' passes).
constexpr int kSamplingThreads = 1024;
constexpr int64_t kMaxSamplingVocab = int64_t{1} << 21;

}  // namespace

absl::StatusOr<LoweredNode> LowerSampleTokens(const Node& node, const CodegenOptions& options) {
  (void)options;
  const TensorType& logits = node.operand(0)->type();
  const Rows rows = RowsOf(logits);
  RETURN_IF_ERROR(CheckRowLength(node, rows.length));
  if (rows.length >= kMaxSamplingVocab) {  // kernels/sampling.cuh's kMaxVocab
    return absl::InvalidArgumentError(absl::StrCat(Where(node), ": a vocabulary of ", rows.length,
                                                   " tokens; the sampling kernel takes fewer than ",
                                                   kMaxSamplingVocab));
  }
  if (rows.count == 0) return Kernels({});
  RETURN_IF_ERROR(CheckGrid(node, rows.count));
  Wrapper w;
  w.header = "sampling";
  w.comment = absl::StrCat(Count(rows.count, "row"), " of ", rows.length, " logits, a block of ", kSamplingThreads,
                           " threads per row");
  w.params = {Param(logits.dtype, "logits"), Param(DType::kF32, "sampling"), Param(DType::kI32, "draws")};
  w.call = absl::StrCat("SampleTokens<", CudaTypeName(logits.dtype), ", ", rows.length, ", ", kSamplingThreads,
                        ">(out, logits, sampling, draws)");
  return Kernels({Emit(node, codegen::KernelName(node), w, rows.count, kSamplingThreads)});
}

}  // namespace kiln::codegen::composite
