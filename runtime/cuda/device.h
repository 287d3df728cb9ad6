// One CUDA device as kiln uses it: its stream, its cuBLASLt handle, and device memory.
//
// Only the CUDA runtime (linked statically) is used; it reaches the driver at run time, so a
// binary starts on a machine without one, and Available() says why kernels cannot run.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "passes/target.h"

namespace kiln {

class CudaDevice {
 public:
  // OK, or why kiln cannot run kernels here ("no CUDA driver (libcuda not found ...)",
  // "no CUDA device"), with the runtime's own error text.
  static absl::Status Available();
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Open(int ordinal = 0);
  ~CudaDevice();
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  int ordinal() const { return ordinal_; }
  std::string name() const { return name_; }
  // The NVRTC target: "sm_90a" for compute capability 9.0 (kiln uses Hopper's 'a'
  // features), "sm_XY" otherwise.
  std::string arch() const { return target_.arch; }
  // What codegen and the passes compile for on this device (SM count, shared memory, features).
  const Target& target() const { return target_; }
  cudaStream_t stream() const { return stream_; }
  cublasLtHandle_t cublas() const { return cublas_; }
  int64_t free_bytes() const;
  int64_t total_bytes() const { return total_bytes_; }

  // Makes this device current for the calling thread (the runtime's state is per thread).
  absl::Status MakeCurrent() const;

  // cudaMalloc; out of memory says how many bytes `what` asked for and how many are free.
  absl::StatusOr<void*> Allocate(int64_t bytes, absl::string_view what);
  // cudaMallocHost: page-locked host memory, which a cudaMemcpyAsync reads or writes without
  // synchronizing the host with the stream (pageable memory may).
  absl::StatusOr<void*> AllocatePinned(int64_t bytes, absl::string_view what);

 private:
  CudaDevice() = default;
  int ordinal_ = 0;
  std::string name_;
  Target target_;
  int64_t total_bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t cublas_ = nullptr;
};

// Frees device memory from CudaDevice::Allocate.
struct DeviceMemoryDeleter {
  void operator()(void* p) const;
};
using DeviceMemory = std::unique_ptr<void, DeviceMemoryDeleter>;

// Frees host memory from CudaDevice::AllocatePinned.
struct PinnedMemoryDeleter {
  void operator()(void* p) const;
};
using PinnedMemory = std::unique_ptr<void, PinnedMemoryDeleter>;

}  // namespace kiln
