#include "frontends/model_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ir/status_macros.h"
#include "ir/types.h"
#include "ir/verifier.h"

namespace kiln {
namespace {

ModelConfig Preset(std::string name, int64_t vocab, int64_t d_model, int64_t layers, int64_t heads,
                   int64_t kv_heads, int64_t head_dim, int64_t d_ff, int64_t seq_len, int64_t batch) {
  ModelConfig c;
  c.name = std::move(name);
  c.vocab_size = vocab;
  c.d_model = d_model;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.d_ff = d_ff;
  c.seq_len = seq_len;
  c.batch = batch;
  return c;  // untied, rms_eps 1e-5, rope_theta 1e4: the struct's defaults
}

// GPT-2: MLP 4 d wide, one kv head per head, the head tied to the embedding, positions learned.
ModelConfig Gpt2Preset(std::string name, int64_t vocab, int64_t d_model, int64_t layers, int64_t heads,
                       int64_t positions, int64_t seq_len, int64_t batch) {
  ModelConfig c = Preset(std::move(name), vocab, d_model, layers, heads, heads, d_model / heads, 4 * d_model, seq_len,
                         batch);
  c.family = ModelFamily::kGpt2;
  c.tie_embeddings = true;
  c.max_positions = positions;
  return c;  // LayerNorm eps 1e-5 (rms_eps), as GPT-2's layer_norm_epsilon
}

// DESIGN.md's reference shapes, plus one small enough to train on 2 CPU cores in a minute;
// and GPT-2's two smallest sizes (nanoGPT's and llm.c's), plus one as small for tests.
const std::vector<ModelConfig>& Presets() {
  static const std::vector<ModelConfig> presets = {
      //      name          vocab  d_model layers heads kv  head_dim d_ff  seq   batch
      Preset("llama-tiny", 256, 128, 2, 4, 2, 32, 384, 64, 8),
      Preset("llama-S", 32000, 768, 16, 12, 4, 64, 2048, 1024, 16),
      Preset("llama-M", 32000, 2048, 16, 16, 8, 128, 5632, 2048, 4),
      //          name         vocab  d_model layers heads positions seq   batch
      Gpt2Preset("gpt2-tiny", 256, 128, 2, 2, 64, 64, 8),
      Gpt2Preset("gpt2-124M", 50257, 768, 12, 12, 1024, 1024, 16),
      Gpt2Preset("gpt2-350M", 50257, 1024, 24, 16, 1024, 1024, 8),
  };
  return presets;
}

// Hugging Face's LlamaConfig defaults for the optional fields.
constexpr double kHfRmsEps = 1e-6;
constexpr double kHfRopeTheta = 10000.0;
constexpr int64_t kHfMaxPositions = 2048;
// A config.json's context may be 128k; a default training shape should fit a GPU.
constexpr int64_t kMaxDefaultSeqLen = 1024;

// Typed access to a config.json's fields; errors name the file and the field. A field set
// to null counts as absent (Hugging Face writes `"head_dim": null`).
class ConfigFields {
 public:
  ConfigFields(const nlohmann::json& json, std::string file) : json_(json), file_(std::move(file)) {}

  bool Has(const char* key) const { return json_.contains(key) && !json_[key].is_null(); }

  absl::StatusOr<int64_t> Int(const char* key) const {
    if (!Has(key)) return absl::InvalidArgumentError(absl::StrCat(file_, ": missing field \"", key, "\""));
    const nlohmann::json& v = json_[key];
    if (!v.is_number_integer()) return WrongType(key, "an integer");
    return v.get<int64_t>();
  }
  absl::StatusOr<int64_t> Int(const char* key, int64_t fallback) const {
    return Has(key) ? Int(key) : fallback;
  }
  absl::StatusOr<double> Number(const char* key, double fallback) const {
    if (!Has(key)) return fallback;
    if (!json_[key].is_number()) return WrongType(key, "a number");
    return json_[key].get<double>();
  }
  absl::StatusOr<bool> Bool(const char* key, bool fallback) const {
    if (!Has(key)) return fallback;
    if (!json_[key].is_boolean()) return WrongType(key, "true or false");
    return json_[key].get<bool>();
  }
  absl::StatusOr<std::string> String(const char* key) const {
    if (!Has(key)) return absl::InvalidArgumentError(absl::StrCat(file_, ": missing field \"", key, "\""));
    if (!json_[key].is_string()) return WrongType(key, "a string");
    return json_[key].get<std::string>();
  }

