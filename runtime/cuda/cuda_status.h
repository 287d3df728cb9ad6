// CUDA runtime and cuBLASLt errors as absl::Status values (DESIGN.md principle 4). Every
// message names the failing call, what it was for (the kernel and the IR node, the buffer),
// and the library's own error name and text:
//   cudaLaunchKernel failed for kernel k_h_exp of %h (exp): cudaErrorInvalidValue: invalid argument
// The context is built only when a call fails.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"

namespace kiln {

// `call` is the call's text; only the function name (up to the first '(') is kept.
absl::Status CudaStatus(cudaError_t error, absl::string_view call, absl::string_view context);
absl::Status CublasStatus(cublasStatus_t status, absl::string_view call, absl::string_view context);

// "%h (exp)": how errors name the IR node a call was for.
std::string NodeContext(const Node& node);

}  // namespace kiln

// Evaluates a cudaError_t expression; on failure returns a Status naming the call and
// `context` (any expression convertible to absl::string_view, evaluated only on failure).
#define KILN_RETURN_IF_CUDA_ERROR(call, context)                                          \
  do {                                                                                     \
    const cudaError_t _kiln_cuda_error = (call);                                           \
    if (_kiln_cuda_error != cudaSuccess) return ::kiln::CudaStatus(_kiln_cuda_error, #call, (context)); \
  } while (0)

#define KILN_RETURN_IF_CUBLAS_ERROR(call, context)                                         \
  do {                                                                                     \
    const cublasStatus_t _kiln_cublas_status = (call);                                     \
    if (_kiln_cublas_status != CUBLAS_STATUS_SUCCESS)                                      \
      return ::kiln::CublasStatus(_kiln_cublas_status, #call, (context));                  \
  } while (0)
