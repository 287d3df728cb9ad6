// What a MODEL_OR_FILE argument names: a module file kiln wrote (.kir text, .pb, .json),
// or a model (a preset, an HF config.json, or a folder holding one) to build.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "frontends/cli/args.h"
#include "frontends/llama.h"
#include "frontends/model_config.h"
#include "passes/compile_options.h"
#include "passes/training_step.h"
#include "ir/graph.h"

namespace kiln::cli {

// The flags that shape a built model: --precision, --batch, --seq.
std::vector<FlagSpec> ModelBuildFlags();
absl::StatusOr<LlamaBuildOptions> LlamaBuildOptionsFromArgs(const ParsedArgs& args);

// Loads a module file, or builds the named model with the build flags.
absl::StatusOr<std::unique_ptr<Module>> LoadOrBuildModule(const std::string& model_or_file,
                                                          const ParsedArgs& args);

// The CompileOptions that `compile` and `check` share, from --precision, --dump-dir,
// --dump-after and --disable-pass (defined in compile_command.cc).
absl::StatusOr<CompileOptions> CompileOptionsFromArgs(const ParsedArgs& args);

// The flags of `kiln train` that change the training step's graph (--accum, --weight-decay,
// --clip; the model's shape comes from ModelBuildFlags). `compile --training` and `check
// --training` take them too, so that they compile the step `train` runs.
std::vector<FlagSpec> TrainingStepFlags();
absl::StatusOr<TrainingStepOptions> TrainingStepOptionsFromArgs(const ParsedArgs& args);
// --lm-head-chunk-rows and --fp8-*, of those flags, are compile options (passes/chunk_lm_head.h,
// passes/fp8_policy.h).
absl::Status TrainingCompileFlagsFromArgs(const ParsedArgs& args, CompileOptions& options);
// For compile and check: a step flag without --training would change nothing, so it is an
// error rather than silently ignored.
absl::Status CheckTrainingStepFlagsHaveTraining(const ParsedArgs& args);

// A module plus what is known about it, for commands that compile or check it.
struct LoadedModule {
  std::unique_ptr<Module> module;
  std::optional<ModelConfig> config;          // when built from a model, not read from a file
  std::optional<TrainingStepLayout> training;  // when @train_step was added
};

// As LoadOrBuildModule, keeping the model's config. `training` is left for the caller to
// fill in: the step is built by passes/training_compile.h, as one compile with the pipelines.
absl::StatusOr<LoadedModule> LoadModuleForCompile(const std::string& model_or_file, const ParsedArgs& args);

}  // namespace kiln::cli
