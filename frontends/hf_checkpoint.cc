#include "frontends/hf_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "frontends/gpt2.h"
#include "ir/file_util.h"
#include "ir/status_macros.h"
#include "runtime/safetensors.h"

namespace kiln {
namespace {

constexpr absl::string_view kConfigFile = "config.json";
constexpr absl::string_view kWeightsFile = "model.safetensors";
constexpr absl::string_view kShardIndexFile = "model.safetensors.index.json";

std::string PathIn(const std::string& folder, absl::string_view file) {
  return (std::filesystem::path(folder) / std::string(file)).string();
}

bool IsFile(const std::string& path) {
  std::error_code ignored;  // a path that cannot be inspected counts as absent
  return std::filesystem::is_regular_file(path, ignored);
}

// Buffers transformers registers on the model that are not weights; older checkpoints
// saved them alongside the weights.
// GPT-2's original upload also holds each block's causal mask (h.N.attn.bias, and
// attn.masked_bias in some), buffers of the old GPT2Attention.
bool IsNonWeightBuffer(absl::string_view name) {
  return absl::EndsWith(name, "rotary_emb.inv_freq") || absl::EndsWith(name, ".attn.bias") ||
         absl::EndsWith(name, ".attn.masked_bias");
}

// GPT-2 files hold vocab_size rows of wte, kiln padded_vocab_size(): the HF shape of a weight.
std::vector<int64_t> FileShape(const ModelConfig& config, const WeightSpec& spec) {
  std::vector<int64_t> shape = spec.shape;
  if (spec.name == "transformer.wte.weight") shape[0] = config.vocab_size;
  return shape;
}


struct FoundTensor {
  HostTensor tensor;
  std::string file;  // for errors
};
using FoundTensors = std::map<std::string, FoundTensor>;

// The original GPT-2 upload names its weights without "transformer." (wte.weight,
// h.0.ln_1.weight, ...); save_pretrained writes them with it. Either is found.
FoundTensors::iterator FindWeight(FoundTensors& found, const ModelConfig& config, const std::string& name) {
  auto it = found.find(name);
  constexpr absl::string_view kPrefix = "transformer.";
  if (it == found.end() && config.family == ModelFamily::kGpt2 && absl::StartsWith(name, kPrefix)) {
    it = found.find(name.substr(kPrefix.size()));
  }
  return it;
}

absl::Status AddTensors(Safetensors st, const std::string& file, FoundTensors& found) {
  for (NamedTensor& t : st.tensors) {
    auto [it, inserted] = found.try_emplace(t.name, FoundTensor{std::move(t.tensor), file});
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "' is in both ", it->second.file, " and ", file));
    }
  }
  return absl::OkStatus();
}

// model.safetensors.index.json: {"metadata": {...}, "weight_map": {tensor name: shard file}}.
// Shards are plain file names in the folder; a path elsewhere is refused, the index being
// as untrusted as the weights.
absl::StatusOr<FoundTensors> ReadShards(const std::string& folder, const std::string& index_path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path));
  const nlohmann::json index = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
      !index["weight_map"].is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": expected a JSON object with a \"weight_map\" object"));
  }
  std::map<std::string, std::string> shard_of;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    const bool plain_name = shard.is_string() && !shard.get<std::string>().empty() &&
                            shard.get<std::string>().find('/') == std::string::npos &&
                            shard.get<std::string>() != "." && shard.get<std::string>() != "..";
    if (!plain_name) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map entry for '", name, "' is ",
                                                     shard.dump(), "; expected a file name in the same folder"));
    }
    shard_of[name] = shard.get<std::string>();
  }

  FoundTensors found;
  std::set<std::string> shards_read;
  for (const auto& [name, shard] : shard_of) {
    if (!shards_read.insert(shard).second) continue;
    const std::string path = PathIn(folder, shard);
    ASSIGN_OR_RETURN(Safetensors st, ReadSafetensorsFile(path));
    for (const NamedTensor& t : st.tensors) {
      auto listed = shard_of.find(t.name);
      if (listed == shard_of.end() || listed->second != shard) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": holds tensor '", t.name, "', which ", index_path,
            listed == shard_of.end() ? std::string(" does not list") : absl::StrCat(" places in ", listed->second)));
      }
    }
    RETURN_IF_ERROR(AddTensors(std::move(st), path, found));
  }
  for (const auto& [name, shard] : shard_of) {
    if (!found.contains(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": lists tensor '", name, "' in ", shard, ", which does not hold it"));
    }
  }
  return found;
}

