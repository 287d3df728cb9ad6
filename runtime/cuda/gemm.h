// gemm on cuBLASLt: every IR gemm (made from a dot_general by passes/lower_gemm.h, which
// also inserts any transposes an operand needs) is one strided-batched matmul, planned once
// (descriptors, layouts and the heuristic's algorithm) when the executable is created, never
// inside a run (DESIGN.md principle 6). The plan reads the gemm's description, which codegen
// made from the gemm node (codegen/program.h).
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
// epilogue=bias: cuBLASLt's CUBLASLT_EPILOGUE_BIAS adds a vector of length rows-of-D in its
// column-major view, which is N, the IR's columns: D[i, j] += bias[j], as the IR defines it.
// The bias pointer is an attribute of the matmul descriptor, so a plan with a bias sets it
// at each enqueue (in a CUDA graph, once at capture: the arena's addresses do not move).
//
// Numerics: bf16/f16 operands accumulate in f32 (CUBLAS_COMPUTE_32F, f32 alpha/beta) and
// round once to the result dtype; f32 operands use CUBLAS_COMPUTE_32F_PEDANTIC, so no TF32
// or other reduced-precision path is ever taken (kiln's fp32 policy).
//
// FP8 (gemm {scaled=1}: a, b f8e4m3 or f8e5m2, CUDA_R_8F_E4M3 / CUDA_R_8F_E5M2): cuBLASLt's
//   D = d_scale (alpha a_scale b_scale A B + beta C),  amax = max |alpha a_scale b_scale A B + beta C|
// with the scales f32 scalars on the device. As with the operands, cuBLAS's A scale is the
// IR's b_scale and its B scale the IR's a_scale. Accumulation: CUBLASLT_MATMUL_DESC_FAST_ACCUM
// is set to 0 (cuBLASLt's default, written out so that the choice is visible): cuBLASLt then
// promotes the tensor cores' partial sums to f32 at intervals of K. Inside an interval Hopper's
// FP8 MMA still keeps only about 13 fraction bits (DeepSeek-V3's report: "around 14 bits"),
// so an FP8 GEMM is not f32-accurate either way (tests/gpu_gemm_test.cc's
// Fp8AccumulationBound); the fast mode never promotes, and its error grows with K.
// Transformer Engine turns fast accumulation on for forward GEMMs only, never for gradients;
// whether kiln's forward may take it is the FP8 policy's call, to be measured, not this plan's.
// What cuBLASLt 13 takes on sm_89/sm_90 (CheckSupported says which rule a description breaks):
//   operands  e4m3 x e4m3, e4m3 x e5m2, e5m2 x e4m3 (never e5m2 x e5m2), both K-inner: a mk
//             and b nk, cuBLAS's TN (a producer writes the transposed copy; lower-gemm does
//             not make one), K a multiple of 16
//   D         bf16, f16 or f32, C of D's type; or fp8 (e5m2 only from mixed operands) with
//             d_scale, and then beta = 0: cuBLASLt's C for an fp8 D is bf16 or f16, never
//             the fp8 D's own type that the IR gives c (its C layout is still bf16, unread)
//   bias      of D's type for a bf16 or f16 D (cuBLASLt's fp8 bias is bf16 for an f32 D and
//             bf16/f16 for an fp8 D, which the IR's bias of D's type cannot be)
//   amax      for an fp8 D only: cuBLASLt 13 has no algorithm that computes AMAX_D for a bf16,
//             f16 or f32 D (on the H200 the heuristic offers some and none of them runs), so
//             the amax of a wide result must come from the kernel that consumes it
// d_scale goes to CUBLASLT_MATMUL_DESC_D_SCALE_POINTER for an fp8 D only (for another D the
// description's d_scale is 1: codegen/program.h). The scale and amax pointers, like the bias
// pointer, are attributes of the matmul descriptor, set at each enqueue.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codegen/program.h"
#include "runtime/cuda/device.h"

