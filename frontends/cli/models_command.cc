// kiln models: the presets and their sizes.
#include <cstdio>

#include "frontends/cli/commands.h"
#include "frontends/model_config.h"
#include "ir/status_macros.h"

namespace kiln::cli {
namespace {

std::string Millions(int64_t n) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1fM", static_cast<double>(n) / 1e6);
  return buf;
}

absl::Status RunModels(const ParsedArgs&) {
  std::printf("%-11s %6s %6s %6s %8s %5s %6s %6s %6s %9s %13s\n", "preset", "vocab", "d", "layers", "heads/kv",
              "hdim", "d_ff", "seq", "batch", "params", "non-embedding");
  for (const std::string& name : PresetNames()) {
    ASSIGN_OR_RETURN(ModelConfig c, PresetConfig(name));
    std::string heads = std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads);
    std::printf("%-11s %6lld %6lld %6lld %8s %5lld %6lld %6lld %6lld %9s %13s\n", name.c_str(),
                static_cast<long long>(c.vocab_size), static_cast<long long>(c.d_model),
                static_cast<long long>(c.n_layers), heads.c_str(), static_cast<long long>(c.head_dim),
                static_cast<long long>(c.d_ff), static_cast<long long>(c.seq_len), static_cast<long long>(c.batch),
                Millions(ParameterCount(c)).c_str(), Millions(NonEmbeddingParameterCount(c)).c_str());
  }
  std::printf("\nnon-embedding excludes the input embedding (no FLOPs) and includes the LM head;\n"
              "it is the count MFU uses: 6*params + 12*layers*seq*d_model FLOPs per token.\n");
  return absl::OkStatus();
}

}  // namespace

Command ModelsCommand() {
  return {{.name = "models",
           .usage = "",
           .summary = "list the model presets with their parameter counts",
           .details = "MODEL arguments elsewhere take a preset name, a Hugging Face config.json,\n"
                      "or a folder holding one."},
          RunModels};
}

}  // namespace kiln::cli
