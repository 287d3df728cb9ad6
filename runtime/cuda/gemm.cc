#include "runtime/cuda/gemm.h"

#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ir/status_macros.h"
#include "runtime/cuda/cuda_status.h"

namespace kiln {
namespace {

absl::StatusOr<cudaDataType_t> CudaDataType(DType t) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    default: return absl::UnimplementedError(absl::StrCat(DTypeName(t), " GEMMs are not supported"));
  }
}

}  // namespace

GemmPlan::~GemmPlan() {
  if (c_desc_ != nullptr) cublasLtMatrixLayoutDestroy(c_desc_);
  if (b_desc_ != nullptr) cublasLtMatrixLayoutDestroy(b_desc_);
  if (a_desc_ != nullptr) cublasLtMatrixLayoutDestroy(a_desc_);
  if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
}

absl::StatusOr<std::unique_ptr<GemmPlan>> GemmPlan::Create(const GemmDescription& gemm, const CudaDevice& device) {
  std::unique_ptr<GemmPlan> plan(new GemmPlan());
  plan->g_ = gemm;
  const GemmDescription& g = plan->g_;
  const std::string& ctx = g.context;
  absl::StatusOr<cudaDataType_t> in_type = CudaDataType(g.a_dtype);
  absl::StatusOr<cudaDataType_t> out_type = CudaDataType(g.d_dtype);
  if (!in_type.ok() || !out_type.ok() || g.b_dtype != g.a_dtype) {
    return absl::UnimplementedError(absl::StrCat(ctx, ": no cuBLASLt GEMM for ", DTypeName(g.a_dtype), " x ",
                                                 DTypeName(g.b_dtype), " -> ", DTypeName(g.d_dtype),
                                                 " (f32, bf16 and f16 operands are supported)"));
  }
  const DType in_dtype = g.a_dtype, out_dtype = g.d_dtype;
  plan->handle_ = device.cublas();
  plan->out_bytes_ = g.batch * g.m * g.n * DTypeBytes(out_dtype);

  if (g.batch * g.m * g.n * g.k == 0) return plan;  // nothing to multiply: Enqueue zero-fills or does nothing

  const cublasComputeType_t compute = in_dtype == DType::kF32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
  KILN_RETURN_IF_CUBLAS_ERROR(cublasLtMatmulDescCreate(&plan->desc_, compute, CUDA_R_32F), ctx);
  // cuBLAS's A is the IR's b, its B the IR's a (see the header).
  const cublasOperation_t op_a = g.b_k_inner ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.a_k_inner ? CUBLAS_OP_N : CUBLAS_OP_T;
  KILN_RETURN_IF_CUBLAS_ERROR(
      cublasLtMatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)), ctx);
  KILN_RETURN_IF_CUBLAS_ERROR(
      cublasLtMatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)), ctx);
  if (g.bias) {
    ASSIGN_OR_RETURN(const cudaDataType_t bias_type, CudaDataType(g.bias_dtype));
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    KILN_RETURN_IF_CUBLAS_ERROR(
        cublasLtMatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)), ctx);
    KILN_RETURN_IF_CUBLAS_ERROR(cublasLtMatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                               &bias_type, sizeof(bias_type)),
                                ctx);
    if (g.batch > 1) {  // the same bias for every matrix of the batch
      const int64_t stride = 0;
      KILN_RETURN_IF_CUBLAS_ERROR(cublasLtMatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE,
                                                                 &stride, sizeof(stride)),
                                  ctx);
    }
  }

  auto make_layout = [&](cublasLtMatrixLayout_t* desc, cudaDataType_t type, int64_t rows, int64_t cols,
                         int64_t batch_stride) -> absl::Status {
    KILN_RETURN_IF_CUBLAS_ERROR(cublasLtMatrixLayoutCreate(desc, type, rows, cols, rows), ctx);
    if (g.batch > 1) {
      const int32_t count = static_cast<int32_t>(g.batch);
      KILN_RETURN_IF_CUBLAS_ERROR(
          cublasLtMatrixLayoutSetAttribute(*desc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)), ctx);
      KILN_RETURN_IF_CUBLAS_ERROR(cublasLtMatrixLayoutSetAttribute(*desc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                                   &batch_stride, sizeof(batch_stride)),
                                  ctx);
    }
    return absl::OkStatus();
  };
  // Stored (column-major) shapes; ld is always the row count since each matrix is dense.
  RETURN_IF_ERROR(make_layout(&plan->a_desc_, *in_type, g.b_k_inner ? g.k : g.n, g.b_k_inner ? g.n : g.k, g.n * g.k));
  RETURN_IF_ERROR(make_layout(&plan->b_desc_, *in_type, g.a_k_inner ? g.k : g.m, g.a_k_inner ? g.m : g.k, g.m * g.k));
  RETURN_IF_ERROR(make_layout(&plan->c_desc_, *out_type, g.n, g.m, g.m * g.n));

  cublasLtMatmulPreference_t preference = nullptr;
  KILN_RETURN_IF_CUBLAS_ERROR(cublasLtMatmulPreferenceCreate(&preference), ctx);
  const uint64_t max_workspace = static_cast<uint64_t>(g.max_workspace_bytes);
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                               &max_workspace, sizeof(max_workspace));
  std::vector<cublasLtMatmulHeuristicResult_t> results(kCandidates);
  int found = 0;
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasLtMatmulAlgoGetHeuristic(plan->handle_, plan->desc_, plan->a_desc_, plan->b_desc_, plan->c_desc_,
                                            plan->c_desc_, preference, kCandidates, results.data(), &found);
  }
  cublasLtMatmulPreferenceDestroy(preference);
  KILN_RETURN_IF_CUBLAS_ERROR(status, ctx);
  if (found == 0) {
    return absl::UnimplementedError(absl::StrCat(ctx, ": cuBLASLt has no algorithm for batch ", g.batch, ", M ", g.m,
                                                 ", N ", g.n, ", K ", g.k, " (", DTypeName(in_dtype), " -> ",
                                                 DTypeName(out_dtype), ")"));
  }
  for (int i = 0; i < found; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) plan->candidates_.push_back(results[i]);
  }
  if (plan->candidates_.empty()) return absl::InternalError(absl::StrCat(ctx, ": cuBLASLt's heuristic returned no usable algorithm"));
  RETURN_IF_ERROR(plan->UseCandidate(0));
  return plan;
}

