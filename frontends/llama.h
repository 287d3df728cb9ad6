// The Llama-style decoder, built from frontends/nn.h layers into kiln IR.
//
// Function @forward:
//   parameters: tokens i32[B,T], targets i32[B,T], then every weight, named as Hugging Face
//   names them (model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight, ...,
//   model.norm.weight, lm_head.weight) with Hugging Face's layouts (Linear is [out, in]).
//   outputs: the mean cross-entropy loss f32[] (and logits when asked).
// Node scopes follow the layers ("layers.3.attn"), so dumps and graphs group by layer.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "frontends/model_config.h"
#include "frontends/nn.h"
#include "frontends/tensor.h"
#include "ir/graph.h"
#include "passes/compile_options.h"  // Precision

namespace kiln {


struct LlamaBuildOptions {
  int64_t batch = 0;    // 0: the config's batch
  int64_t seq_len = 0;  // 0: the config's seq_len
  // bf16: GEMM operands (linear layers, QK^T, PV, LM head) are converted to bf16 and
  // accumulate in f32; norms, softmax, reductions and the loss stay f32. fp32: all f32.
  Precision precision = Precision::kBf16;
  bool return_logits = false;  // also return logits f32[B,T,V] as a second output
};

struct WeightSpec {
  std::string name;             // Hugging Face name
  std::vector<int64_t> shape;   // Hugging Face layout
  // Read only as a GEMM operand (the projections and an untied LM head): the inference
  // functions take it in the GEMM dtype, since every use rounds it there anyway.
  bool gemm_operand = false;
};

// Every weight of the model, in the order @forward takes them (after tokens, targets).
std::vector<WeightSpec> LlamaWeights(const ModelConfig& config);

// The pieces @forward is built from; LlamaLogits is shared with the inference functions
// (frontends/llama_inference.h), so that all of them compute the same layers from the same
// weights (theirs with q/k/v and gate/up joined: LlamaInferenceWeights).
//
// Every weight as an f32 parameter of `graph`, in LlamaWeights order.
std::vector<Tensor> DeclareLlamaWeights(Graph& graph, const ModelConfig& config);
// One layer's self-attention: `x` is the normed input [B,T,D]; returns f32 [B,T,D].
using LlamaAttention = std::function<Tensor(int64_t layer, Tensor x, const AttentionWeights& weights)>;
// How a layer's projections come in `weights`: as LlamaWeights lists them (q, k, v, o; gate,
// up, down), or with q, k and v's rows joined into one weight and gate and up's into another
// (qkv, o; gate_up, down: the inference functions, frontends/llama_inference.h).
enum class ProjectionLayout { kSeparate, kJoined };

// Which of the last layer's rows [B,T,D] the final norm and the LM head compute: all of them
// (null), or those a function picks ([B,T',D]; the inference prefill keeps each sequence's
// last token, the only one whose logits are sampled).
using HeadRows = std::function<Tensor(Tensor hidden)>;

// Logits f32 [B,T,V] of `tokens` [B,T] ([B,T',V] with `head_rows`): embedding, the decoder
// layers (attention built by `attention`, inside scope layers.N.attn), the final norm and the
// LM head.
Tensor LlamaLogits(Graph& graph, const ModelConfig& config, absl::Span<const Tensor> weights, Tensor tokens,
                   DType gemm_dtype, const LlamaAttention& attention,
                   ProjectionLayout layout = ProjectionLayout::kSeparate, const HeadRows& head_rows = nullptr);

absl::StatusOr<std::unique_ptr<Module>> BuildLlamaModule(const ModelConfig& config,
                                                         const LlamaBuildOptions& options = {});

}  // namespace kiln