namespace kiln {

// The device buffers of one call, each 256-byte aligned like every arena buffer. `c` is null
// when beta is 0, `bias` without epilogue=bias, the scales without scaled=1 (d_scale is read
// for an fp8 D only), `amax` without amax=1; `scratch` holds the description's
// max_workspace_bytes.
struct GemmBuffers {
  void* out = nullptr;
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;
  const void* bias = nullptr;
  const void* a_scale = nullptr;
  const void* b_scale = nullptr;
  const void* d_scale = nullptr;
  void* amax = nullptr;
  void* scratch = nullptr;
};

// Device memory that GemmPlan::Autotune writes before each timed call, to start it from a cold
// L2 (at least twice L2's size); a null buffer times warm.
struct GemmL2Flush {
  void* buffer = nullptr;
  int64_t bytes = 0;
};

class GemmPlan {
 public:
  // Unimplemented for a description CheckSupported refuses, on a GPU without FP8 tensor cores
  // for an FP8 one, and when cuBLASLt has no algorithm for it within its workspace.
  static absl::StatusOr<std::unique_ptr<GemmPlan>> Create(const GemmDescription& gemm, const CudaDevice& device);
  // Whether cuBLASLt takes the description's dtypes, layouts, C and bias (the rules above);
  // Unimplemented naming the gemm and the rule it breaks. Needs no GPU.
  static absl::Status CheckSupported(const GemmDescription& gemm);
  ~GemmPlan();
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;

  const GemmDescription& description() const { return g_; }
  // The workspace its algorithm uses (at most the description's maximum, which the plan
  // reserves).
  int64_t workspace_bytes() const { return workspace_bytes_; }

  // Enqueues the matmul (with amax=1, a 4-byte memset of the amax first, so that it is this
  // call's maximum whatever the buffer held).
  absl::Status Enqueue(const GemmBuffers& buffers, cudaStream_t stream) const;

  // cuBLASLt's heuristic ranks algorithms by a model, and on the H200 its first choice is
  // not always the fastest: M16384 N768 K2048 with an f32 C (beta = 1) ran at 450 TFLOP/s
  // against 670 for the same shape with beta = 0. Autotune times each of the heuristic's
  // candidates (at most kCandidates) on the given buffers and keeps the fastest. It
  // overwrites `out` and `amax` (and reads the rest), so call it before they hold anything.
  // With `l2_flush` (device memory at least twice L2's size), every timed call starts from a
  // cold L2, as a step's GEMM does: its weights were last read a step ago. Timed warm, a
  // decode GEMM's weights (llama-M's o projection: 8.6 MB) stay in the 50 MB L2 from one
  // call to the next, and the choice favours tiles that only pay off on L2-resident data.
  struct Tuning {
    int candidates = 0;        // algorithms timed
    int chosen = 0;            // the heuristic's rank of the one kept (0: its first choice)
    double first_us = 0;       // the heuristic's first choice, per call
    double best_us = 0;        // the one kept, per call
  };
  static constexpr int kCandidates = 16;

  absl::StatusOr<Tuning> Autotune(const GemmBuffers& buffers, cudaStream_t stream, const GemmL2Flush& l2_flush);
  // Uses the heuristic's candidate `rank` (from a Tuning of a plan of the same description).
  absl::Status UseCandidate(int rank);
  int num_candidates() const { return static_cast<int>(candidates_.size()); }
  // The candidate's cuBLASLt configuration, for reports ("algo 66 tile 20 split-K 4 ...").
  std::string CandidateSummary(int rank) const;

 private:
  GemmPlan() = default;

  GemmDescription g_;
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  // cuBLAS's A, B, C and D; d_desc_ is c_desc_ but for an fp8 D (whose C is bf16).
  cublasLtMatrixLayout_t a_desc_ = nullptr, b_desc_ = nullptr, c_desc_ = nullptr, d_desc_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  std::vector<cublasLtMatmulHeuristicResult_t> candidates_;  // the heuristic's ranking, best first
  int64_t out_bytes_ = 0;
  int64_t workspace_bytes_ = 0;
};

}  // namespace kiln
