#include "frontends/training_checkpoint.h"

#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "frontends/hf_checkpoint.h"
#include "frontends/gpt2.h"
#include "ir/file_util.h"
#include "ir/status_macros.h"
#include "runtime/safetensors.h"

namespace kiln {
namespace {

constexpr absl::string_view kFormatKey = "kiln.format";
constexpr absl::string_view kFormat = "kiln-training-checkpoint-1";
constexpr absl::string_view kStepKey = "kiln.step";
constexpr absl::string_view kConfigKey = "kiln.config";
constexpr absl::string_view kSettingPrefix = "kiln.setting.";

}  // namespace

absl::Status SaveTrainingCheckpoint(const std::string& path, const TrainingCheckpoint& ckpt) {
  std::vector<WeightSpec> specs = ModelWeights(ckpt.config);
  const TrainingState& s = ckpt.state;
  if (specs.size() != s.params.size() || specs.size() != s.m.size() || specs.size() != s.v.size()) {
    return absl::InternalError("checkpoint: state does not match the model's weights");
  }
  Safetensors st;
  for (size_t i = 0; i < specs.size(); ++i) st.tensors.push_back({specs[i].name, s.params[i]});
  for (size_t i = 0; i < specs.size(); ++i) st.tensors.push_back({absl::StrCat("adamw.m.", specs[i].name), s.m[i]});
  for (size_t i = 0; i < specs.size(); ++i) st.tensors.push_back({absl::StrCat("adamw.v.", specs[i].name), s.v[i]});
  st.tensors.push_back({"adamw.t", s.t});
  st.metadata[std::string(kFormatKey)] = std::string(kFormat);
  st.metadata[std::string(kStepKey)] = absl::StrCat(s.step);
  st.metadata[std::string(kConfigKey)] = HuggingFaceConfigJson(ckpt.config);
  for (const auto& [k, v] : ckpt.settings) st.metadata[absl::StrCat(kSettingPrefix, k)] = v;
  return WriteSafetensorsFile(path, st);
}

absl::StatusOr<TrainingCheckpoint> LoadTrainingCheckpoint(const std::string& path) {
  ASSIGN_OR_RETURN(Safetensors st, ReadSafetensorsFile(path));
  auto meta = [&](absl::string_view key) -> absl::StatusOr<std::string> {
    auto it = st.metadata.find(std::string(key));
    if (it == st.metadata.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": not a kiln training checkpoint (its metadata has no '", key, "')"));
    }
    return it->second;
  };
  ASSIGN_OR_RETURN(std::string format, meta(kFormatKey));
  if (format != kFormat) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": checkpoint format '", format, "' is not the supported '", kFormat, "'"));
  }
  TrainingCheckpoint ckpt;
  ASSIGN_OR_RETURN(std::string step, meta(kStepKey));
  if (!absl::SimpleAtoi(step, &ckpt.state.step) || ckpt.state.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": bad step count '", step, "' in its metadata"));
  }
  // The config travels as HF config.json text, read by the same reader as config.json files.
  ASSIGN_OR_RETURN(std::string config_json, meta(kConfigKey));
  absl::StatusOr<ModelConfig> config = ConfigFromHuggingFaceJson(config_json, absl::StrCat(path, " metadata"));
  if (!config.ok()) return config.status();
  ckpt.config = *config;
  for (const auto& [k, v] : st.metadata) {
    if (absl::StartsWith(k, kSettingPrefix)) ckpt.settings[k.substr(kSettingPrefix.size())] = v;
  }

  absl::flat_hash_map<std::string, HostTensor*> by_name;
  for (NamedTensor& t : st.tensors) by_name[t.name] = &t.tensor;
  auto take = [&](const std::string& name, const TensorType& want) -> absl::StatusOr<HostTensor> {
    auto it = by_name.find(name);
    if (it == by_name.end()) return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "' is missing"));
    if (it->second->type() != want) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "' is ", it->second->type().ToString(),
                                                     ", expected ", want.ToString()));
    }
    HostTensor t = std::move(*it->second);
    by_name.erase(it);
    // A run that diverged may have saved NaN or Inf; resuming from it would fail later with
    // a loss that blames the learning rate. Say which tensor holds it.
    for (int64_t i = 0; i < t.num_elements(); ++i) {
      if (!std::isfinite(t[i])) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "' holds ", t[i], " at element ", i,
                                                       " (of ", t.num_elements(),
                                                       "): the run that saved it had diverged"));
      }
    }
    return t;
  };
  for (const WeightSpec& spec : ModelWeights(ckpt.config)) {
    TensorType type{DType::kF32, spec.shape};
    ASSIGN_OR_RETURN(HostTensor p, take(spec.name, type));
    ASSIGN_OR_RETURN(HostTensor m, take(absl::StrCat("adamw.m.", spec.name), type));
    ASSIGN_OR_RETURN(HostTensor v, take(absl::StrCat("adamw.v.", spec.name), type));
    ckpt.state.params.push_back(std::move(p));
    ckpt.state.m.push_back(std::move(m));
    ckpt.state.v.push_back(std::move(v));
  }
  ASSIGN_OR_RETURN(ckpt.state.t, take("adamw.t", {DType::kF32, {}}));
  if (!by_name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": unexpected tensor '", by_name.begin()->first, "' for this model"));
  }
  return ckpt;
}

}  // namespace kiln
