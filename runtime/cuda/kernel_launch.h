// Loading NVRTC cubins and launching their kernels through the CUDA runtime's library API
// (cudaLibraryLoadData, cudaLibraryGetKernel, cudaLaunchKernel on the cudaKernel_t), so no
// driver entry point is linked.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codegen/kernel_spec.h"

namespace kiln {

// One cubin loaded into the current device's context; unloaded on destruction.
class KernelLibrary {
 public:
  static absl::StatusOr<std::unique_ptr<KernelLibrary>> Load(const CompiledKernel& compiled);
  ~KernelLibrary();
  KernelLibrary(const KernelLibrary&) = delete;
  KernelLibrary& operator=(const KernelLibrary&) = delete;

  cudaKernel_t kernel() const { return kernel_; }
  const std::string& name() const { return name_; }

 private:
  KernelLibrary() = default;
  cudaLibrary_t library_ = nullptr;
  cudaKernel_t kernel_ = nullptr;
  std::string name_;
};

// A kernel with its launch geometry (codegen/kernel_spec.h), ready to enqueue.
struct KernelLaunch {
  cudaKernel_t kernel = nullptr;
  dim3 grid, block;
  uint32_t shared_bytes = 0;
  // Launched with programmatic stream serialization (programmatic dependent launch): the
  // kernel may start before the one ahead of it in the stream has finished, which is safe
  // because it waits for the grid dependency first (KernelSpec::waits_for_grid_dependency).
  // Under stream capture the graph gets a programmatic edge.
  bool programmatic = false;
  std::string name;  // for errors
};

// Geometry from `spec`, programmatic where it waits for the grid dependency; raises the kernel's dynamic shared memory limit when it asks for
// more than the default 48 KiB.
absl::StatusOr<KernelLaunch> PrepareLaunch(const KernelLibrary& library, const KernelSpec& spec, int device_ordinal);

// Launches with one pointer argument per entry of `pointers` (the output, then the
// operands, then the node's scratch if it has one: codegen/kernel_spec.h). `context` names the node in errors.
absl::Status EnqueueLaunch(const KernelLaunch& launch, absl::Span<void* const> pointers, cudaStream_t stream,
                           absl::string_view context);

}  // namespace kiln
