// Training checkpoints: one safetensors file holding the parameters (Hugging Face names),
// the AdamW moments ("adamw.m.<name>", "adamw.v.<name>"), the AdamW step count
// ("adamw.t"), and in its metadata the steps done, the model config (as HF config.json
// text) and the run settings a resumed run must share. Written atomically; a failed load
// never touches the file.
#pragma once

#include <map>
#include <string>
#include <vector>

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

// The same file layout for a model that is not a preset (frontends/training_session.h): the
// weights under the names of @forward's parameters, then "adamw.m.<name>", "adamw.v.<name>"
// and "adamw.t"; metadata "kiln.format" = kiln-session-checkpoint-1, "kiln.step", and the
// caller's `metadata` under "kiln.setting.". Written atomically.
struct NamedWeight {
  std::string name;
  TensorType type;
};
absl::Status SaveSessionCheckpoint(const std::string& path, const std::vector<NamedWeight>& weights,
                                   const TrainingState& state, const std::map<std::string, std::string>& metadata = {});
// Reads one back for a model of `weights`: every tensor present with its type, none
// missing, none extra, all finite; errors name the file and the tensor.
struct SessionCheckpoint {
  TrainingState state;
  std::map<std::string, std::string> metadata;
};
absl::StatusOr<SessionCheckpoint> LoadSessionCheckpoint(const std::string& path,
                                                        const std::vector<NamedWeight>& weights);

}  // namespace kiln
