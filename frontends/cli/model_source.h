// What a MODEL_OR_FILE argument names: a module file kiln wrote (.kir text, .pb, .json),
// or a model (a preset, an HF config.json, or a folder holding one) to build.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "frontends/cli/args.h"
#include "frontends/llama.h"
#include "ir/graph.h"

namespace kiln::cli {

// The flags that shape a built model: --precision, --batch, --seq.
std::vector<FlagSpec> ModelBuildFlags();
absl::StatusOr<LlamaBuildOptions> LlamaBuildOptionsFromArgs(const ParsedArgs& args);

// Loads a module file, or builds the named model with the build flags.
absl::StatusOr<std::unique_ptr<Module>> LoadOrBuildModule(const std::string& model_or_file,
                                                          const ParsedArgs& args);

}  // namespace kiln::cli
