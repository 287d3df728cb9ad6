// Builds the llama-tiny preset through kiln's C++ API and prints its IR.
#include <iostream>

#include "frontends/llama.h"
#include "ir/text_format.h"

int main() {
  absl::StatusOr<kiln::ModelConfig> config = kiln::PresetConfig("llama-tiny");
  if (!config.ok()) {
    std::cerr << config.status() << "\n";
    return 1;
  }
  kiln::LlamaBuildOptions options{.precision = kiln::Precision::kBf16};
  absl::StatusOr<std::unique_ptr<kiln::Module>> module = kiln::BuildLlamaModule(*config, options);
  if (!module.ok()) {
    std::cerr << module.status() << "\n";
    return 1;
  }
  std::cout << kiln::PrintModule(**module);
}
