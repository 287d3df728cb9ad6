#include "runtime/cuda/gemm.h"

#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ir/status_macros.h"
#include "codegen/gemm_rules.h"
#include "runtime/cuda/cuda_status.h"

namespace kiln {
namespace {

absl::StatusOr<cudaDataType_t> CudaDataType(DType t) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    case DType::kF8E4M3: return CUDA_R_8F_E4M3;
    case DType::kF8E5M2: return CUDA_R_8F_E5M2;
    default: return absl::UnimplementedError(absl::StrCat(DTypeName(t), " GEMMs are not supported"));
  }
}

}  // namespace

GemmPlan::~GemmPlan() {
  if (d_desc_ != nullptr && d_desc_ != c_desc_) cublasLtMatrixLayoutDestroy(d_desc_);
  if (c_desc_ != nullptr) cublasLtMatrixLayoutDestroy(c_desc_);
  if (b_desc_ != nullptr) cublasLtMatrixLayoutDestroy(b_desc_);
  if (a_desc_ != nullptr) cublasLtMatrixLayoutDestroy(a_desc_);
  if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
}

absl::Status GemmPlan::CheckSupported(const GemmDescription& g) {
  if (IsFp8Gemm(g) || g.scaled || g.amax) {
    if (const std::string why = Fp8GemmUnsupportedReason(g); !why.empty()) {
      return absl::UnimplementedError(absl::StrCat(g.context, ": no FP8 cuBLASLt GEMM: ", why));
    }
    return absl::OkStatus();
  }
  const bool operands_ok = g.a_dtype == g.b_dtype && CudaDataType(g.a_dtype).ok();
  if (!operands_ok || (g.d_dtype != DType::kF32 && g.d_dtype != g.a_dtype)) {
    return absl::UnimplementedError(absl::StrCat(g.context, ": no cuBLASLt GEMM for ", DTypeName(g.a_dtype), " x ",
                                                 DTypeName(g.b_dtype), " -> ", DTypeName(g.d_dtype),
                                                 " (f32, bf16 and f16 operands are supported, and fp8 ones scaled)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GemmPlan>> GemmPlan::Create(const GemmDescription& gemm, const CudaDevice& device) {
  RETURN_IF_ERROR(CheckSupported(gemm));
  std::unique_ptr<GemmPlan> plan(new GemmPlan());
  plan->g_ = gemm;
  const GemmDescription& g = plan->g_;
  const std::string& ctx = g.context;
  const bool fp8 = IsFp8Gemm(g);
  if (fp8 && !device.target().has_fp8) {
    return absl::UnimplementedError(absl::StrCat(ctx, ": FP8 GEMMs need FP8 tensor cores (sm_89, sm_90); this GPU is ",
                                                 device.arch()));
  }
  ASSIGN_OR_RETURN(const cudaDataType_t a_type, CudaDataType(g.a_dtype));
  ASSIGN_OR_RETURN(const cudaDataType_t b_type, CudaDataType(g.b_dtype));
  ASSIGN_OR_RETURN(const cudaDataType_t d_type, CudaDataType(g.d_dtype));
  // cuBLASLt's C for an fp8 D is bf16 (read only when beta != 0, which CheckSupported refuses).
  const cudaDataType_t c_type = IsFp8(g.d_dtype) ? CUDA_R_16BF : d_type;
  plan->handle_ = device.cublas();
  plan->out_bytes_ = g.batch * g.m * g.n * DTypeBytes(g.d_dtype);

  if (g.batch * g.m * g.n * g.k == 0) return plan;  // nothing to multiply: Enqueue zero-fills or does nothing

  const cublasComputeType_t compute = g.a_dtype == DType::kF32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
  KILN_RETURN_IF_CUBLAS_ERROR(cublasLtMatmulDescCreate(&plan->desc_, compute, CUDA_R_32F), ctx);
  // cuBLAS's A is the IR's b, its B the IR's a (see the header).
  const cublasOperation_t op_a = g.b_k_inner ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.a_k_inner ? CUBLAS_OP_N : CUBLAS_OP_T;
  KILN_RETURN_IF_CUBLAS_ERROR(
      cublasLtMatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)), ctx);
  KILN_RETURN_IF_CUBLAS_ERROR(
      cublasLtMatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)), ctx);
  if (fp8) {  // partial sums promoted to f32 (the default, written out: see the header)
    const int8_t fast_accumulation = 0;
    KILN_RETURN_IF_CUBLAS_ERROR(cublasLtMatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                                                               &fast_accumulation, sizeof(fast_accumulation)),
                                ctx);
  }
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
  RETURN_IF_ERROR(make_layout(&plan->a_desc_, b_type, g.b_k_inner ? g.k : g.n, g.b_k_inner ? g.n : g.k, g.n * g.k));
  RETURN_IF_ERROR(make_layout(&plan->b_desc_, a_type, g.a_k_inner ? g.k : g.m, g.a_k_inner ? g.m : g.k, g.m * g.k));
  RETURN_IF_ERROR(make_layout(&plan->c_desc_, c_type, g.n, g.m, g.m * g.n));
  if (c_type == d_type) {
    plan->d_desc_ = plan->c_desc_;
  } else {
    RETURN_IF_ERROR(make_layout(&plan->d_desc_, d_type, g.n, g.m, g.m * g.n));
  }

  cublasLtMatmulPreference_t preference = nullptr;
  KILN_RETURN_IF_CUBLAS_ERROR(cublasLtMatmulPreferenceCreate(&preference), ctx);
  const uint64_t max_workspace = static_cast<uint64_t>(g.max_workspace_bytes);
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                               &max_workspace, sizeof(max_workspace));
  std::vector<cublasLtMatmulHeuristicResult_t> results(kCandidates);
  int found = 0;
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasLtMatmulAlgoGetHeuristic(plan->handle_, plan->desc_, plan->a_desc_, plan->b_desc_, plan->c_desc_,
                                            plan->d_desc_, preference, kCandidates, results.data(), &found);
  }
  cublasLtMatmulPreferenceDestroy(preference);
  KILN_RETURN_IF_CUBLAS_ERROR(status, ctx);
  if (found == 0) {
    return absl::UnimplementedError(absl::StrCat(ctx, ": cuBLASLt has no algorithm for batch ", g.batch, ", M ", g.m,
                                                 ", N ", g.n, ", K ", g.k, " (", DTypeName(g.a_dtype),
                                                 fp8 ? absl::StrCat(" x ", DTypeName(g.b_dtype)) : "", " -> ",
                                                 DTypeName(g.d_dtype), ", ", GemmLayouts(g), ")"));
  }
  for (int i = 0; i < found; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) plan->candidates_.push_back(results[i]);
  }
  if (plan->candidates_.empty()) return absl::InternalError(absl::StrCat(ctx, ": cuBLASLt's heuristic returned no usable algorithm"));
  RETURN_IF_ERROR(plan->UseCandidate(0));
  return plan;
}

