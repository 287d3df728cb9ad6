// dot_general on cuBLASLt: every IR dot_general becomes one strided-batched matmul, planned
// once (descriptors, layouts and the heuristic's algorithm) when the executable is created,
// never inside a run (DESIGN.md principle 6).
//
// The IR is row-major; cuBLAS is column-major. A row-major [M, N] matrix is the same bytes as
// a column-major N x M matrix, its transpose. So C[b] = A[b] · B[b] (row-major, A the IR's lhs
// a, B the rhs b) is computed as Cᵀ = Bᵀ · Aᵀ in column-major terms: cuBLAS's first operand is
// the IR's b, its second the IR's a, and the result is column-major N x M with ld N, which is
// the row-major [M, N] the IR expects. Each operand's transpose flag then says only in which
// order its two matrix dims sit in memory:
//
//   IR a in memory   column-major view     cuBLAS B op     IR b in memory   cuBLAS A op
//   [batch, M, K]    K x M, ld K           N               [batch, N, K]    T (K x N, ld K)
//   [batch, K, M]    M x K, ld M           T               [batch, K, N]    N (N x K, ld N)
//
// with batch strides M·K, N·K and M·N. A dot_general fits this when, in each operand, the
// batch dims lead in their listed order, the free dims are adjacent, the contracting dims are
// adjacent, and both operands order their contracting dims alike (dims of size 1 are ignored
// everywhere). The common cases all fit: x·Wᵀ (x [B,T,D], W [O,D]), dW = dYᵀ·X (contracting B
// and T), attention [B,H,T,D]·[B,H,T,D] contracting D, P·V. An operand that does not fit is
// first copied by a transpose kernel into arena scratch as [batch, free, contracting].
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
#include "codegen/kernel_cache.h"
#include "codegen/nvrtc_compiler.h"
#include "ir/graph.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/kernel_launch.h"

namespace kiln {

// How one dot_general maps onto a strided-batched column-major GEMM. Needs no GPU.
struct GemmLayout {
  int64_t batch = 1, m = 1, n = 1, k = 1;
  bool a_k_inner = true;  // a (after its permutation, if any) is [batch, M, K]; else [batch, K, M]
  bool b_k_inner = true;  // b is [batch, N, K]; else [batch, K, N]
  // Non-empty: the operand is first transposed with this `perm` (ir/op_table.h) into scratch.
  std::vector<int64_t> a_permutation, b_permutation;
};

// InvalidArgument when `dot` is not a well-formed dot_general.
absl::StatusOr<GemmLayout> AnalyzeDotGeneral(const Node& dot);

class GemmPlan {
 public:
  // Unimplemented for operand/result dtypes cuBLASLt is not used for here (operands must be
  // f32, bf16 or f16 alike; the result f32 or the operands' dtype). The transpose kernels, if
  // any, are compiled with `nvrtc` through `cache` (may be null).
  static absl::StatusOr<std::unique_ptr<GemmPlan>> Create(const Node& dot, const CudaDevice& device,
                                                          const NvrtcOptions& nvrtc, KernelCache* cache);
  ~GemmPlan();
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;

  const GemmLayout& layout() const { return layout_; }
  // Arena bytes needed while the GEMM runs: transposed operands and the cuBLASLt workspace.
  int64_t scratch_bytes() const { return scratch_bytes_; }
  int transpose_kernels() const { return static_cast<int>(a_transpose_.size() + b_transpose_.size()); }

  // Enqueues the transposes (if any) and the matmul. `scratch` holds scratch_bytes(), 256-byte
  // aligned, like every operand.
  absl::Status Enqueue(void* out, const void* a, const void* b, void* scratch, cudaStream_t stream) const;

 private:
  struct Transpose {
    std::unique_ptr<KernelLibrary> library;
    KernelLaunch launch;
  };
  GemmPlan() = default;
  static absl::StatusOr<std::vector<Transpose>> BuildTranspose(const Node& dot, int operand,
                                                               const std::vector<int64_t>& perm,
                                                               const CudaDevice& device, const NvrtcOptions& nvrtc,
                                                               KernelCache* cache);

  GemmLayout layout_;
  std::string context_;  // "%name (dot_general)"
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_desc_ = nullptr, b_desc_ = nullptr, c_desc_ = nullptr;  // cuBLAS's A, B, C/D
  cublasLtMatmulAlgo_t algo_{};
  float alpha_ = 1.0f, beta_ = 0.0f;
  int64_t out_bytes_ = 0;
  int64_t a_copy_offset_ = 0, b_copy_offset_ = 0, workspace_offset_ = 0, workspace_bytes_ = 0;
  int64_t scratch_bytes_ = 0;
  std::vector<Transpose> a_transpose_, b_transpose_;
};

}  // namespace kiln
