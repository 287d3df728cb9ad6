#include "frontends/cli/model_source.h"

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "frontends/gpt2.h"
#include "frontends/model_config.h"
#include "ir/file_util.h"
#include "ir/module_io.h"
#include "ir/status_macros.h"

namespace kiln::cli {

std::vector<FlagSpec> ModelBuildFlags() {
  return {
      {.name = "precision", .value_name = "P", .help = "fp32, bf16 (GEMM operands in bf16, f32 accumulation) or fp8 (bf16, and the training step's "
               "linear-layer GEMMs in FP8: E4M3 weights and activations, E5M2 gradients, delayed scaling)",
       .default_value = "bf16"},
      {.name = "batch", .value_name = "B", .help = "batch size", .default_value = "the preset's"},
      {.name = "seq", .value_name = "T", .help = "sequence length", .default_value = "the preset's"},
  };
}

absl::StatusOr<LlamaBuildOptions> LlamaBuildOptionsFromArgs(const ParsedArgs& args) {
  LlamaBuildOptions options;
  ASSIGN_OR_RETURN(options.precision, ParsePrecision(args.Get("precision", "bf16")));
  ASSIGN_OR_RETURN(options.batch, args.GetInt("batch", 0));
  ASSIGN_OR_RETURN(options.seq_len, args.GetInt("seq", 0));
  if (options.batch < 0 || options.seq_len < 0) {
    return absl::InvalidArgumentError("--batch and --seq must be positive");
  }
  return options;
}

std::vector<FlagSpec> TrainingStepFlags() {
  return {
      {.name = "accum", .value_name = "K", .help = "micro-batches per step (gradient accumulation)",
       .default_value = "1"},
      {.name = "weight-decay", .value_name = "X", .help = "AdamW decoupled weight decay", .default_value = "0.1"},
      {.name = "clip", .value_name = "X", .help = "global gradient-norm clip (0: off)", .default_value = "1.0"},
      {.name = "lm-head-chunk-rows", .value_name = "R",
       .help = "compute the LM head and its loss, forward and backward, R tokens (rows of logits) at a time at "
               "most (the chunk-lm-head pass: less memory, a little more time; 0: all at once)",
       .default_value = "0"},
      {.name = "fp8-history", .value_name = "L",
       .help = "with --precision fp8: the amax history each FP8 tensor's scale is the max of, in steps "
               "(passes/fp8_policy.h says why 16)",
       .default_value = "16"},
      {.name = "fp8-margin", .value_name = "M",
       .help = "with --precision fp8: scales 2^M smaller than the history's amax allows (headroom)",
       .default_value = "0"},
      {.name = "fp8-skip", .value_name = "REGEX",
       .help = "with --precision fp8: GEMMs in scopes this matches stay bf16; the LM head by default, whose "
               "error feeds the loss directly and which FP8 recipes keep in higher precision",
       .default_value = "lm_head"},
      {.name = "fp8-grad-format", .value_name = "F",
       .help = "with --precision fp8: the gradients' format, e5m2 (range; the hybrid recipe) or e4m3 (precision)",
       .default_value = "e5m2"},
  };
}

absl::Status TrainingCompileFlagsFromArgs(const ParsedArgs& args, CompileOptions& options) {
  ASSIGN_OR_RETURN(const int64_t rows, args.GetInt("lm-head-chunk-rows", 0));
  if (rows < 0) return absl::InvalidArgumentError(absl::StrCat("--lm-head-chunk-rows must be >= 0, not ", rows));
  options.lm_head_chunk_rows = rows;
  for (const char* flag : {"fp8-history", "fp8-margin", "fp8-skip", "fp8-grad-format"}) {
    if (args.Has(flag) && options.precision != Precision::kFp8) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, " sets the FP8 policy: it needs --precision fp8"));
    }
  }
  ASSIGN_OR_RETURN(options.fp8.history_length, args.GetInt("fp8-history", options.fp8.history_length));
  ASSIGN_OR_RETURN(options.fp8.margin, args.GetInt("fp8-margin", options.fp8.margin));
  options.fp8.skip_regex = args.Get("fp8-skip", options.fp8.skip_regex);
  const std::string grad_format = args.Get("fp8-grad-format", "e5m2");
  if (grad_format != "e5m2" && grad_format != "e4m3") {
    return absl::InvalidArgumentError(absl::StrCat("--fp8-grad-format must be e5m2 or e4m3, not '", grad_format, "'"));
  }
  options.fp8.gradient_format = grad_format == "e4m3" ? DType::kF8E4M3 : DType::kF8E5M2;
  absl::Status valid = Fp8Policy::Create(options.fp8).status();
  if (!valid.ok()) return absl::InvalidArgumentError(absl::StrCat("--fp8-*: ", valid.message()));
  return absl::OkStatus();
}

