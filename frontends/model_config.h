// One config struct for every model kiln builds, Llama-style or GPT-2 (`family`): the
// presets, and models read from a Hugging Face config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

enum class ModelFamily {
  kLlama,  // frontends/llama.h: RMSNorm, RoPE, GQA, SwiGLU, no biases
  kGpt2,   // frontends/gpt2.h: LayerNorm, learned positions, GELU MLP, biases, tied head
};

// The defaults are llama-tiny's sizes.
struct ModelConfig {
  std::string name;
  ModelFamily family = ModelFamily::kLlama;
  int64_t vocab_size = 256;
  int64_t d_model = 128;
  int64_t n_layers = 2;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 2;  // grouped-query attention: n_heads % n_kv_heads == 0
  int64_t head_dim = 32;
  int64_t d_ff = 384;      // SwiGLU hidden size
  double rms_eps = 1e-5;  // the norms' eps: RMSNorm's, or for GPT-2 LayerNorm's
  double rope_theta = 10000.0;
  bool tie_embeddings = false;
  // Default training shape (a preset's seq and batch; overridable by the CLI).
  int64_t seq_len = 64;
  int64_t batch = 8;
  // An HF config's max_position_embeddings: the longest sequence the model was made for.
  // 0 (the presets): no declared limit.
  // GPT-2: the rows of the learned position table (n_positions), required (> 0).
  int64_t max_positions = 0;

  // The embedding table's rows as kiln holds it: vocab_size, or for GPT-2 rounded up to a
  // multiple of 128 (llm.c's padding: 50257 -> 50304) so that the LM head's GEMM tiles
  // evenly. The padded logits are sliced off before the loss; Hugging Face files hold
  // vocab_size rows.
  int64_t padded_vocab_size() const;

  // A clear error for inconsistent sizes (heads not dividing, odd head_dim, ...).
  absl::Status Validate() const;
};

// Presets: llama-tiny (trains on 2 CPU cores in a minute), llama-S and llama-M (DESIGN.md);
// gpt2-tiny (the same for GPT-2), gpt2-124M and gpt2-350M (nanoGPT's and llm.c's).
std::vector<std::string> PresetNames();
absl::StatusOr<ModelConfig> PresetConfig(absl::string_view name);

// A Hugging Face Llama or GPT-2 config.json (model_type llama or gpt2), or a folder holding one.
absl::StatusOr<ModelConfig> ConfigFromHuggingFace(const std::string& path);
// The same from config.json text; `source` names it in errors. The name is "hf-llama" or
// "hf-gpt2".
absl::StatusOr<ModelConfig> ConfigFromHuggingFaceJson(absl::string_view text, const std::string& source);

// MODEL on the command line: a preset name, an HF config.json, or a folder holding one.
absl::StatusOr<ModelConfig> ResolveModelConfig(const std::string& model);

// Number of trainable parameters.
int64_t ParameterCount(const ModelConfig& config);

// Parameters without the input embedding, LM head included (DESIGN.md's count: llama-S is
// 125M, llama-M 821M). With tied embeddings the shared matrix counts once, as the head.
int64_t NonEmbeddingParameterCount(const ModelConfig& config);

}  // namespace kiln
