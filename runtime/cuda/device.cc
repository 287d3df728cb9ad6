#include "runtime/cuda/device.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ir/status_macros.h"
#include "runtime/cuda/cuda_status.h"

namespace kiln {

absl::Status CudaDevice::Available() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  const std::string detail = absl::StrCat(" (", cudaGetErrorName(error), ": ", cudaGetErrorString(error), ")");
  switch (error) {
    case cudaSuccess:
      return count > 0 ? absl::OkStatus() : absl::FailedPreconditionError("no CUDA device");
    case cudaErrorInsufficientDriver:
      return absl::FailedPreconditionError(absl::StrCat(
          "no CUDA driver (libcuda not found, or older than the CUDA runtime kiln was built with)", detail));
    case cudaErrorNoDevice:
      return absl::FailedPreconditionError(absl::StrCat("no CUDA device", detail));
    default:
      return absl::FailedPreconditionError(absl::StrCat("CUDA is not usable here", detail));
  }
}

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Open(int ordinal) {
  RETURN_IF_ERROR(Available());
  std::unique_ptr<CudaDevice> d(new CudaDevice());
  d->ordinal_ = ordinal;
  const std::string what = absl::StrCat("device ", ordinal);
  KILN_RETURN_IF_CUDA_ERROR(cudaSetDevice(ordinal), what);
  cudaDeviceProp props;
  KILN_RETURN_IF_CUDA_ERROR(cudaGetDeviceProperties(&props, ordinal), what);
  d->name_ = props.name;
  d->target_ = TargetForDevice(props.major, props.minor, props.multiProcessorCount,
                               static_cast<int64_t>(props.sharedMemPerBlockOptin),
                               absl::StrCat("device ", ordinal, ", ", props.name));
  d->total_bytes_ = static_cast<int64_t>(props.totalGlobalMem);
  KILN_RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&d->stream_, cudaStreamNonBlocking), what);
  KILN_RETURN_IF_CUBLAS_ERROR(cublasLtCreate(&d->cublas_), what);
  return d;
}

CudaDevice::~CudaDevice() {
  // Errors cannot be reported from a destructor; a failed device is going away anyway.
  cudaSetDevice(ordinal_);
  if (cublas_ != nullptr) cublasLtDestroy(cublas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

int64_t CudaDevice::free_bytes() const {
  size_t free = 0, total = 0;
  if (cudaSetDevice(ordinal_) != cudaSuccess || cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
  return static_cast<int64_t>(free);
}

absl::Status CudaDevice::MakeCurrent() const {
  KILN_RETURN_IF_CUDA_ERROR(cudaSetDevice(ordinal_), absl::StrCat("device ", ordinal_));
  return absl::OkStatus();
}

absl::StatusOr<void*> CudaDevice::Allocate(int64_t bytes, absl::string_view what) {
  RETURN_IF_ERROR(MakeCurrent());
  void* p = nullptr;
  const cudaError_t error = cudaMalloc(&p, static_cast<size_t>(bytes));
  if (error == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky-free error so later calls are unaffected
    return absl::ResourceExhaustedError(
        absl::StrFormat("out of GPU memory on %s: %s asked for %d bytes (%.2f GiB); %d bytes (%.2f GiB) free of %.2f GiB",
                        name_, what, bytes, bytes / 1073741824.0, free_bytes(), free_bytes() / 1073741824.0,
                        total_bytes_ / 1073741824.0));
  }
  if (error != cudaSuccess) return CudaStatus(error, "cudaMalloc", absl::StrCat(what, " (", bytes, " bytes)"));
  return p;
}

absl::StatusOr<void*> CudaDevice::AllocatePinned(int64_t bytes, absl::string_view what) {
  RETURN_IF_ERROR(MakeCurrent());
  void* p = nullptr;
  KILN_RETURN_IF_CUDA_ERROR(cudaMallocHost(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1))),
                            absl::StrCat("page-locked host memory for ", what, " (", bytes, " bytes)"));
  return p;
}

void DeviceMemoryDeleter::operator()(void* p) const { cudaFree(p); }
void PinnedMemoryDeleter::operator()(void* p) const { cudaFreeHost(p); }

}  // namespace kiln
