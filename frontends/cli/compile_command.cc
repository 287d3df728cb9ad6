// kiln compile: run the compiler's pipeline on a model (or a module file) and report.
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "frontends/cli/commands.h"
#include "frontends/cli/model_source.h"
#include "ir/file_util.h"
#include "ir/status_macros.h"
#include "ir/text_format.h"
#include "passes/default_pipeline.h"
#include "passes/elide_grad_zeroing.h"
#include "passes/fusion.h"
#include "passes/pass_registry.h"
#include "passes/training_compile.h"
#include "frontends/llama_inference.h"
#include "frontends/model_config.h"
#ifdef KILN_WITH_CUDA
#include "codegen/capabilities.h"
#include "codegen/compile_function.h"
#include "codegen/compile_program.h"
#include "codegen/kernel_listing.h"
#include "runtime/cuda/device.h"
#endif

namespace kiln::cli {

// The CompileOptions the compile and check commands share, from their flags.
absl::StatusOr<CompileOptions> CompileOptionsFromArgs(const ParsedArgs& args) {
  CompileOptions options;
  ASSIGN_OR_RETURN(options.precision, ParsePrecision(args.Get("precision", "bf16")));
  if (args.Has("target")) {
    ASSIGN_OR_RETURN(options.target, TargetForArch(args.Get("target")));
  }
#ifdef KILN_WITH_CUDA
  options.capabilities = &CodegenCapabilities();
#endif
  options.dump_dir = args.Get("dump-dir");
  options.dump_regex = args.Get("dump-after", ".*");
  absl::Status regex = CheckDumpRegex(options.dump_regex);
  if (!regex.ok()) return absl::InvalidArgumentError(absl::StrCat("--dump-after: ", regex.message()));
  if (args.Has("dump-after") && !args.Has("dump-dir")) {
    return absl::InvalidArgumentError("--dump-after selects which dumps to write: it needs --dump-dir (where)");
  }
  if (args.Has("disable-pass")) {
    options.disabled_passes = absl::StrSplit(args.Get("disable-pass"), ',', absl::SkipEmpty());
  }
  if (args.Has("enable-pass")) {
    options.enabled_passes = absl::StrSplit(args.Get("enable-pass"), ',', absl::SkipEmpty());
  }
  RETURN_IF_ERROR(TrainingCompileFlagsFromArgs(args, options));
  return options;
}

namespace {

// Code generation for --target (or the device's architecture when a GPU is usable): every
// kernel lowered and compiled with NVRTC, through the kernel cache. With `launch_lists` (an
// inference function, which kiln generate runs as one program) also each function's launch
// list: the kernels a call runs once the memory plan has left out the copies it made no-ops
// (a KV pool written in place), and its cuBLASLt GEMMs.
absl::Status GenerateKernels(const Module& module, const ParsedArgs& args, bool launch_lists) {
#ifdef KILN_WITH_CUDA
  CodegenOptions codegen;
  if (args.Has("target")) {
    ASSIGN_OR_RETURN(codegen.target, TargetForArch(args.Get("target")));
  } else {
    absl::Status usable = CudaDevice::Available();
    if (!usable.ok()) {
      if (args.Has("kernels-dir")) {
        return absl::InvalidArgumentError(absl::StrCat("--kernels-dir: no kernels to list without --target or a usable GPU (",
                                                       usable.message(), ")"));
      }
      std::printf("no kernels generated: no --target and no usable GPU (%s)\n", std::string(usable.message()).c_str());
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> device, CudaDevice::Open(0));
    codegen.target = device->target();
  }
  const NvrtcOptions nvrtc{.arch = codegen.target.arch};
  std::printf("target %s\n", codegen.target.ToString().c_str());
  ASSIGN_OR_RETURN(KernelCache cache, KernelCache::Open());
  ASSIGN_OR_RETURN(KernelCompileReport kernels, CompileModuleKernels(module, nvrtc, &cache, 0, codegen));
  int64_t gemms = 0;
  for (const NodeKernels& n : kernels.nodes) gemms += n.lowered.kind == LoweringKind::kGemm;
  std::printf("kernels for %s: %lld listed, %lld distinct (%lld from the cache in %s), %lld cuBLASLt GEMMs; "
              "NVRTC %.1fs over threads, %.1fs wall\n",
              nvrtc.arch.c_str(), static_cast<long long>(kernels.num_kernels), static_cast<long long>(kernels.num_distinct),
              static_cast<long long>(kernels.cache_hits), cache.dir().c_str(), static_cast<long long>(gemms),
              kernels.nvrtc_seconds, kernels.wall_seconds);
  if (args.Has("kernels-dir")) {
    ASSIGN_OR_RETURN(const std::string table, WriteKernelListing(kernels, args.Get("kernels-dir"), codegen.target));
    std::printf("%skernel sources, launch geometry and ptxas's registers in %s (kernels.txt: the table above)\n",
                table.c_str(), args.Get("kernels-dir").c_str());
  }
  if (launch_lists) {
    int64_t launches = 0;
    for (const auto& f : module.functions()) {
      ASSIGN_OR_RETURN(const CompiledProgram program, CompileProgram(*f, ProgramOptions{.target = codegen.target}));
      std::printf("@%s a call: %lld kernel launches and %lld cuBLASLt GEMMs\n", f->name().c_str(),
                  static_cast<long long>(program.num_launches), static_cast<long long>(program.num_gemms));
      // kiln generate binds the parameters (the weights, the KV pools) once for every
      // function: what a function's own executable holds is the rest.
      std::printf("@%s memory plan: %s; its own, less the parameters: %.1f MiB\n", f->name().c_str(),
                  program.plan.Summary().c_str(),
                  static_cast<double>(program.plan.arena_bytes - program.plan.parameter_bytes) / (1 << 20));
      launches += program.num_launches;
    }
    std::printf("(the memory plan leaves out %lld of the %lld kernels listed: copies into a result that takes its "
                "operand's buffer, as a KV pool written in place)\n",
                static_cast<long long>(kernels.num_kernels - launches), static_cast<long long>(kernels.num_kernels));
  }
  return absl::OkStatus();
#else
  if (args.Has("target")) {
    RETURN_IF_ERROR(TargetForArch(args.Get("target")).status());
    return absl::UnimplementedError("--target: this kiln was built without the CUDA toolkit");
  }
  if (args.Has("kernels-dir")) {
    return absl::UnimplementedError("--kernels-dir: this kiln was built without the CUDA toolkit");
  }
  return absl::OkStatus();
#endif
}

// --inference PHASE: the @prefill or @decode function `kiln generate` runs (frontends/
// llama_inference.h), for a pool of whole contexts of every sequence, built from a preset or
// an HF config.
absl::StatusOr<LoadedModule> LoadInferenceModule(const ParsedArgs& args, Precision precision) {
  const std::string phase_name = args.Get("inference");
  if (phase_name != "decode" && phase_name != "prefill" && phase_name != "fresh-prefill") {
    return absl::InvalidArgumentError(
        absl::StrCat("--inference ", phase_name, ": expected decode, prefill or fresh-prefill"));
  }
  if (precision == Precision::kFp8) {
    return absl::InvalidArgumentError("--inference: inference runs fp32 or bf16 (fp8 is a training policy)");
  }
  if (args.Has("training")) return absl::InvalidArgumentError("give --inference or --training, not both");
  const InferencePhase phase = phase_name == "decode"    ? InferencePhase::kDecode
                               : phase_name == "prefill" ? InferencePhase::kPrefill
                                                         : InferencePhase::kFreshPrefill;
  if (phase == InferencePhase::kDecode && args.Has("batch")) {
    return absl::InvalidArgumentError("--inference decode: its sequences are --size (--batch is a prefill's prompts)");
  }
  LoadedModule loaded;
  ASSIGN_OR_RETURN(loaded.config, ResolveModelConfig(args.positionals()[0]));
  const ModelConfig& config = *loaded.config;
  ASSIGN_OR_RETURN(const int64_t size, args.GetInt("size", phase == InferencePhase::kDecode ? 1 : 512));
  ASSIGN_OR_RETURN(const int64_t prompts, args.GetInt("batch", 1));
  const int64_t default_context = config.max_positions > 0 ? config.max_positions : config.seq_len;
  ASSIGN_OR_RETURN(const int64_t context, args.GetInt("context", default_context));
  ASSIGN_OR_RETURN(const int64_t block_size, args.GetInt("block-size", 16));
  if (size < 1 || prompts < 1 || context < 1 || block_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--size (", size, "), --batch (", prompts, "), --context (", context,
                                                   ") and --block-size (", block_size, ") must be >= 1"));
  }
  const int64_t per_sequence = (context + block_size - 1) / block_size;
  const InferenceShape shape = phase == InferencePhase::kDecode ? InferenceShape{phase, size, 1}
                                                                : InferenceShape{phase, prompts, size};
  const PagedKvLayout layout{.num_blocks = shape.batch * per_sequence, .block_size = block_size,
                             .max_blocks_per_sequence = per_sequence};
  ASSIGN_OR_RETURN(loaded.module, BuildLlamaInferenceModule(config, layout, precision, shape));
  return loaded;
}

absl::Status RunCompile(const ParsedArgs& args) {
  if (args.Has("output")) RETURN_IF_ERROR(CheckOutputPath(args.Get("output"), "-o"));
  ASSIGN_OR_RETURN(CompileOptions options, CompileOptionsFromArgs(args));
  const bool inference = args.Has("inference");
  for (const char* flag : {"size", "context", "block-size"}) {
    if (args.Has(flag) && !inference) return absl::InvalidArgumentError(absl::StrCat("--", flag, " needs --inference"));
  }
  ASSIGN_OR_RETURN(LoadedModule loaded, inference ? LoadInferenceModule(args, options.precision)
                                                  : LoadModuleForCompile(args.positionals()[0], args));
  RETURN_IF_ERROR(CheckTrainingStepFlagsHaveTraining(args));
  int64_t nodes_before = 0;
  std::vector<PipelineReport> reports;
  std::vector<FusionDecision> fusion_decisions;  // fuse-loops' own values, for --report
  auto keep_decisions = [&](const Pipeline& pipeline) {
    if (const auto* fusion = dynamic_cast<const FusionPass*>(pipeline.FindPass(FusionPass::kName))) {
      fusion_decisions = fusion->decisions();
    }
  };
  if (args.Has("training")) {
    ASSIGN_OR_RETURN(TrainingStepOptions step_options, TrainingStepOptionsFromArgs(args));
    ASSIGN_OR_RETURN(TrainingCompile compile, TrainingCompile::Create(step_options, options));
    RETURN_IF_ERROR(compile.BuildStep(*loaded.module));
    nodes_before = CountNodes(*loaded.module);
    RETURN_IF_ERROR(compile.RunMainPipeline(*loaded.module));
    reports = {compile.forward_report(), compile.main_report()};
    keep_decisions(compile.main_pipeline());
  } else if (inference) {
    nodes_before = CountNodes(*loaded.module);
    ASSIGN_OR_RETURN(PipelineReport report, CompileInferenceModule(*loaded.module, options));
    reports = {std::move(report)};
  } else {
    nodes_before = CountNodes(*loaded.module);
    const Pipeline pipeline = BuildDefaultPipeline(options);
    ASSIGN_OR_RETURN(PipelineReport report, pipeline.Run(*loaded.module, options));
    reports = {std::move(report)};
    keep_decisions(pipeline);
  }
  double total_ms = 0;
  for (const PipelineReport& report : reports) total_ms += report.total_ms;
  if (args.Has("report")) {
    for (const PipelineReport& report : reports) std::printf("%s\n", report.ToString().c_str());
    // Every fusion decision, one line each (kiln train --report prints the counts only).
    std::printf("fusion:\n");
    for (const auto& f : loaded.module->functions()) {
      std::printf("%s", FormatFusionReport(*f, fusion_decisions, true).c_str());
    }
    // Sums that start from a zeroed buffer (passes/elide_grad_zeroing.h): 0 for a training step.
    std::printf("zero-initialised accumulators: %lld\n",
                static_cast<long long>(CountZeroInitialisedAccumulators(*loaded.module)));
    std::printf("\n");
  }
  std::string functions;
  for (const auto& f : loaded.module->functions()) absl::StrAppend(&functions, functions.empty() ? "@" : ", @", f->name());
  std::printf("compiled %s (%s): %lld -> %lld nodes in %.1f ms\n", loaded.module->name().c_str(), functions.c_str(),
              static_cast<long long>(nodes_before), static_cast<long long>(CountNodes(*loaded.module)), total_ms);
  if (!options.dump_dir.empty()) std::printf("IR dumps in %s\n", options.dump_dir.c_str());
  RETURN_IF_ERROR(GenerateKernels(*loaded.module, args, /*launch_lists=*/inference));
  if (args.Has("output")) RETURN_IF_ERROR(WriteFileAtomically(args.Get("output"), PrintModule(*loaded.module)));
  return absl::OkStatus();
}

}  // namespace

