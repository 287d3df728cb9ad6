// The GPT-2 decoder (nanoGPT's and llm.c's model), built from frontends/nn.h layers into
// kiln IR: learned position embeddings, pre-LN blocks (ln_1, attention through one fused
// c_attn projection and c_proj, ln_2, MLP c_fc / gelu / c_proj, every projection with a
// bias), a final ln_f, and the LM head tied to the token embedding.
//
// Function @forward, as BuildLlamaModule's (frontends/llama.h):
//   parameters: tokens i32[B,T], targets i32[B,T], then every weight, named as Hugging
//   Face's GPT2LMHeadModel names them with save_pretrained (transformer.wte.weight,
//   transformer.h.N.attn.c_attn.weight, ..., transformer.ln_f.bias) in Hugging Face's
//   layouts: Conv1D weights are [in, out]. The one difference: transformer.wte.weight has
//   ModelConfig::padded_vocab_size() rows (50304 for GPT-2's 50257), the padding rows zero;
//   frontends/hf_checkpoint.cc adds and drops them.
//   outputs: the mean cross-entropy loss f32[] (and logits f32[B,T,V] when asked).
//
// The tied head: the same wte parameter feeds the embedding's gather and the head's
// dot_general, so autodiff sums both gradients into it (scatter_add + the GEMM's). The head
// computes padded logits [B,T,Vp] (a GEMM of whole tiles) and slices the first V columns
// before the loss, so the padding rows get zero gradient.
//
// Attention is CausalAttentionCore (nn.h): the decomposed causal pattern that
// select-flash-attention turns into the flash op on a GPU (GPT-2's head dim is 64).
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "frontends/llama.h"  // LlamaBuildOptions, WeightSpec: shared by the families
#include "frontends/model_config.h"
#include "ir/graph.h"

namespace kiln {

// Every weight of the model, in the order @forward takes them (after tokens, targets).
std::vector<WeightSpec> Gpt2Weights(const ModelConfig& config);

// Logits f32 [B,T,Vp] of `tokens` [B,T] given the weights in Gpt2Weights order, over the
// padded vocabulary (config.padded_vocab_size()): columns V.. belong to the tied table's
// padding rows, and the loss takes them as padding (cross_entropy {classes=V}).
Tensor Gpt2Logits(Graph& graph, const ModelConfig& config, absl::Span<const Tensor> weights, Tensor tokens,
                  DType gemm_dtype);

absl::StatusOr<std::unique_ptr<Module>> BuildGpt2Module(const ModelConfig& config,
                                                        const LlamaBuildOptions& options = {});

// The family-independent calls the CLI and checkpoints use: Llama's or GPT-2's by
// config.family.
std::vector<WeightSpec> ModelWeights(const ModelConfig& config);
absl::StatusOr<std::unique_ptr<Module>> BuildModelModule(const ModelConfig& config,
                                                         const LlamaBuildOptions& options = {});

}  // namespace kiln