absl::StatusOr<FoundTensors> ReadWeightFiles(const std::string& folder) {
  const std::string single = PathIn(folder, kWeightsFile);
  const std::string index = PathIn(folder, kShardIndexFile);
  if (IsFile(single)) {  // transformers prefers the single file too
    ASSIGN_OR_RETURN(Safetensors st, ReadSafetensorsFile(single));
    FoundTensors found;
    RETURN_IF_ERROR(AddTensors(std::move(st), single, found));
    return found;
  }
  if (IsFile(index)) return ReadShards(folder, index);
  return absl::NotFoundError(
      absl::StrCat("cannot load Hugging Face weights: no ", single, " (nor a sharded ", index, ")"));
}

absl::string_view TorchDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
    default: return "float32";
  }
}

}  // namespace

absl::StatusOr<HuggingFaceModel> LoadHuggingFaceModel(const std::string& folder) {
  const std::string config_path = PathIn(folder, kConfigFile);
  if (!IsFile(config_path)) {
    return absl::NotFoundError(absl::StrCat("cannot load Hugging Face model: no ", config_path));
  }
  HuggingFaceModel model;
  ASSIGN_OR_RETURN(model.config, ConfigFromHuggingFace(config_path));
  ASSIGN_OR_RETURN(FoundTensors found, ReadWeightFiles(folder));

  const std::vector<WeightSpec> specs = ModelWeights(model.config);
  for (const WeightSpec& spec : specs) {
    auto it = FindWeight(found, model.config, spec.name);
    if (it == found.end()) {
      const bool untied_head = spec.name == "lm_head.weight";
      return absl::InvalidArgumentError(absl::StrCat(
          folder, ": missing weight '", spec.name, "' of shape ", DimsToString(spec.shape),
          untied_head ? " (config.json does not set tie_word_embeddings, so the model needs its own LM head)" : ""));
    }
    HostTensor& t = it->second.tensor;
    const std::vector<int64_t> file_shape = FileShape(model.config, spec);
    if (t.type().dims != file_shape || !IsFloat(t.type().dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(it->second.file, ": weight '", it->first, "' is ",
                                                     t.type().ToString(), ", expected a float tensor of shape ",
                                                     DimsToString(file_shape), " (from ", config_path, ")"));
    }
    // Every kiln float value is exact in f32, so this only relabels the dtype (and pads
    // GPT-2's wte with zero rows).
    std::vector<double> values = std::move(t.mutable_values());
    values.resize(TensorType{DType::kF32, spec.shape}.num_elements(), 0.0);
    model.weights.push_back(HostTensor::FromValues(TensorType{DType::kF32, spec.shape}, std::move(values)));
    found.erase(it);
  }

  // A tied checkpoint may still carry the head, as a copy of the embedding; keep the config's word.
  auto head = found.find("lm_head.weight");
  if (model.config.tie_embeddings && head != found.end()) {
    const HostTensor& embedding = model.weights.front();
    const std::vector<int64_t> file_shape = FileShape(model.config, specs.front());
    const std::vector<double>& head_values = head->second.tensor.values();
    if (head->second.tensor.type().dims != file_shape ||
        !std::equal(head_values.begin(), head_values.end(), embedding.values().begin())) {
      return absl::InvalidArgumentError(absl::StrCat(head->second.file, ": lm_head.weight differs from ",
                                                     specs.front().name, ", but ", config_path,
                                                     " ties them (tie_word_embeddings)"));
    }
    found.erase(head);
  }
  for (const auto& [name, tensor] : found) {
    if (IsNonWeightBuffer(name)) continue;
    return absl::InvalidArgumentError(absl::StrCat(tensor.file, ": unexpected tensor '", name,
                                                   "', not a weight of the ",
                                                   model.config.family == ModelFamily::kGpt2 ? "GPT-2" : "Llama",
                                                   " model ", config_path,
                                                   " describes"));
  }
  return model;
}