  absl::Status Error(absl::string_view why) const { return absl::InvalidArgumentError(absl::StrCat(file_, ": ", why)); }

 private:
  absl::Status WrongType(const char* key, absl::string_view expected) const {
    return Error(absl::StrCat("field \"", key, "\" must be ", expected, ", got ", json_[key].type_name(), " ",
                              json_[key].dump()));
  }

  const nlohmann::json& json_;
  std::string file_;
};

// Only what kiln builds: a Llama decoder with SiLU, plain RoPE and bias-free projections.
absl::Status CheckIsPlainLlama(const ConfigFields& fields, const nlohmann::json& json) {
  if (fields.Has("architectures")) {
    const nlohmann::json& archs = json["architectures"];
    if (!archs.is_array()) return fields.Error("field \"architectures\" must be a list of strings");
    for (const nlohmann::json& arch : archs) {
      if (!arch.is_string() || !absl::StartsWith(arch.get<std::string>(), "Llama")) {
        return fields.Error(absl::StrCat("architecture ", arch.dump(), " is not a Llama architecture"));
      }
    }
  }
  if (fields.Has("hidden_act")) {
    ASSIGN_OR_RETURN(std::string act, fields.String("hidden_act"));
    if (act != "silu") return fields.Error(absl::StrCat("hidden_act \"", act, "\" is not supported (only silu)"));
  }
  if (fields.Has("rope_scaling")) {
    return fields.Error(absl::StrCat("rope_scaling ", json["rope_scaling"].dump(),
                                     " is not supported (kiln implements plain RoPE)"));
  }
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    ASSIGN_OR_RETURN(bool has_bias, fields.Bool(bias, false));
    if (has_bias) return fields.Error(absl::StrCat(bias, " = true is not supported (projections have no bias)"));
  }
  return absl::OkStatus();
}

// A model name the IR accepts ([A-Za-z0-9_.-]+), from the folder holding config.json.
std::string NameFromFolder(const std::filesystem::path& config_file) {
  std::string name = std::filesystem::absolute(config_file).parent_path().filename().string();
  for (char& c : name) {
    if (!IsValidName(std::string(1, c))) c = '_';
  }
  return name.empty() ? "hf-llama" : name;
}

// A file given where a model is expected that is plainly something else (an IR module, a
// checkpoint) is named as what it is, rather than reported as malformed JSON.
absl::Status CheckLooksLikeConfig(absl::string_view content, const std::string& file) {
  const size_t start = content.find_first_not_of(" \t\r\n");
  const absl::string_view head = start == absl::string_view::npos ? "" : content.substr(start);
  std::string what;
  if (absl::StartsWith(head, "module") || absl::StartsWith(head, "//")) {
    what = "a kiln IR module (text)";
  } else if (absl::StartsWith(head, "{") && absl::StrContains(content, "\"format_version\"")) {
    what = "a kiln IR module (JSON)";
  } else if (absl::StartsWith(head, "digraph")) {
    what = "a Graphviz graph";
  } else if (content.size() >= 9 && content[8] == '{') {
    what = "a safetensors file (weights or a training checkpoint)";
  } else if (content.substr(0, 64).find('\0') != absl::string_view::npos) {
    what = "binary data (a kiln IR protobuf file?)";
  }
  if (what.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      file, " is ", what, ", but a model is expected here: a preset (", absl::StrJoin(PresetNames(), ", "),
      "), a Hugging Face config.json, or a folder holding one",
      absl::StrContains(what, "IR ") ? " (IR files are read by dump, verify, compile and check)" : "",
      absl::StrContains(what, "safetensors") ? " (a checkpoint goes with --resume or --weights)" : ""));
}

