// Hugging Face Llama and GPT-2 checkpoints: a folder with config.json and safetensors
// weights named as Hugging Face names them (the names ModelWeights uses, frontends/gpt2.h),
// read into and written from kiln's f32 master weights. GPT-2: the names save_pretrained
// writes (transformer.h.0.attn.c_attn.weight) and those of the original upload, without
// "transformer." (h.0.attn.c_attn.weight), both load; export writes the former. Conv1D
// weights are [in, out] in the file and in kiln alike (no transpose); wte holds vocab_size
// rows in the file, padded_vocab_size() in kiln (zero rows added on load, dropped on export).
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
  std::vector<HostTensor> weights;  // in ModelWeights(config) order, as f32 (master weights)
};

// Reads `folder`/config.json and `folder`/model.safetensors (f32, bf16, or any float type),
// or, without model.safetensors, the shards listed by model.safetensors.index.json. Fails
// on a missing, unexpected or misshaped weight, naming it. Hugging Face's non-weight buffers
// (rotary_emb.inv_freq, GPT-2's attn.bias masks) are skipped; a tied model may carry lm_head.weight only as an
// exact copy of the embedding.
absl::StatusOr<HuggingFaceModel> LoadHuggingFaceModel(const std::string& folder);

// Writes config.json (HuggingFaceConfigJson) and model.safetensors with `weights` (in
// ModelWeights order) converted to `dtype`, kF32 or kBF16, creating the folder if needed.
absl::Status ExportHuggingFaceModel(const std::string& folder, const ModelConfig& config,
                                    absl::Span<const HostTensor> weights, DType dtype = DType::kF32);

// A config.json that transformers loads as LlamaForCausalLM (GPT2LMHeadModel for GPT-2); torch_dtype names `dtype`.
// max_position_embeddings is the config's max_positions, or for a preset (none declared) its seq_len.
std::string HuggingFaceConfigJson(const ModelConfig& config, DType dtype = DType::kF32);

}  // namespace kiln