absl::StatusOr<TrainingStepOptions> TrainingStepOptionsFromArgs(const ParsedArgs& args) {
  TrainingStepOptions options;
  ASSIGN_OR_RETURN(options.accum_steps, args.GetInt("accum", options.accum_steps));
  ASSIGN_OR_RETURN(options.adamw.weight_decay, args.GetDouble("weight-decay", options.adamw.weight_decay));
  ASSIGN_OR_RETURN(options.adamw.clip_norm, args.GetDouble("clip", options.adamw.clip_norm));
  if (options.accum_steps < 1) return absl::InvalidArgumentError("--accum must be >= 1");
  if (!(options.adamw.weight_decay >= 0) || !(options.adamw.clip_norm >= 0)) {
    return absl::InvalidArgumentError("--weight-decay and --clip must be non-negative numbers");
  }
  return options;
}

absl::Status CheckTrainingStepFlagsHaveTraining(const ParsedArgs& args) {
  if (args.Has("training")) return absl::OkStatus();
  for (const FlagSpec& flag : TrainingStepFlags()) {
    if (args.Has(flag.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag.name, " shapes the training step: it needs --training"));
    }
  }
  return absl::OkStatus();
}

namespace {
// An HF config.json is JSON with Llama config keys; a kiln JSON module has "functions".
bool LooksLikeHuggingFaceConfig(absl::string_view content) {
  return absl::StrContains(content, "\"hidden_size\"") && !absl::StrContains(content, "\"format_version\"");
}
}  // namespace

namespace {
// A MODEL_OR_FILE that names an existing module file (not an HF config.json).
absl::StatusOr<bool> IsModuleFile(const std::string& model_or_file, std::string* content) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(model_or_file, ec)) return false;
  ASSIGN_OR_RETURN(*content, ReadFileToString(model_or_file));
  return !(DetectModuleFormat(*content) == ModuleFormat::kProtoJson && LooksLikeHuggingFaceConfig(*content));
}
}  // namespace

absl::StatusOr<LoadedModule> LoadModuleForCompile(const std::string& model_or_file, const ParsedArgs& args) {
  LoadedModule loaded;
  std::string content;
  ASSIGN_OR_RETURN(bool is_file, IsModuleFile(model_or_file, &content));
  if (is_file) {
    absl::StatusOr<std::unique_ptr<Module>> module = ReadModule(content);
    if (!module.ok()) return absl::InvalidArgumentError(absl::StrCat(model_or_file, ": ", module.status().message()));
    loaded.module = *std::move(module);
  } else {
    ASSIGN_OR_RETURN(ModelConfig config, ResolveModelConfig(model_or_file));
    ASSIGN_OR_RETURN(LlamaBuildOptions options, LlamaBuildOptionsFromArgs(args));
    ASSIGN_OR_RETURN(loaded.module, BuildModelModule(config, options));
    loaded.config = config;
  }
  return loaded;
}

absl::StatusOr<std::unique_ptr<Module>> LoadOrBuildModule(const std::string& model_or_file, const ParsedArgs& args) {
  ASSIGN_OR_RETURN(LoadedModule loaded, LoadModuleForCompile(model_or_file, args));
  return std::move(loaded.module);
}

}  // namespace kiln::cli