absl::Status ExportHuggingFaceModel(const std::string& folder, const ModelConfig& config,
                                    absl::Span<const HostTensor> weights, DType dtype) {
  RETURN_IF_ERROR(config.Validate());
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("Hugging Face export writes f32 or bf16 weights, not ", DTypeName(dtype)));
  }
  const std::vector<WeightSpec> specs = ModelWeights(config);
  if (weights.size() != specs.size()) {
    return absl::InvalidArgumentError(absl::StrCat("Hugging Face export: got ", weights.size(),
                                                   " weights, but the model has ", specs.size(),
                                                   " (in ModelWeights order)"));
  }
  Safetensors st;
  // What transformers' save_pretrained writes; its loader refuses other "format" values.
  st.metadata["format"] = "pt";
  for (size_t i = 0; i < specs.size(); ++i) {
    if (weights[i].type().dims != specs[i].shape || !IsFloat(weights[i].type().dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("Hugging Face export: weight ", i, " '", specs[i].name,
                                                     "' is ", weights[i].type().ToString(),
                                                     ", expected a float tensor of shape ",
                                                     DimsToString(specs[i].shape)));
    }
    // GPT-2's wte loses its padding rows: Hugging Face's holds vocab_size.
    const TensorType file_type{dtype, FileShape(config, specs[i])};
    std::vector<double> values(weights[i].values().begin(),
                               weights[i].values().begin() + file_type.num_elements());
    st.tensors.push_back({specs[i].name, HostTensor::FromValues(file_type, std::move(values))});
  }

  std::error_code error;
  std::filesystem::create_directories(folder, error);
  if (error) return absl::UnavailableError(absl::StrCat("cannot create folder ", folder, ": ", error.message()));
  // Weights first: a folder whose config.json is new holds the weights that go with it.
  RETURN_IF_ERROR(WriteSafetensorsFile(PathIn(folder, kWeightsFile), st));
  return WriteFileAtomically(PathIn(folder, kConfigFile), HuggingFaceConfigJson(config, dtype));
}

std::string HuggingFaceConfigJson(const ModelConfig& config, DType dtype) {
  if (config.family == ModelFamily::kGpt2) {  // GPT2Config's fields, as transformers writes them
    const nlohmann::ordered_json json = {
        {"architectures", nlohmann::ordered_json::array({"GPT2LMHeadModel"})},
        {"model_type", "gpt2"},
        {"n_embd", config.d_model},
        {"n_layer", config.n_layers},
        {"n_head", config.n_heads},
        {"n_inner", config.d_ff},
        {"n_positions", config.max_positions},
        {"n_ctx", config.max_positions},
        {"vocab_size", config.vocab_size},
        {"layer_norm_epsilon", config.rms_eps},
        {"activation_function", "gelu_new"},
        {"tie_word_embeddings", true},
        {"torch_dtype", std::string(TorchDTypeName(dtype))},
    };
    return json.dump(2) + "\n";
  }
  const nlohmann::ordered_json json = {
      {"architectures", nlohmann::ordered_json::array({"LlamaForCausalLM"})},
      {"model_type", "llama"},
      {"hidden_size", config.d_model},
      {"intermediate_size", config.d_ff},
      {"num_hidden_layers", config.n_layers},
      {"num_attention_heads", config.n_heads},
      {"num_key_value_heads", config.n_kv_heads},
      {"head_dim", config.head_dim},
      {"vocab_size", config.vocab_size},
      {"rms_norm_eps", config.rms_eps},
      {"rope_theta", config.rope_theta},
      {"tie_word_embeddings", config.tie_embeddings},
      {"max_position_embeddings", config.max_positions > 0 ? config.max_positions : config.seq_len},
      {"hidden_act", "silu"},
      {"torch_dtype", std::string(TorchDTypeName(dtype))},
  };
  return json.dump(2) + "\n";
}

}  // namespace kiln
