// Hugging Face Llama checkpoints: a folder with config.json and safetensors weights named
// as Hugging Face names them (the names LlamaWeights uses), read into and written from
// kiln's f32 master weights.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "frontends/model_config.h"
#include "ir/host_tensor.h"

namespace kiln {

struct HuggingFaceModel {
  ModelConfig config;
  std::vector<HostTensor> weights;  // in LlamaWeights(config) order, as f32 (master weights)
};

// Reads `folder`/config.json and `folder`/model.safetensors (f32, bf16, or any float type),
// or, without model.safetensors, the shards listed by model.safetensors.index.json. Fails
// on a missing, unexpected or misshaped weight, naming it. Hugging Face's non-weight buffers
// (rotary_emb.inv_freq) are skipped; a tied model may carry lm_head.weight only as an
// exact copy of the embedding.
absl::StatusOr<HuggingFaceModel> LoadHuggingFaceModel(const std::string& folder);

// Writes config.json (HuggingFaceConfigJson) and model.safetensors with `weights` (in
// LlamaWeights order) converted to `dtype`, kF32 or kBF16, creating the folder if needed.
absl::Status ExportHuggingFaceModel(const std::string& folder, const ModelConfig& config,
                                    absl::Span<const HostTensor> weights, DType dtype = DType::kF32);

// A config.json that transformers loads as LlamaForCausalLM; torch_dtype names `dtype`.
// max_position_embeddings is the config's max_positions, or for a preset (none declared) its seq_len.
std::string HuggingFaceConfigJson(const ModelConfig& config, DType dtype = DType::kF32);

}  // namespace kiln
