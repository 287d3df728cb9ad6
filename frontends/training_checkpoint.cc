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
constexpr absl::string_view kSessionFormat = "kiln-session-checkpoint-1";

// The tensors of `state` under the weights' names (the parameters, then the moments, then t).
absl::Status SaveState(const std::string& path, const std::vector<NamedWeight>& weights, const TrainingState& s,
                       absl::string_view format, std::map<std::string, std::string> metadata) {
  if (weights.size() != s.params.size() || weights.size() != s.m.size() || weights.size() != s.v.size()) {
    return absl::InternalError("checkpoint: state does not match the model's weights");
  }
  Safetensors st;
  for (size_t i = 0; i < weights.size(); ++i) st.tensors.push_back({weights[i].name, s.params[i]});
  for (size_t i = 0; i < weights.size(); ++i) st.tensors.push_back({absl::StrCat("adamw.m.", weights[i].name), s.m[i]});
  for (size_t i = 0; i < weights.size(); ++i) st.tensors.push_back({absl::StrCat("adamw.v.", weights[i].name), s.v[i]});
  st.tensors.push_back({"adamw.t", s.t});
  for (size_t i = 0; i < s.fp8.size(); ++i) st.tensors.push_back({absl::StrCat("fp8.state.", i), s.fp8[i]});
  st.metadata = std::move(metadata);
  st.metadata[std::string(kFormatKey)] = std::string(format);
  st.metadata[std::string(kStepKey)] = absl::StrCat(s.step);
  return WriteSafetensorsFile(path, st);
}

// Checks the file's format; returns its step count.
absl::StatusOr<int64_t> ReadHeader(const std::string& path, const Safetensors& st, absl::string_view want_format) {
  auto meta = [&](absl::string_view key) -> absl::StatusOr<std::string> {
    auto it = st.metadata.find(std::string(key));
    if (it == st.metadata.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": not a kiln training checkpoint (its metadata has no '", key, "')"));
    }
    return it->second;
  };
  ASSIGN_OR_RETURN(std::string format, meta(kFormatKey));
  if (format != want_format) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": checkpoint format '", format, "' is not the supported '", want_format, "'"));
  }
  ASSIGN_OR_RETURN(std::string step_text, meta(kStepKey));
  int64_t step = 0;
  if (!absl::SimpleAtoi(step_text, &step) || step < 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": bad step count '", step_text, "' in its metadata"));
  }
  return step;
}

// The weights, moments and t of `weights` out of `st`: each present with its type and finite;
// nothing left over.
absl::StatusOr<TrainingState> TakeState(const std::string& path, Safetensors& st,
                                        const std::vector<NamedWeight>& weights) {
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
  TrainingState state;
  for (const NamedWeight& w : weights) {
    ASSIGN_OR_RETURN(HostTensor p, take(w.name, w.type));
    ASSIGN_OR_RETURN(HostTensor m, take(absl::StrCat("adamw.m.", w.name), w.type));
    ASSIGN_OR_RETURN(HostTensor v, take(absl::StrCat("adamw.v.", w.name), w.type));
    state.params.push_back(std::move(p));
    state.m.push_back(std::move(m));
    state.v.push_back(std::move(v));
  }
  ASSIGN_OR_RETURN(state.t, take("adamw.t", {DType::kF32, {}}));
  // The FP8 policy's scaling states, fp8.state.0, 1, ... (the step's layout checks their
  // count and types when the state is set).
  for (int64_t i = 0;; ++i) {
    const std::string name = absl::StrCat("fp8.state.", i);
    auto it = by_name.find(name);
    if (it == by_name.end()) break;
    ASSIGN_OR_RETURN(HostTensor s, take(name, it->second->type()));
    state.fp8.push_back(std::move(s));
  }
  if (!by_name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": unexpected tensor '", by_name.begin()->first, "' for this model"));
  }
  return state;
}

std::vector<NamedWeight> PresetWeights(const ModelConfig& config) {
  std::vector<NamedWeight> weights;
  for (const WeightSpec& spec : ModelWeights(config)) weights.push_back({spec.name, {DType::kF32, spec.shape}});
  return weights;
}

}  // namespace

absl::Status SaveTrainingCheckpoint(const std::string& path, const TrainingCheckpoint& ckpt) {
  std::map<std::string, std::string> metadata;
  metadata[std::string(kConfigKey)] = HuggingFaceConfigJson(ckpt.config);
  for (const auto& [k, v] : ckpt.settings) metadata[absl::StrCat(kSettingPrefix, k)] = v;
  return SaveState(path, PresetWeights(ckpt.config), ckpt.state, kFormat, std::move(metadata));
}

absl::StatusOr<TrainingCheckpoint> LoadTrainingCheckpoint(const std::string& path) {
  ASSIGN_OR_RETURN(Safetensors st, ReadSafetensorsFile(path));
  ASSIGN_OR_RETURN(int64_t step, ReadHeader(path, st, kFormat));
  TrainingCheckpoint ckpt;
  // The config travels as HF config.json text, read by the same reader as config.json files.
  auto config_json = st.metadata.find(std::string(kConfigKey));
  if (config_json == st.metadata.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a kiln training checkpoint (its metadata has no '", kConfigKey, "')"));
  }
  absl::StatusOr<ModelConfig> config = ConfigFromHuggingFaceJson(config_json->second, absl::StrCat(path, " metadata"));
  if (!config.ok()) return config.status();
  ckpt.config = *config;
  for (const auto& [k, v] : st.metadata) {
    if (absl::StartsWith(k, kSettingPrefix)) ckpt.settings[k.substr(kSettingPrefix.size())] = v;
  }
  ASSIGN_OR_RETURN(ckpt.state, TakeState(path, st, PresetWeights(ckpt.config)));
  ckpt.state.step = step;
  return ckpt;
}

absl::Status SaveSessionCheckpoint(const std::string& path, const std::vector<NamedWeight>& weights,
                                   const TrainingState& state, const std::map<std::string, std::string>& metadata) {
  std::map<std::string, std::string> prefixed;
  for (const auto& [k, v] : metadata) prefixed[absl::StrCat(kSettingPrefix, k)] = v;
  return SaveState(path, weights, state, kSessionFormat, std::move(prefixed));
}

absl::StatusOr<SessionCheckpoint> LoadSessionCheckpoint(const std::string& path,
                                                        const std::vector<NamedWeight>& weights) {
  ASSIGN_OR_RETURN(Safetensors st, ReadSafetensorsFile(path));
  ASSIGN_OR_RETURN(int64_t step, ReadHeader(path, st, kSessionFormat));
  SessionCheckpoint ckpt;
  for (const auto& [k, v] : st.metadata) {
    if (absl::StartsWith(k, kSettingPrefix)) ckpt.metadata[k.substr(kSettingPrefix.size())] = v;
  }
  ASSIGN_OR_RETURN(ckpt.state, TakeState(path, st, weights));
  ckpt.state.step = step;
  return ckpt;
}

}  // namespace kiln
