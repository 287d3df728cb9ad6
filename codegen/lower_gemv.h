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

// Why `node` does not take SmallMGemm ("batch 2 (...)", "m 16 is not in [1, 8]", ...), or ""
// when it does.
std::string SmallMGemmRefusal(const Node& node, const CodegenOptions& options);

// The one kernel; InvalidArgument with SmallMGemmRefusal's reason for a gemm it does not take.
absl::StatusOr<LoweredNode> LowerSmallMGemm(const Node& node, const CodegenOptions& options);

// A gemv_glu fusion (ir/fusion.h; passes/fuse_gemv_glu.h): SmallMGemm's GLU form, one kernel
// computing silu(gate) * up of its gemm's two halves. InvalidArgument naming the pass when its
// gemm is one SmallMGemm does not take (CodegenOptions::small_m_gemv off, say).
absl::StatusOr<LoweredNode> LowerGemvGluFusion(const Node& fusion, const CodegenOptions& options);

}  // namespace kiln::codegen
