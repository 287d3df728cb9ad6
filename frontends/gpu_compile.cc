#include "frontends/gpu_compile.h"

#ifdef KILN_WITH_CUDA

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/kernel_cache.h"
#include "ir/status_macros.h"

namespace kiln {

bool ProgrammaticDependentLaunchByDefault() {
  const char* env = std::getenv("KILN_PDL");
  return env == nullptr || std::string(env) != "0";
}

bool ReadsBeforeWaitByDefault() {
  const char* env = std::getenv("KILN_PDL");
  return env == nullptr || (std::string(env) != "0" && std::string(env) != "late");
}

absl::StatusOr<std::unique_ptr<CudaExecutable>> CompileForGpu(const Function& f, CudaDevice& device,
                                                              const CudaExecutableOptions& run,
                                                              const GpuCompileOptions& compile) {
  CodegenOptions::PagedAttentionGeometry paged_attention = compile.paged_attention;
  if (const char* env = std::getenv("KILN_PAGED_ATTENTION"); env != nullptr && *env != '\0') {
    absl::StatusOr<CodegenOptions::PagedAttentionGeometry> parsed = ParsePagedAttentionGeometry(env);
    if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat("$KILN_PAGED_ATTENTION: ", parsed.status().message()));
    paged_attention = *parsed;
    // Not a geometry: what the caller knows of its function stays.
    paged_attention.complete_blocks_step_invariant = compile.paged_attention.complete_blocks_step_invariant;
  }
  // SmallMGemm geometries for given shapes, for trying one on a projection in the decode graph.
  std::vector<CodegenOptions::GemvShapeGeometry> gemv_shapes;
  if (const char* env = std::getenv("KILN_GEMV_GEOMETRY"); env != nullptr && *env != '\0') {
    absl::StatusOr<std::vector<CodegenOptions::GemvShapeGeometry>> parsed = ParseGemvShapeGeometries(env);
    if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat("$KILN_GEMV_GEOMETRY: ", parsed.status().message()));
    gemv_shapes = *std::move(parsed);
  }
  ASSIGN_OR_RETURN(CompiledProgram program,
                   CompileProgram(f, ProgramOptions{.target = device.target(),
                                                    .cache_dir = compile.cache_dir,
                                                    .compile_threads = compile.compile_threads,
                                                    .programmatic_dependent_launch =
                                                        compile.programmatic_dependent_launch,
                                                    .reads_before_wait = compile.reads_before_wait,
                                                    .paged_attention = paged_attention,
                                                    .gemv_shape_geometries = std::move(gemv_shapes)}));
  CudaExecutableOptions options = run;
  // Autotuning's choices live beside the kernels, so the next run on this GPU takes them.
  if (!options.load_tuning && !options.save_tuning) {
    if (absl::StatusOr<KernelCache> cache = KernelCache::Open(compile.cache_dir); cache.ok()) {
      options.load_tuning = [cache = *cache](const std::string& key) {
        return cache.Lookup(KernelCache::Key(key, "", "", ""));
      };
      // A cache that cannot be written costs the next run a retune, nothing else.
      options.save_tuning = [cache = *cache](const std::string& key, const std::string& value) {
        cache.Store(KernelCache::Key(key, "", "", ""), value).IgnoreError();
      };
    }
  }
  return CudaExecutable::Load(std::move(program), device, options);
}

absl::StatusOr<std::vector<HostTensor>> EvaluateOnGpu(const Function& f, absl::Span<const HostTensor> args,
                                                      CudaDevice& device, const CudaExecutableOptions& run) {
  if (args.size() != f.parameters().size()) {
    return absl::InvalidArgumentError(absl::StrCat("@", f.name(), " takes ", f.parameters().size(), " arguments, got ",
                                                   args.size()));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CudaExecutable> exe, CompileForGpu(f, device, run));
  for (size_t i = 0; i < args.size(); ++i) RETURN_IF_ERROR(exe->SetInput(static_cast<int64_t>(i), args[i]));
  RETURN_IF_ERROR(exe->Run());
  std::vector<HostTensor> outputs;
  for (size_t i = 0; i < f.outputs().size(); ++i) {
    ASSIGN_OR_RETURN(HostTensor out, exe->Output(static_cast<int>(i)));
    outputs.push_back(std::move(out));
  }
  return outputs;
}

}  // namespace kiln

#endif  // KILN_WITH_CUDA
