#include "runtime/cuda/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace kiln {
namespace {

absl::string_view CallName(absl::string_view call) { return call.substr(0, call.find('(')); }

std::string ForContext(absl::string_view context) {
  return context.empty() ? std::string() : absl::StrCat(" for ", context);
}

absl::StatusCode CodeOf(cudaError_t error) {
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorNoKernelImageForDevice:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::Status CudaStatus(cudaError_t error, absl::string_view call, absl::string_view context) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::Status(CodeOf(error), absl::StrCat(CallName(call), " failed", ForContext(context), ": ",
                                                  cudaGetErrorName(error), ": ", cudaGetErrorString(error)));
}

absl::Status CublasStatus(cublasStatus_t status, absl::string_view call, absl::string_view context) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const absl::StatusCode code =
      status == CUBLAS_STATUS_ALLOC_FAILED ? absl::StatusCode::kResourceExhausted
      : status == CUBLAS_STATUS_NOT_SUPPORTED ? absl::StatusCode::kUnimplemented
                                              : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(CallName(call), " failed", ForContext(context), ": ",
                                         cublasLtGetStatusName(status), ": ", cublasLtGetStatusString(status)));
}

std::string NodeContext(const Node& node) { return absl::StrCat("%", node.name(), " (", node.op_name(), ")"); }

}  // namespace kiln
