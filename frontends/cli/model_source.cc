#include "frontends/cli/model_source.h"

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "frontends/model_config.h"
#include "ir/file_util.h"
#include "ir/module_io.h"
#include "ir/status_macros.h"

namespace kiln::cli {

std::vector<FlagSpec> ModelBuildFlags() {
  return {
      {.name = "precision", .value_name = "P", .help = "fp32 or bf16 (GEMM operands in bf16, f32 accumulation)",
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

namespace {
// An HF config.json is JSON with Llama config keys; a kiln JSON module has "functions".
bool LooksLikeHuggingFaceConfig(absl::string_view content) {
  return absl::StrContains(content, "\"hidden_size\"") && !absl::StrContains(content, "\"format_version\"");
}
}  // namespace

absl::StatusOr<std::unique_ptr<Module>> LoadOrBuildModule(const std::string& model_or_file, const ParsedArgs& args) {
  std::error_code ec;
  bool is_file = std::filesystem::is_regular_file(model_or_file, ec);
  if (is_file) {
    ASSIGN_OR_RETURN(std::string content, ReadFileToString(model_or_file));
    if (!(DetectModuleFormat(content) == ModuleFormat::kProtoJson && LooksLikeHuggingFaceConfig(content))) {
      absl::StatusOr<std::unique_ptr<Module>> module = ReadModule(content);
      if (!module.ok()) return absl::InvalidArgumentError(absl::StrCat(model_or_file, ": ", module.status().message()));
      return module;
    }
  }
  ASSIGN_OR_RETURN(ModelConfig config, ResolveModelConfig(model_or_file));
  ASSIGN_OR_RETURN(LlamaBuildOptions options, LlamaBuildOptionsFromArgs(args));
  return BuildLlamaModule(config, options);
}

}  // namespace kiln::cli