absl::Status GemmPlan::UseCandidate(int rank) {
  if (rank < 0 || rank >= static_cast<int>(candidates_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(g_.context, ": cuBLASLt candidate ", rank, " of ", candidates_.size()));
  }
  algo_ = candidates_[rank].algo;
  workspace_bytes_ = static_cast<int64_t>(candidates_[rank].workspaceSize);
  return absl::OkStatus();
}

absl::StatusOr<GemmPlan::Tuning> GemmPlan::Autotune(const GemmBuffers& buffers, cudaStream_t stream) {
  Tuning tuning;
  if (candidates_.size() <= 1) return tuning;
  const std::string& ctx = g_.context;
  cudaEvent_t start = nullptr, stop = nullptr;
  KILN_RETURN_IF_CUDA_ERROR(cudaEventCreate(&start), ctx);
  KILN_RETURN_IF_CUDA_ERROR(cudaEventCreate(&stop), ctx);
  absl::Cleanup destroy = [&] {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  };
  // One warm-up call, then the minimum of a few timed ones: a GEMM of the step runs between
  // other kernels, warm in the instruction cache, so the fastest call is the fair figure.
  constexpr int kTimedCalls = 5;
  double best = 0;
  int chosen = -1;
  for (int rank = 0; rank < static_cast<int>(candidates_.size()); ++rank) {
    RETURN_IF_ERROR(UseCandidate(rank));
    if (!Enqueue(buffers, stream).ok()) continue;  // an algorithm may refuse the buffers
    double fastest = 0;
    for (int call = 0; call < kTimedCalls; ++call) {
      KILN_RETURN_IF_CUDA_ERROR(cudaEventRecord(start, stream), ctx);
      RETURN_IF_ERROR(Enqueue(buffers, stream));
      KILN_RETURN_IF_CUDA_ERROR(cudaEventRecord(stop, stream), ctx);
      KILN_RETURN_IF_CUDA_ERROR(cudaEventSynchronize(stop), ctx);
      float ms = 0;
      KILN_RETURN_IF_CUDA_ERROR(cudaEventElapsedTime(&ms, start, stop), ctx);
      const double us = 1000.0 * ms;
      if (call == 0 || us < fastest) fastest = us;
    }
    ++tuning.candidates;
    if (rank == 0) tuning.first_us = fastest;
    if (chosen < 0 || fastest < best) {
      best = fastest;
      chosen = rank;
    }
  }
  if (chosen < 0) return absl::InternalError(absl::StrCat(ctx, ": no cuBLASLt candidate ran"));
  // Keep the heuristic's choice unless another is clearly faster (timing noise is ~1%).
  if (tuning.first_us > 0 && best > 0.97 * tuning.first_us) {
    chosen = 0;
    best = tuning.first_us;
  }
  RETURN_IF_ERROR(UseCandidate(chosen));
  tuning.chosen = chosen;
  tuning.best_us = best;
  return tuning;
}

absl::Status GemmPlan::Enqueue(const GemmBuffers& buffers, cudaStream_t stream) const {
  const GemmDescription& g = g_;
  if (g.batch * g.m * g.n == 0) return absl::OkStatus();
  if (g.k == 0 && g.beta == 0.0f && !g.bias) {  // an empty sum
    KILN_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(buffers.out, 0, out_bytes_, stream), g.context);
    return absl::OkStatus();
  }
  if (g.k == 0) return absl::UnimplementedError(absl::StrCat(g.context, ": a gemm with K = 0 and beta != 0 or a bias"));
  if (g.bias) {
    if (buffers.bias == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(g.context, ": epilogue=bias without a bias"));
    }
    KILN_RETURN_IF_CUBLAS_ERROR(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &buffers.bias,
                                                               sizeof(buffers.bias)),
                                g.context);
  }
  void* workspace = workspace_bytes_ > 0 ? buffers.scratch : nullptr;
  // cuBLAS's A is the IR's b and its B the IR's a (see the header); C is read only if beta != 0.
  KILN_RETURN_IF_CUBLAS_ERROR(cublasLtMatmul(handle_, desc_, &g.alpha, buffers.b, a_desc_, buffers.a, b_desc_, &g.beta,
                                             buffers.c != nullptr ? buffers.c : buffers.out, c_desc_, buffers.out,
                                             c_desc_, &algo_, workspace, workspace_bytes_, stream),
                              g.context);
  return absl::OkStatus();
}

}  // namespace kiln
