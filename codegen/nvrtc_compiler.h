// NVRTC: CUDA C++ -> cubin for a named architecture ("sm_90a"), without a GPU. Kernel
// templates from kernels/ are supplied to NVRTC as in-memory headers (they are embedded in
// the binary), so `#include "kernels/rms_norm.cuh"` works anywhere. Results go through the
// on-disk KernelCache when one is given.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "codegen/kernel_cache.h"
#include "codegen/kernel_spec.h"

namespace kiln {

struct NvrtcOptions {
  std::string arch = "sm_90a";  // "sm_XY" or "sm_XYa"
  bool line_info = true;        // -lineinfo: compute-sanitizer and profilers map to source
  bool ptxas_info = false;      // --ptxas-options=-v: registers and spills into CompiledKernel::log (uncached)
};

// Errors carry the kernel name, NVRTC's log and the first lines of the source around the
// reported line.
absl::StatusOr<CompiledKernel> CompileKernel(const KernelSpec& kernel, const NvrtcOptions& options,
                                             KernelCache* cache = nullptr);

// "13.0" etc.; part of every cache key.
std::string NvrtcVersion();

}  // namespace kiln