// GPT2Config (transformers): n_embd, n_layer, n_head, n_positions, vocab_size, n_inner
// (null: 4 n_embd), activation_function, layer_norm_epsilon; the head is always tied. Only
// what kiln builds: the tanh GELU and GPT-2's own attention scaling.
absl::StatusOr<ModelConfig> Gpt2ConfigFromJson(const ConfigFields& fields, const nlohmann::json& json) {
  if (fields.Has("architectures")) {
    const nlohmann::json& archs = json["architectures"];
    if (!archs.is_array()) return fields.Error("field \"architectures\" must be a list of strings");
    for (const nlohmann::json& arch : archs) {
      if (!arch.is_string() || !absl::StartsWith(arch.get<std::string>(), "GPT2")) {
        return fields.Error(absl::StrCat("architecture ", arch.dump(), " is not a GPT-2 architecture"));
      }
    }
  }
  if (fields.Has("activation_function")) {
    ASSIGN_OR_RETURN(std::string act, fields.String("activation_function"));
    if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
      return fields.Error(absl::StrCat("activation_function \"", act,
                                       "\" is not supported (kiln's gelu is the tanh approximation: gelu_new)"));
    }
  }
  for (const auto& [flag, expected] : {std::pair<const char*, bool>{"scale_attn_weights", true},
                                       {"scale_attn_by_inverse_layer_idx", false},
                                       {"reorder_and_upcast_attn", false},
                                       {"tie_word_embeddings", true}}) {
    ASSIGN_OR_RETURN(bool value, fields.Bool(flag, expected));
    if (value != expected) {
      return fields.Error(absl::StrCat(flag, " = ", value ? "true" : "false", " is not supported"));
    }
  }
  ModelConfig c;
  c.name = "hf-gpt2";
  c.family = ModelFamily::kGpt2;
  c.tie_embeddings = true;
  ASSIGN_OR_RETURN(c.d_model, fields.Int("n_embd", 768));
  ASSIGN_OR_RETURN(c.n_layers, fields.Int("n_layer", 12));
  ASSIGN_OR_RETURN(c.n_heads, fields.Int("n_head", 12));
  ASSIGN_OR_RETURN(c.vocab_size, fields.Int("vocab_size", 50257));
  ASSIGN_OR_RETURN(c.max_positions, fields.Int("n_positions", 1024));
  ASSIGN_OR_RETURN(c.d_ff, fields.Int("n_inner", 4 * c.d_model));
  ASSIGN_OR_RETURN(c.rms_eps, fields.Number("layer_norm_epsilon", 1e-5));
  if (c.n_heads <= 0 || c.d_model % c.n_heads != 0) {
    return fields.Error(absl::StrCat("n_embd (", c.d_model, ") must be a positive multiple of n_head (", c.n_heads, ")"));
  }
  c.n_kv_heads = c.n_heads;
  c.head_dim = c.d_model / c.n_heads;
  if (c.max_positions <= 0) return fields.Error(absl::StrCat("n_positions is ", c.max_positions, ", must be > 0"));
  c.seq_len = std::min(c.max_positions, kMaxDefaultSeqLen);
  absl::Status valid = c.Validate();
  if (!valid.ok()) return fields.Error(valid.message());
  return c;
}

int64_t LayerParameterCount(const ModelConfig& c) {
  if (c.family == ModelFamily::kGpt2) {
    const int64_t attention = 4 * c.d_model * c.d_model + 4 * c.d_model;  // c_attn and c_proj, with biases
    const int64_t mlp = 2 * c.d_model * c.d_ff + c.d_ff + c.d_model;      // c_fc and c_proj, with biases
    return attention + mlp + 4 * c.d_model;                               // ln_1, ln_2: weight and bias
  }
  const int64_t attention = c.d_model * c.head_dim * (2 * c.n_heads + 2 * c.n_kv_heads);  // q, o, k, v
  const int64_t mlp = 3 * c.d_model * c.d_ff;                                               // gate, up, down
  const int64_t norms = 2 * c.d_model;
  return attention + mlp + norms;
}

}  // namespace

