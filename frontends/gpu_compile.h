// Compile, then run: a Function compiled by codegen into a program for this device's Target
// (codegen/compile_program.h) and loaded by the GPU runtime (runtime/cuda/executable.h). The
// one place the two layers meet; `kiln train`, `kiln eval` and the GPU tests come here.
#pragma once

#ifdef KILN_WITH_CUDA

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "codegen/compile_program.h"
#include "ir/graph.h"
#include "ir/host_tensor.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/executable.h"

namespace kiln {

// Whether kernels launch with programmatic dependent launch (codegen/kernel_spec.h): yes,
// unless $KILN_PDL is "0", the switch that measures what it saves (bench/generate_h200.sh);
// and whether they may read step-invariant values before its wait
// (CodegenOptions::reads_before_wait): yes, unless $KILN_PDL is "0" or "late".
bool ProgrammaticDependentLaunchByDefault();
bool ReadsBeforeWaitByDefault();

struct GpuCompileOptions {
  std::string cache_dir;    // kernel cache; empty: its default
  int compile_threads = 0;  // NVRTC threads; 0: one per core
  bool programmatic_dependent_launch = ProgrammaticDependentLaunchByDefault();
  bool reads_before_wait = ReadsBeforeWaitByDefault();
  // CodegenOptions::paged_attention; CompileForGpu takes $KILN_PAGED_ATTENTION in its place
  // where set (ParsePagedAttentionGeometry's text, e.g. "tc4x3x4x4": for measuring variants).
  CodegenOptions::PagedAttentionGeometry paged_attention;
};

// `f` (lowered for codegen: gemm ops, not dot_general) must outlive the executable.
absl::StatusOr<std::unique_ptr<CudaExecutable>> CompileForGpu(const Function& f, CudaDevice& device,
                                                              const CudaExecutableOptions& run = {},
                                                              const GpuCompileOptions& compile = {});

// Evaluates `f` on the GPU as EvaluateFunction (ir/reference_backend.h) does on the CPU.
absl::StatusOr<std::vector<HostTensor>> EvaluateOnGpu(const Function& f, absl::Span<const HostTensor> args,
                                                      CudaDevice& device, const CudaExecutableOptions& run = {});

}  // namespace kiln

#endif  // KILN_WITH_CUDA
