// Compile any function of a module and run it: the library form of `kiln compile` followed
// by `kiln eval`'s run, for a graph you built yourself with frontends/tensor.h and nn.h.
//
//   ExecutableOptions options;
//   options.backend = Backend::kCuda;            // or kCpu, the reference backend
//   options.compile.precision = Precision::kBf16;
//   ASSIGN_OR_RETURN(std::unique_ptr<Executable> exe, Compile(*module, "forward", options));
//   ASSIGN_OR_RETURN(std::vector<HostTensor> outputs, exe->Run({x, w1, b1}));
//
// Compile copies the function (the caller's module is left as it was), runs the pass
// pipelines on the copy (by default the forward pipeline, then the default one: what `kiln
// compile` runs; passes/default_pipeline.h) and, for CUDA, generates and loads the kernels
// (frontends/gpu_compile.h). Both backends run the same compiled function, so a CPU result
// is the reference for the GPU's.
//
// The backend is chosen at run time: a binary with the CUDA backend still starts on a machine
// without a GPU driver (kiln never links libcuda), and Compile with Backend::kCuda there
// returns FailedPrecondition saying why ("no CUDA driver ...").
//
// Errors are Status values naming the function, the input (index and parameter name) and the
// types expected and given:
//   "@forward input 1 (%y): expected f32[128,1], given f32[128]"
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ir/graph.h"
#include "ir/host_tensor.h"
#include "ir/reference_backend.h"
#include "passes/compile_options.h"
#include "passes/pipeline.h"

namespace kiln {

class CudaDevice;  // runtime/cuda/device.h, in builds with the CUDA toolkit

enum class Backend { kCpu, kCuda };
absl::string_view BackendName(Backend backend);  // "cpu", "cuda"
// "cpu" or "cuda" (the CLI's --backend also takes "auto": frontends/cli/backend_flag.h).
absl::StatusOr<Backend> ParseBackend(absl::string_view name);
// OK when Backend::kCuda can run here; else why not (built without the CUDA toolkit, no
// driver, no device).
absl::Status CudaBackendAvailable();

struct ExecutableOptions {
  Backend backend = Backend::kCpu;
  // Precision policy, target, disabled passes, dumps (passes/compile_options.h). For CUDA an
  // unset target is the device's; with the CUDA toolkit, unset capabilities are codegen's
  // (on both backends, so that they select the same ops).
  CompileOptions compile;
  // The pipeline: nullopt runs the forward pipeline, then the default one; a list runs
  // exactly those registered passes (passes/pass_registry.h) in order; an empty list runs
  // none (the CPU backend then evaluates the function as built; CUDA needs at least
  // lower-gemm for a function with GEMMs, and says so).
  std::optional<std::vector<std::string>> passes;
  ReferenceOptions reference;  // the CPU backend's threads
  // CUDA: the device to run on, which must outlive the executable; null opens device 0,
  // owned by the executable.
  CudaDevice* device = nullptr;
  bool cuda_graph = true;    // capture the run once as a CUDA graph, then replay it
  std::string kernel_cache;  // NVRTC's cubin cache (codegen/kernel_cache.h); empty: its default
};

// A device buffer of one tensor, encoded in its dtype (bf16: 2 bytes a value, ...).
struct DeviceTensor {
  void* data = nullptr;
  TensorType type;
};

class Executable {
 public:
  virtual ~Executable() = default;
  virtual Backend backend() const = 0;

  // The function as compiled (after the passes); its parameters are Run's inputs in order.
  const Function& function() const { return *function_; }
  const PipelineReport& report() const { return report_; }

  // One run on host tensors, one per parameter, each of its parameter's exact type.
  virtual absl::StatusOr<std::vector<HostTensor>> Run(absl::Span<const HostTensor> inputs) = 0;

  // CUDA only (the CPU backend says so): one run on device buffers of this executable's
  // device. Each input is copied into its parameter's buffer in the arena and each output
  // out of the arena, device to device on the device's stream; returns when they are done.
  // Types are checked as Run checks them.
  virtual absl::Status RunOnDevice(absl::Span<const DeviceTensor> inputs, absl::Span<const DeviceTensor> outputs);
  // CUDA only: where parameter `index` lives in the arena, to fill without a copy (by a
  // kernel of yours on the device's stream, say), then RunInPlace(); and where output `i` of
  // the last run is (valid until the next run).
  virtual absl::StatusOr<DeviceTensor> InputBuffer(int64_t index);
  virtual absl::StatusOr<DeviceTensor> OutputBuffer(int i) const;
  // CUDA only: runs on what the parameters' buffers hold.
  virtual absl::Status RunInPlace();

  // OK, or "@f takes N inputs (%a, %b), given M" / "@f input i (%name): expected T, given U".
  absl::Status CheckInputs(absl::Span<const TensorType> given) const;
  absl::Status CheckInputs(absl::Span<const HostTensor> given) const;

 protected:
  Executable(std::unique_ptr<Module> module, const Function* function, PipelineReport report)
      : module_(std::move(module)), function_(function), report_(std::move(report)) {}
  absl::Status NotOnThisBackend(absl::string_view what) const;

  std::unique_ptr<Module> module_;  // holds function_
  const Function* function_;
  PipelineReport report_;
};

// Compiles `module`'s function `function_name` for options.backend. The module is not
// changed. NotFound for an unknown function (naming those there are); the pipeline's and
// codegen's errors as they come (they name the pass, the node and the op).
absl::StatusOr<std::unique_ptr<Executable>> Compile(const Module& module, absl::string_view function_name,
                                                    const ExecutableOptions& options = {});

}  // namespace kiln