absl::Status ModelConfig::Validate() const {
  const std::string what = absl::StrCat("model config '", name.empty() ? "unnamed" : name, "'");
  const std::pair<const char*, int64_t> sizes[] = {
      {"vocab_size", vocab_size}, {"d_model", d_model}, {"n_layers", n_layers}, {"n_heads", n_heads},
      {"n_kv_heads", n_kv_heads}, {"head_dim", head_dim}, {"d_ff", d_ff},       {"seq_len", seq_len},
      {"batch", batch}};
  for (const auto& [field, value] : sizes) {
    if (value <= 0) return absl::InvalidArgumentError(absl::StrCat(what, ": ", field, " is ", value, ", must be > 0"));
  }
  if (n_heads % n_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": n_heads (", n_heads, ") must be a multiple of n_kv_heads (",
                                                   n_kv_heads, ") for grouped-query attention"));
  }
  if (family == ModelFamily::kGpt2) {
    if (n_kv_heads != n_heads || n_heads * head_dim != d_model || !tie_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": GPT-2 has one kv head per head (", n_kv_heads, " of ",
                                                     n_heads, "), heads * head_dim = d_model (", n_heads, " * ",
                                                     head_dim, " vs ", d_model, ") and a tied head"));
    }
    if (max_positions <= 0 || seq_len > max_positions) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": GPT-2 needs n_positions (", max_positions,
                                                     ") > 0 and at least seq_len (", seq_len, ")"));
    }
  } else if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": head_dim (", head_dim, ") must be even: RoPE rotates pairs of dimensions"));
  }
  if (!(rms_eps >= 0) || !std::isfinite(rms_eps)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": rms_eps (", rms_eps, ") must be finite and >= 0"));
  }
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": rope_theta (", rope_theta, ") must be finite and > 0"));
  }
  // Sizes read from a file may be absurd; counting in double first keeps the int64
  // arithmetic of ParameterCount and of the IR's shapes from overflowing.
  const double params = static_cast<double>(d_model) * head_dim * (2.0 * n_heads + 2.0 * n_kv_heads) * n_layers +
                        3.0 * d_model * d_ff * n_layers + 2.0 * vocab_size * d_model;
  const double logits = static_cast<double>(batch) * seq_len * std::max(vocab_size, d_ff) +
                        static_cast<double>(batch) * n_heads * seq_len * seq_len;
  if (params > 1e15 || logits > 1e15) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": sizes are too large (", params,
                                                   " parameters, activations of ", logits, " elements)"));
  }
  // Every tensor the model builds within the limit that every IR reader applies (ir/types.h).
  const double limit = static_cast<double>(kMaxTensorElements);
  const std::pair<std::string, double> largest[] = {
      {"the embedding and LM head [vocab_size, d_model]", static_cast<double>(vocab_size) * d_model},
      {"the MLP weights [d_ff, d_model]", static_cast<double>(d_ff) * d_model},
      {"the logits [batch, seq, vocab_size]", static_cast<double>(batch) * seq_len * vocab_size},
      {"the attention scores [batch, heads, seq, seq]", static_cast<double>(batch) * n_heads * seq_len * seq_len},
  };
  for (const auto& [tensor, elements] : largest) {
    if (elements > limit) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", tensor, " would have ", elements,
                                                     " elements, more than kiln's limit of 2^40 per tensor (batch ",
                                                     batch, ", seq ", seq_len, ")"));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const ModelConfig& c : Presets()) names.push_back(c.name);
  return names;
}

absl::StatusOr<ModelConfig> PresetConfig(absl::string_view name) {
  for (const ModelConfig& c : Presets()) {
    if (absl::EqualsIgnoreCase(c.name, name)) return c;
  }
  return absl::NotFoundError(
      absl::StrCat("unknown preset '", name, "'; presets are ", absl::StrJoin(PresetNames(), ", ")));
}

int64_t ModelConfig::padded_vocab_size() const {
  constexpr int64_t kVocabMultiple = 128;
  if (family != ModelFamily::kGpt2) return vocab_size;
  return (vocab_size + kVocabMultiple - 1) / kVocabMultiple * kVocabMultiple;
}

absl::StatusOr<ModelConfig> ConfigFromHuggingFace(const std::string& path) {
  std::filesystem::path file = path;
  std::error_code ignored;  // a path that cannot be inspected fails to open below
  if (std::filesystem::is_directory(file, ignored)) file /= "config.json";
  std::ifstream in(file);
  if (!in || std::filesystem::is_directory(file, ignored)) {
    return absl::NotFoundError(absl::StrCat("cannot read Hugging Face config ", file.string(), ": no such file"));
  }
  std::stringstream text;
  text << in.rdbuf();
  RETURN_IF_ERROR(CheckLooksLikeConfig(text.str(), file.string()));
  ASSIGN_OR_RETURN(ModelConfig c, ConfigFromHuggingFaceJson(text.str(), file.string()));
  c.name = NameFromFolder(file);
  return c;
}