std::string GemmPlan::CandidateSummary(int rank) const {
  if (rank < 0 || rank >= static_cast<int>(candidates_.size())) return "none";
  const cublasLtMatmulAlgo_t& algo = candidates_[rank].algo;
  int32_t id = -1, splits = 1;
  uint32_t tile = 0, scheme = 0;
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &written);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &written);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof(splits), &written);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme),
                                       &written);
  return absl::StrCat("algo ", id, " tile ", tile, " split-K ", splits, " scheme ", scheme, " workspace ",
                      candidates_[rank].workspaceSize);
}

absl::Status GemmPlan::UseCandidate(int rank) {
  if (rank < 0 || rank >= static_cast<int>(candidates_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(g_.context, ": cuBLASLt candidate ", rank, " of ", candidates_.size()));
  }
  algo_ = candidates_[rank].algo;
  workspace_bytes_ = static_cast<int64_t>(candidates_[rank].workspaceSize);
  return absl::OkStatus();
}

absl::StatusOr<GemmPlan::Tuning> GemmPlan::Autotune(const GemmBuffers& buffers, cudaStream_t stream,
                                                    const GemmL2Flush& l2_flush) {
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
      if (l2_flush.buffer != nullptr) {  // outside the events: L2 cold, the write itself untimed
        KILN_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(l2_flush.buffer, call, l2_flush.bytes, stream), ctx);
      }
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
  if (g.amax) {
    if (buffers.amax == nullptr) return absl::InvalidArgumentError(absl::StrCat(g.context, ": amax=1 without its buffer"));
    // The maximum of this call (0 for an empty or all-zero D), whatever the buffer held: the
    // header says cuBLASLt sets the value, and zeroing it (4 bytes) makes that so even for an
    // algorithm that folds its tiles' maxima into what is there.
    KILN_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(buffers.amax, 0, sizeof(float), stream), g.context);
  }
  if (g.batch * g.m * g.n == 0) return absl::OkStatus();
  if (g.k == 0 && g.beta == 0.0f && !g.bias) {  // an empty sum
    KILN_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(buffers.out, 0, out_bytes_, stream), g.context);
    return absl::OkStatus();
  }
  if (g.k == 0) return absl::UnimplementedError(absl::StrCat(g.context, ": a gemm with K = 0 and beta != 0 or a bias"));
  auto set_pointer = [&](cublasLtMatmulDescAttributes_t attribute, const void* pointer,
                         const char* what) -> absl::Status {
    if (pointer == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(g.context, ": its ", what, " buffer is missing"));
    }
    KILN_RETURN_IF_CUBLAS_ERROR(cublasLtMatmulDescSetAttribute(desc_, attribute, &pointer, sizeof(pointer)),
                                absl::StrCat(g.context, " (the ", what, " pointer)"));
    return absl::OkStatus();
  };
  if (g.bias) RETURN_IF_ERROR(set_pointer(CUBLASLT_MATMUL_DESC_BIAS_POINTER, buffers.bias, "bias"));
  if (g.scaled) {
    // cuBLAS's A is the IR's b, its B the IR's a (see the header), and so are their scales.
    RETURN_IF_ERROR(set_pointer(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, buffers.b_scale, "b_scale"));
    RETURN_IF_ERROR(set_pointer(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, buffers.a_scale, "a_scale"));
    if (IsFp8(g.d_dtype)) RETURN_IF_ERROR(set_pointer(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, buffers.d_scale, "d_scale"));
  }
  if (g.amax) RETURN_IF_ERROR(set_pointer(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, buffers.amax, "amax"));
  void* workspace = workspace_bytes_ > 0 ? buffers.scratch : nullptr;
  // cuBLAS's A is the IR's b and its B the IR's a (see the header); C is read only if beta != 0.
  // An fp8 D's C (bf16, never read: beta is 0) gets no pointer rather than the D's bytes.
  const void* c = buffers.c != nullptr ? buffers.c : IsFp8(g.d_dtype) ? nullptr : buffers.out;
  KILN_RETURN_IF_CUBLAS_ERROR(cublasLtMatmul(handle_, desc_, &g.alpha, buffers.b, a_desc_, buffers.a, b_desc_, &g.beta,
                                             c, c_desc_, buffers.out, d_desc_, &algo_, workspace, workspace_bytes_,
                                             stream),
                              g.context);
  return absl::OkStatus();
}

}  // namespace kiln
