// A gemm of at most kSmallMGemmMaxRows rows of A, both operands K-inner, with or without C
// (beta), no bias epilogue or FP8 slots (the decode step's projections: one row per sequence
// against a weight, the residual added as C) runs
// kernels/gemv.cuh's SmallMGemm, which streams the weight once at close to the bandwidth,
// instead of a cuBLASLt GEMM (LowerNode chooses; CodegenOptions::small_m_gemv turns it off).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "codegen/kernel_spec.h"
#include "codegen/lower_node.h"
#include "ir/graph.h"

namespace kiln::codegen {

inline constexpr int64_t kSmallMGemmMaxRows = 8;
// The slots of each row's sums of squares in a gemv_norm_gemv fusion's persistent bytes
// (kernels/gemv.cuh: SquareSums::kSlots).
inline constexpr int64_t kSquareSumSlots = 32;

// Why `node` does not take SmallMGemm ("batch 2 (...)", "m 16 is not in [1, 8]", ...), or ""
// when it does.
std::string SmallMGemmRefusal(const Node& node, const CodegenOptions& options);

// The one kernel; InvalidArgument with SmallMGemmRefusal's reason for a gemm it does not take.
absl::StatusOr<LoweredNode> LowerSmallMGemm(const Node& node, const CodegenOptions& options);

// A gemv_glu fusion (ir/fusion.h; passes/fuse_gemv_glu.h): SmallMGemm's GLU form, one kernel
// computing silu(gate) * up of its gemm's two halves. InvalidArgument naming the pass when its
// gemm is one SmallMGemm does not take (CodegenOptions::small_m_gemv off, say).
absl::StatusOr<LoweredNode> LowerGemvGluFusion(const Node& fusion, const CodegenOptions& options);

// A gemv_norm_gemv fusion (ir/fusion.h; passes/fuse_norm_between_gemvs.h): two kernels, the
// first GEMV adding up the sums of squares of its f32 rows x (SmallMGemm::RunAddingSquares),
// the second reading A = rms_norm(x, w) from x, w and those sums (RunNormedA, GLU form or not).
// The sums live in the node's persistent bytes; x's rows in its scratch where x has no buffer.
// InvalidArgument naming the pass when either gemm is one SmallMGemm does not take.
absl::StatusOr<LoweredNode> LowerGemvNormGemvFusion(const Node& fusion, const CodegenOptions& options);

}  // namespace kiln::codegen
