// A gemm of at most kSmallMGemmMaxRows rows of A, both operands K-inner, with or without C
// (beta), no bias epilogue or FP8 slots (the decode step's projections: one row per sequence
// against a weight, the residual added as C) runs a kiln kernel of kernels/gemv.cuh, which
// streams the weight once at close to the bandwidth, instead of a cuBLASLt GEMM: SmallMGemm
// (CUDA-core FMAs) up to kSmallMGemmFmaMaxRows rows, SmallMGemmMma (mma.sync tensor cores,
// bf16 and f16 operands) past them. LowerNode chooses; CodegenOptions::small_m_gemv turns both
// off.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "codegen/kernel_spec.h"
#include "codegen/lower_node.h"
#include "ir/graph.h"

namespace kiln::codegen {

inline constexpr int64_t kSmallMGemmMaxRows = 64;
inline constexpr int64_t kSmallMGemmFmaMaxRows = 8;
// K elements of SmallMGemmMma's chunk: K must be a multiple.
inline constexpr int64_t kSmallMGemmMmaChunk = 32;

// Why `node` does not take SmallMGemm or SmallMGemmMma ("batch 2 (...)", "m 65 is not in
// [1, 64]", ...), or "" when it does.
std::string SmallMGemmRefusal(const Node& node, const CodegenOptions& options);

// The one kernel; InvalidArgument with SmallMGemmRefusal's reason for a gemm it does not take.
absl::StatusOr<LoweredNode> LowerSmallMGemm(const Node& node, const CodegenOptions& options);

}  // namespace kiln::codegen