Command CompileCommand() {
  const CompileOptions defaults;
  CommandSpec spec{
      .name = "compile",
      .usage = "MODEL_OR_FILE [options]",
      .summary = "run the compiler's pass pipeline and report what each pass did",
      .details = absl::StrCat(
          "Runs the default pipeline (", BuildDefaultPipeline(defaults).Describe(), ")\n",
          "on @forward. With --training, as kiln train does: the forward pipeline (",
          BuildForwardPipeline(defaults).Describe(), ")\n",
          "on @forward, then the training step is built from it (--accum, --weight-decay, --clip), then\n"
          "the default pipeline runs on both. With --inference decode (prefill, fresh-prefill), the\n"
          "function kiln generate runs instead: --size sequences of one token (or --batch prompts of\n"
          "--size tokens) over a paged KV pool of whole --context contexts, through the inference\n"
          "pipeline (merge-sibling-gemms off). The verifier runs after every pass that changed something;\n"
          "dumps are numbered in the order the passes ran. Then every kernel is generated and compiled\n"
          "with NVRTC for --target (no GPU needed), or for the GPU's architecture.\n\n"
          "passes (names for --disable-pass and --dump-after):\n",
          FormatPassTable()),
      .min_positionals = 1,
      .max_positionals = 1,
      .flags = {{.name = "training", .help = "also build and compile the training step"},
                {.name = "dump-dir", .value_name = "DIR", .help = "write the IR before and after passes here"},
                {.name = "dump-after", .value_name = "REGEX", .help = "dump after passes whose name matches",
                 .default_value = ".*"},
                {.name = "disable-pass", .value_name = "NAME,...", .help = "skip these passes"},
                {.name = "enable-pass", .value_name = "NAME,...",
                 .help = "run these passes, which are off by default (marked in the list above)"},
                {.name = "target", .value_name = "ARCH",
                 .help = "generate and NVRTC-compile every kernel for ARCH: sm_90a, sm_90, sm_89, sm_86 or sm_80 "
                         "(nominal SM count and shared memory of the family's data-centre part)",
                 .default_value = "the GPU's, if any"},
                {.name = "report", .help = "print per pass: time, changed or not, nodes before/after"},
                {.name = "kernels-dir", .value_name = "DIR",
                 .help = "write every generated kernel's CUDA source here, headed by its nodes, launch geometry and "
                         "ptxas's registers, frame and shared memory; kernels.txt lists them"},
                {.name = "inference", .value_name = "PHASE",
                 .help = "compile kiln generate's decode, prefill or fresh-prefill function instead of @forward "
                         "(fresh-prefill: prompts with nothing cached, the training forward's attention; --batch "
                         "prompts a prefill call, default 1)"},
                {.name = "size", .value_name = "N",
                 .help = "with --inference: sequences a decode call takes, or tokens a prompt of the prefill",
                 .default_value = "1 for decode, 512 for prefill"},
                {.name = "context", .value_name = "N", .help = "with --inference: tokens per sequence at most",
                 .default_value = "the model's"},
                {.name = "block-size", .value_name = "N", .help = "with --inference: tokens per KV block",
                 .default_value = "16"},
                {.name = "output", .value_name = "FILE", .help = "write the compiled IR (text)", .short_name = 'o'}},
  };
  for (FlagSpec f : ModelBuildFlags()) spec.flags.push_back(std::move(f));
  for (FlagSpec f : TrainingStepFlags()) spec.flags.push_back(std::move(f));
  return {std::move(spec), RunCompile};
}

}  // namespace kiln::cli
