// Fuzz target for the Hugging Face config.json reader: any input gives a valid config that
// writes and reads back to the same config.json, or an error naming the source.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "frontends/hf_checkpoint.h"
#include "frontends/model_config.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kiln::ModelConfig> config = kiln::ConfigFromHuggingFaceJson(text, "fuzz/config.json");
  if (!config.ok()) {
    if (!absl::StartsWith(config.status().message(), "fuzz/config.json")) {
      kiln::fuzz::Fail("hf_config_fuzzer", "an error that does not name the file", std::string(config.status().message()));
    }
    return 0;
  }
  if (!config->Validate().ok()) kiln::fuzz::Fail("hf_config_fuzzer", "an accepted config is not valid", std::string(text));
  const std::string written = kiln::HuggingFaceConfigJson(*config);
  absl::StatusOr<kiln::ModelConfig> again = kiln::ConfigFromHuggingFaceJson(written, "written");
  if (!again.ok() || kiln::HuggingFaceConfigJson(*again) != written) {
    kiln::fuzz::Fail("hf_config_fuzzer", "config.json does not round-trip", written);
  }
  return 0;
}
