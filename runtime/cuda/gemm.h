// gemm on cuBLASLt: every IR gemm (made from a dot_general by passes/lower_gemm.h, which
// also inserts any transposes an operand needs) is one strided-batched matmul, planned once
// (descriptors, layouts and the heuristic's algorithm) when the executable is created, never
// inside a run (DESIGN.md principle 6). The plan reads the gemm node alone.
//
// The IR is row-major; cuBLAS is column-major. A row-major [M, N] matrix is the same bytes as
// a column-major N x M matrix, its transpose. So C[b] = A[b] · B[b] (row-major, A the IR's a,
// B the IR's b) is computed as Cᵀ = Bᵀ · Aᵀ in column-major terms: cuBLAS's first operand is
// the IR's b, its second the IR's a, and the result is column-major N x M with ld N, which is
// the row-major [M, N] the IR expects. Each operand's layout attribute says only in which
// order its two matrix dims sit in memory:
//
//   IR a in memory         column-major view   cuBLAS B op   IR b in memory         cuBLAS A op
//   [batch, M, K] (mk)     K x M, ld K         N             [batch, N, K] (nk)     T (K x N, ld K)
//   [batch, K, M] (km)     M x K, ld M         T             [batch, K, N] (kn)     N (N x K, ld N)
//
// with batch strides M·K, N·K and M·N. D = alpha A B + beta C, C the gemm's third operand.
//
// Numerics: bf16/f16 operands accumulate in f32 (CUBLAS_COMPUTE_32F, f32 alpha/beta) and
// round once to the result dtype; f32 operands use CUBLAS_COMPUTE_32F_PEDANTIC, so no TF32
// or other reduced-precision path is ever taken (kiln's fp32 policy).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ir/graph.h"
#include "runtime/cuda/device.h"

namespace kiln {

// The sizes and layouts of one gemm node, from its attributes. Needs no GPU.
struct GemmLayout {
  int64_t batch = 1, m = 1, n = 1, k = 1;
  bool a_k_inner = true;  // a is [batch, M, K] (mk); else [batch, K, M] (km)
  bool b_k_inner = true;  // b is [batch, N, K] (nk); else [batch, K, N] (kn)
  float alpha = 1.0f, beta = 0.0f;
};

// InvalidArgument when `gemm` is not a gemm node (a dot_general names the lower-gemm pass).
absl::StatusOr<GemmLayout> GemmLayoutOf(const Node& gemm);

class GemmPlan {
 public:
  // Unimplemented for operand/result dtypes cuBLASLt is not used for here (operands must be
  // f32, bf16 or f16 alike; the result f32 or the operands' dtype).
  static absl::StatusOr<std::unique_ptr<GemmPlan>> Create(const Node& gemm, const CudaDevice& device);
  ~GemmPlan();
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;

  const GemmLayout& layout() const { return layout_; }
  // Arena bytes needed while the GEMM runs: the cuBLASLt workspace.
  int64_t scratch_bytes() const { return scratch_bytes_; }

  // Enqueues the matmul. `c` is the gemm's third operand (null when beta is 0); `scratch`
  // holds scratch_bytes(), 256-byte aligned, like every operand.
  absl::Status Enqueue(void* out, const void* a, const void* b, const void* c, void* scratch,
                       cudaStream_t stream) const;

 private:
  GemmPlan() = default;

  GemmLayout layout_;
  std::string context_;  // "%name (gemm)"
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_desc_ = nullptr, b_desc_ = nullptr, c_desc_ = nullptr;  // cuBLAS's A, B, C/D
  cublasLtMatmulAlgo_t algo_{};
  int64_t out_bytes_ = 0;
  int64_t workspace_bytes_ = 0;
  int64_t scratch_bytes_ = 0;
};

}  // namespace kiln
