// A gemm of 9 to 64 rows of A (kSmallMGemmMaxRows + 1 to kFewRowMmaMaxRows: the decode step's
// projections at batch 16, 32 and 64), both operands K-inner, bf16 or f16, no bias epilogue
// or FP8 slots, runs kernels/few_row_gemm.cuh's FewRowMmaGemm on tensor cores instead of a
// cuBLASLt GEMM (LowerNode chooses; CodegenOptions::few_row_mma turns it off).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "codegen/kernel_spec.h"
#include "codegen/lower_node.h"
#include "ir/graph.h"

namespace kiln::codegen {

inline constexpr int64_t kFewRowMmaMaxRows = 64;

// Why `node` does not take FewRowMmaGemm ("m 8 is not in [9, 64]", ...), or "" when it does.
std::string FewRowMmaRefusal(const Node& node, const CodegenOptions& options);

// The kernel's geometry for a gemm of m x n x k (CodegenOptions::few_row_mma_geometry where
// it is given): warps a block, chunks in flight a lane, slices of K, and what follows.
struct FewRowMmaGeometry {
  int warps = 4, unroll = 8, slices = 1;
  int64_t row_blocks = 0, slice_chunks = 0, shared_bytes = 0, scratch_bytes = 0;
};
absl::StatusOr<FewRowMmaGeometry> FewRowMmaGeometryFor(int64_t m, int64_t n, int64_t k, const CodegenOptions& options);

// The one kernel; InvalidArgument with FewRowMmaRefusal's reason for a gemm it does not take.
absl::StatusOr<LoweredNode> LowerFewRowMmaGemm(const Node& node, const CodegenOptions& options);

}  // namespace kiln::codegen