absl::StatusOr<ModelConfig> ConfigFromHuggingFaceJson(absl::string_view text, const std::string& source) {
  const std::filesystem::path file = source;
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.string(), ": malformed JSON at byte ", e.byte, ": ", e.what()));
  }
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.string(), ": expected a JSON object at the top level, got ", json.type_name()));
  }

  ConfigFields fields(json, file.string());
  ASSIGN_OR_RETURN(std::string model_type, fields.String("model_type"));
  if (model_type == "gpt2") return Gpt2ConfigFromJson(fields, json);
  if (model_type != "llama") {
    return fields.Error(
        absl::StrCat("model_type is \"", model_type, "\"; kiln imports only \"llama\" and \"gpt2\" models"));
  }
  RETURN_IF_ERROR(CheckIsPlainLlama(fields, json));
  ModelConfig c;
  c.name = "hf-llama";
  ASSIGN_OR_RETURN(c.d_model, fields.Int("hidden_size"));
  ASSIGN_OR_RETURN(c.d_ff, fields.Int("intermediate_size"));
  ASSIGN_OR_RETURN(c.n_layers, fields.Int("num_hidden_layers"));
  ASSIGN_OR_RETURN(c.n_heads, fields.Int("num_attention_heads"));
  ASSIGN_OR_RETURN(c.vocab_size, fields.Int("vocab_size"));
  ASSIGN_OR_RETURN(c.n_kv_heads, fields.Int("num_key_value_heads", c.n_heads));
  if (c.n_heads <= 0) return fields.Error(absl::StrCat("num_attention_heads is ", c.n_heads, ", must be > 0"));
  if (fields.Has("head_dim")) {
    ASSIGN_OR_RETURN(c.head_dim, fields.Int("head_dim"));
  } else if (c.d_model % c.n_heads != 0) {
    return fields.Error(absl::StrCat("hidden_size (", c.d_model, ") is not a multiple of num_attention_heads (",
                                     c.n_heads, ") and no head_dim is given"));
  } else {
    c.head_dim = c.d_model / c.n_heads;
  }
  ASSIGN_OR_RETURN(c.rms_eps, fields.Number("rms_norm_eps", kHfRmsEps));
  ASSIGN_OR_RETURN(c.rope_theta, fields.Number("rope_theta", kHfRopeTheta));
  // transformers >= 5 writes {"rope_parameters": {"rope_type": "default", "rope_theta": X}}.
  if (fields.Has("rope_parameters")) {
    const nlohmann::json& rope = json["rope_parameters"];
    if (!rope.is_object()) return fields.Error("field \"rope_parameters\" must be an object");
    ConfigFields rope_fields(rope, absl::StrCat(file.string(), ": rope_parameters"));
    if (rope_fields.Has("rope_type")) {
      ASSIGN_OR_RETURN(std::string type, rope_fields.String("rope_type"));
      if (type != "default") {
        return fields.Error(absl::StrCat("rope_parameters.rope_type \"", type,
                                         "\" is not supported (kiln implements plain RoPE)"));
      }
    }
    ASSIGN_OR_RETURN(c.rope_theta, rope_fields.Number("rope_theta", c.rope_theta));
  }
  ASSIGN_OR_RETURN(c.tie_embeddings, fields.Bool("tie_word_embeddings", false));
  ASSIGN_OR_RETURN(int64_t max_positions, fields.Int("max_position_embeddings", kHfMaxPositions));
  if (max_positions <= 0) return fields.Error(absl::StrCat("max_position_embeddings is ", max_positions, ", must be > 0"));
  c.max_positions = max_positions;
  c.seq_len = std::min(max_positions, kMaxDefaultSeqLen);

  absl::Status valid = c.Validate();
  if (!valid.ok()) return fields.Error(valid.message());
  return c;
}

absl::StatusOr<ModelConfig> ResolveModelConfig(const std::string& model) {
  absl::StatusOr<ModelConfig> preset = PresetConfig(model);
  if (preset.ok()) return preset;
  std::error_code ignored;
  if (std::filesystem::exists(model, ignored)) return ConfigFromHuggingFace(model);
  return absl::NotFoundError(absl::StrCat("unknown model '", model, "': not a preset (",
                                          absl::StrJoin(PresetNames(), ", "),
                                          ") and no such file or folder (a Hugging Face config.json, or a "
                                          "folder holding one)"));
}

int64_t ParameterCount(const ModelConfig& config) {
  const int64_t embedding = config.vocab_size * config.d_model;  // the padding rows of GPT-2's table not counted
  const int64_t positions = config.family == ModelFamily::kGpt2 ? config.max_positions * config.d_model : 0;  // wpe
  return embedding + positions + NonEmbeddingParameterCount(config) - (config.tie_embeddings ? embedding : 0);
}

int64_t NonEmbeddingParameterCount(const ModelConfig& config) {
  const int64_t lm_head = config.vocab_size * config.d_model;
  const int64_t final_norm = (config.family == ModelFamily::kGpt2 ? 2 : 1) * config.d_model;  // + ln_f's bias
  return config.n_layers * LayerParameterCount(config) + final_norm + lm_head;
}

}  // namespace kiln
