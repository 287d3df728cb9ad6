#include "frontends/compile.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ir/status_macros.h"
#include "passes/default_pipeline.h"

#ifdef KILN_WITH_CUDA
#include "codegen/capabilities.h"
#include "frontends/gpu_compile.h"
#include "runtime/cuda/cuda_status.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/executable.h"
#endif

namespace kiln {

absl::string_view BackendName(Backend backend) { return backend == Backend::kCuda ? "cuda" : "cpu"; }

absl::StatusOr<Backend> ParseBackend(absl::string_view name) {
  if (name == "cpu") return Backend::kCpu;
  if (name == "cuda") return Backend::kCuda;
  return absl::InvalidArgumentError(absl::StrCat("backend must be cpu or cuda, got '", name, "'"));
}

absl::Status CudaBackendAvailable() {
#ifdef KILN_WITH_CUDA
  return CudaDevice::Available();
#else
  return absl::UnimplementedError("this kiln was built without the CUDA toolkit");
#endif
}

absl::Status Executable::CheckInputs(absl::Span<const TensorType> given) const {
  const std::vector<Node*> params = function_->parameters();
  if (given.size() != params.size()) {
    std::vector<std::string> names;
    for (const Node* p : params) names.push_back(absl::StrCat("%", p->name()));
    return absl::InvalidArgumentError(absl::StrCat("@", function_->name(), " takes ", params.size(), " inputs (",
                                                   absl::StrJoin(names, ", "), "), given ", given.size()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (given[i] != params[i]->type()) {
      return absl::InvalidArgumentError(absl::StrCat("@", function_->name(), " input ", i, " (%", params[i]->name(),
                                                     "): expected ", params[i]->type().ToString(), ", given ",
                                                     given[i].ToString()));
    }
  }
  return absl::OkStatus();
}

absl::Status Executable::CheckInputs(absl::Span<const HostTensor> given) const {
  std::vector<TensorType> types;
  types.reserve(given.size());
  for (const HostTensor& t : given) types.push_back(t.type());
  return CheckInputs(types);
}

absl::Status Executable::NotOnThisBackend(absl::string_view what) const {
  return absl::FailedPreconditionError(absl::StrCat("@", function_->name(), ": ", what,
                                                    " needs the cuda backend; this executable runs on ",
                                                    BackendName(backend())));
}

absl::Status Executable::RunOnDevice(absl::Span<const DeviceTensor>, absl::Span<const DeviceTensor>) {
  return NotOnThisBackend("RunOnDevice");
}
absl::StatusOr<DeviceTensor> Executable::InputBuffer(int64_t) { return NotOnThisBackend("InputBuffer"); }
absl::StatusOr<DeviceTensor> Executable::OutputBuffer(int) const { return NotOnThisBackend("OutputBuffer"); }
absl::Status Executable::RunInPlace() { return NotOnThisBackend("RunInPlace"); }

namespace {

class CpuExecutable : public Executable {
 public:
  CpuExecutable(std::unique_ptr<Module> module, const Function* function, PipelineReport report,
                ReferenceOptions options)
      : Executable(std::move(module), function, std::move(report)), options_(options) {}
  Backend backend() const override { return Backend::kCpu; }
  absl::StatusOr<std::vector<HostTensor>> Run(absl::Span<const HostTensor> inputs) override {
    RETURN_IF_ERROR(CheckInputs(inputs));
    return EvaluateFunction(*function_, inputs, options_);
  }

 private:
  ReferenceOptions options_;
};

#ifdef KILN_WITH_CUDA
class GpuExecutable : public Executable {
 public:
  GpuExecutable(std::unique_ptr<Module> module, const Function* function, PipelineReport report,
                std::unique_ptr<CudaDevice> owned_device, CudaDevice* device)
      : Executable(std::move(module), function, std::move(report)),
        owned_device_(std::move(owned_device)),
        device_(device) {}
  ~GpuExecutable() override { exe_.reset(); }  // the executable's memory before its device

  absl::Status Load(const ExecutableOptions& options) {
    CudaExecutableOptions run;
    run.cuda_graph = options.cuda_graph;
    ASSIGN_OR_RETURN(exe_, CompileForGpu(*function_, *device_, run, {.cache_dir = options.kernel_cache}));
    return absl::OkStatus();
  }

  Backend backend() const override { return Backend::kCuda; }

  absl::StatusOr<std::vector<HostTensor>> Run(absl::Span<const HostTensor> inputs) override {
    RETURN_IF_ERROR(CheckInputs(inputs));
    for (size_t i = 0; i < inputs.size(); ++i) RETURN_IF_ERROR(exe_->SetInput(static_cast<int64_t>(i), inputs[i]));
    RETURN_IF_ERROR(exe_->Run());
    std::vector<HostTensor> outputs;
    for (size_t i = 0; i < function_->outputs().size(); ++i) {
      ASSIGN_OR_RETURN(HostTensor out, exe_->Output(static_cast<int>(i)));
      outputs.push_back(std::move(out));
    }
    return outputs;
  }

  absl::Status RunOnDevice(absl::Span<const DeviceTensor> inputs, absl::Span<const DeviceTensor> outputs) override {
    std::vector<TensorType> types;
    for (const DeviceTensor& t : inputs) types.push_back(t.type);
    RETURN_IF_ERROR(CheckInputs(types));
    const std::vector<Node*>& outs = function_->outputs();
    if (outputs.size() != outs.size()) {
      return absl::InvalidArgumentError(absl::StrCat("@", function_->name(), " has ", outs.size(),
                                                     " outputs, given ", outputs.size(), " output buffers"));
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      if (outputs[i].type != outs[i]->type()) {
        return absl::InvalidArgumentError(absl::StrCat("@", function_->name(), " output ", i, " (%", outs[i]->name(),
                                                       "): expected ", outs[i]->type().ToString(), ", given ",
                                                       outputs[i].type.ToString()));
      }
    }
    RETURN_IF_ERROR(device_->MakeCurrent());
    for (size_t i = 0; i < inputs.size(); ++i) {
      ASSIGN_OR_RETURN(void* dst, exe_->InputAddress(static_cast<int64_t>(i)));
      KILN_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(dst, inputs[i].data, inputs[i].type.num_bytes(),
                                                cudaMemcpyDeviceToDevice, device_->stream()),
                                absl::StrCat("copying input ", i, " of @", function_->name()));
    }
    // Run enqueues on the same stream, after the copies, and synchronizes at its end.
    RETURN_IF_ERROR(exe_->Run());
    for (size_t i = 0; i < outputs.size(); ++i) {
      ASSIGN_OR_RETURN(const void* src, exe_->OutputAddress(static_cast<int>(i)));
      KILN_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(outputs[i].data, src, outputs[i].type.num_bytes(),
                                                cudaMemcpyDeviceToDevice, device_->stream()),
                                absl::StrCat("copying output ", i, " of @", function_->name()));
    }
    KILN_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(device_->stream()),
                              absl::StrCat("copying the outputs of @", function_->name()));
    return absl::OkStatus();
  }

  absl::StatusOr<DeviceTensor> InputBuffer(int64_t index) override {
    ASSIGN_OR_RETURN(void* p, exe_->InputAddress(index));
    return DeviceTensor{p, function_->parameters()[index]->type()};
  }
  absl::StatusOr<DeviceTensor> OutputBuffer(int i) const override {
    ASSIGN_OR_RETURN(const void* p, exe_->OutputAddress(i));
    // The caller may read it with its own kernels; the executable never reads an output.
    return DeviceTensor{const_cast<void*>(p), function_->outputs()[i]->type()};
  }
  absl::Status RunInPlace() override { return exe_->Run(); }

 private:
  std::unique_ptr<CudaDevice> owned_device_;  // null when the caller's
  CudaDevice* device_;
  std::unique_ptr<CudaExecutable> exe_;
};
#endif

// The passes options.passes asks for, on `module`; one report for the whole compile.
absl::StatusOr<PipelineReport> RunPasses(Module& module, const ExecutableOptions& options,
                                         const CompileOptions& compile) {
  std::vector<Pipeline> pipelines;
  if (!options.passes.has_value()) {
    pipelines.push_back(BuildForwardPipeline(compile));
    pipelines.push_back(BuildDefaultPipeline(compile));
  } else if (!options.passes->empty()) {
    ASSIGN_OR_RETURN(Pipeline p, BuildPipelineFromNames(*options.passes, compile));
    pipelines.push_back(std::move(p));
  }
  std::vector<const Pipeline*> all;
  for (const Pipeline& p : pipelines) all.push_back(&p);
  RETURN_IF_ERROR(CheckDisabledPasses(compile, all));
  ASSIGN_OR_RETURN(std::unique_ptr<PassRunner> runner, PassRunner::Create(compile));
  RETURN_IF_ERROR(runner->DumpInput(module));
  PipelineReport report{.pipeline = "none"};
  std::vector<std::string> names;
  for (const Pipeline& p : pipelines) {
    ASSIGN_OR_RETURN(PipelineReport r, p.Run(module, *runner));
    names.push_back(r.pipeline);
    report.passes.insert(report.passes.end(), r.passes.begin(), r.passes.end());
    report.notes.insert(report.notes.end(), r.notes.begin(), r.notes.end());
    report.total_ms += r.total_ms;
  }
  if (!names.empty()) report.pipeline = absl::StrJoin(names, " + ");
  return report;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Executable>> Compile(const Module& module, absl::string_view function_name,
                                                    const ExecutableOptions& options) {
  if (module.FindFunction(function_name) == nullptr) {
    std::vector<std::string> names;
    for (const auto& f : module.functions()) names.push_back(absl::StrCat("@", f->name()));
    return absl::NotFoundError(absl::StrCat("Compile: module @", module.name(), " has no function @", function_name,
                                            " (it has ", names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
  }
  CompileOptions compile = options.compile;
#ifdef KILN_WITH_CUDA
  // Both backends select the same ops (flash attention, ...), so that they compute one graph.
  if (compile.capabilities == nullptr) compile.capabilities = &CodegenCapabilities();
  std::unique_ptr<CudaDevice> owned_device;
  CudaDevice* device = options.device;
#endif
  if (options.backend == Backend::kCuda) {
    absl::Status usable = CudaBackendAvailable();
    if (!usable.ok()) {
      return absl::Status(usable.code(), absl::StrCat("Compile @", function_name, ": backend cuda: ", usable.message()));
    }
#ifdef KILN_WITH_CUDA
    if (device == nullptr) {
      ASSIGN_OR_RETURN(owned_device, CudaDevice::Open(0));
      device = owned_device.get();
    }
    if (!compile.target.has_value()) compile.target = device->target();
#endif
  }

  // A copy holding this function alone: the passes rewrite it, and run on nothing else.
  std::unique_ptr<Module> copy = CloneModule(module);
  std::vector<std::string> others;
  for (const auto& f : copy->functions()) {
    if (f->name() != function_name) others.push_back(f->name());
  }
  for (const std::string& name : others) copy->RemoveFunction(name);
  absl::StatusOr<PipelineReport> report = RunPasses(*copy, options, compile);
  if (!report.ok()) {
    return absl::Status(report.status().code(),
                        absl::StrCat("Compile @", function_name, ": ", report.status().message()));
  }
  const Function* function = copy->FindFunction(function_name);
  if (function == nullptr) return absl::InternalError(absl::StrCat("the passes removed @", function_name));

  if (options.backend == Backend::kCpu) {
    return std::unique_ptr<Executable>(
        new CpuExecutable(std::move(copy), function, *std::move(report), options.reference));
  }
#ifdef KILN_WITH_CUDA
  auto exe = std::make_unique<GpuExecutable>(std::move(copy), function, *std::move(report), std::move(owned_device),
                                             device);
  absl::Status loaded = exe->Load(options);
  if (!loaded.ok()) {
    return absl::Status(loaded.code(), absl::StrCat("Compile @", function_name, " for cuda: ", loaded.message()));
  }
  return std::unique_ptr<Executable>(std::move(exe));
#else
  return absl::InternalError("unreachable: CudaBackendAvailable() is an error without CUDA");
#endif
}

}  // namespace kiln
