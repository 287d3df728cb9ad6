// Training checkpoints: one safetensors file holding the parameters (Hugging Face names),
// the AdamW moments ("adamw.m.<name>", "adamw.v.<name>"), the AdamW step count
// ("adamw.t"), and in its metadata the steps done, the model config (as HF config.json
// text) and the run settings a resumed run must share. Written atomically; a failed load
// never touches the file.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "frontends/model_config.h"
#include "frontends/trainer.h"

namespace kiln {

struct TrainingCheckpoint {
  ModelConfig config;
  TrainingState state;
  // Run settings (batch, seq, accum, precision, seed, ...) as text, checked on resume.
  std::map<std::string, std::string> settings;
};

absl::Status SaveTrainingCheckpoint(const std::string& path, const TrainingCheckpoint& checkpoint);
absl::StatusOr<TrainingCheckpoint> LoadTrainingCheckpoint(const std::string& path);

}  // namespace kiln
