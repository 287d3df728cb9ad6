// The inference functions of a Llama model (DESIGN.md, "The inference lowering"; issue 15):
//
//   @prefill        B sequences, T tokens each at once: each prompt's tokens not found in
//                   the prefix cache, their K/V written into the sequence's blocks, attention
//                   over the cached prefix and the new tokens together (T = a bucket the
//                   longest is padded up to)
//   @fresh_prefill  the same for prompts none of whose tokens is cached: every key a token
//                   attends to is then a token of the call, and the attention is the training
//                   forward's (CausalAttentionCore: one flash kernel where the target takes
//                   the shape, its query tiles sharing each K/V tile), not paged_attention's
//                   (PagedKv::fresh_prompts); the K/V are written into the pools all the same
//   @decode         B sequences, one token each (B = a decode batch bucket, 1, 2, 4, ...)
//
// All are one function shape, built at (B, T), (B, T) and (B, 1):
//
//   parameters  tokens i32[B,T], positions i32[B,T], slots i32[B,T], block_tables i32[B,M],
//               sampling f32[B,1,3] and draws i32[B,1,3] (each sequence's sampling
//               parameters and (seed, draw), as ir/token_sampling.h's TokenSamplingOperands),
//               k_pool, v_pool [L, NB, KV, BS, Dh] (f32, or bf16 under the bf16 policy),
//               then the weights of LlamaInferenceWeights: @forward's (LlamaWeights), in
//               its order, but with each layer's q, k and v joined into one [(H+2KV)*Dh, D]
//               weight and gate and up into one [2F, D] (a decode step's projections are
//               weight streams, and one GEMM over the joint rows costs one launch and one
//               ramp where three cost three; joined once when the weights are bound,
//               InferenceWeightsFromModel, never per call), and with the GEMM operands in
//               the GEMM dtype (bf16 under the bf16 policy: @forward rounds them there
//               before every use, so the values are the same, and a decode step reads half
//               the bytes)
//   outputs     logits [B,1,V] of each sequence's last token, the one at its largest position
//               (f32; bf16 under the bf16 policy, as @forward's LM head writes them: the
//               prefills' final norm and LM head compute that row alone, the only one
//               sampled), k_pool', v_pool' (donated: output_aliases {-1, 6, 7, -1}), and the
//               next token of every sequence, i32 [B,1]: sample_tokens of the logits with the
//               sequence's parameters (greedy, temperature, top-k, top-p), so that no request
//               needs its logits off the device, and a decode step can start on the last
//               one's tokens before the host has read them
//
// Sequence lengths, positions and block tables are data, so a function's shapes depend only
// on (B, T) and the pool: one compile (and, on a GPU, one captured graph) per bucket. A
// padding row has token 0, position -1 and slot -1: it writes no K/V and its attention is
// zero; its logits are garbage that nobody reads (a prefill's padding tokens come after its
// row's real ones, and a prefill call has no row of padding alone).
//
// Why the functions are built by the frontend code that builds @forward, not rewritten from
// @forward's graph: every shape of @forward is specialized to [batch, seq] (reshapes, iotas,
// the causal mask's [T,T] and the loss all carry it), and its attention is a decomposed
// pattern whose masking is by iota. A rewrite would have to re-infer every shape at (B, 1)
// and re-derive from the mask what a position is, i.e. re-trace the model. Re-tracing the
// same code is what kiln does instead: BuildLlamaModule and these functions share
// LlamaLogits (frontends/llama.h) — the embedding, the layers, the norms, the MLP and the LM
// head are the same statements — and differ only in the layer's attention,
// PagedSelfAttention (frontends/nn.h) instead of CausalSelfAttention, and in the joint
// projections (ProjectionLayout::kJoined). The
// weights' parameter layout is the same list, with the joint projections the one difference
// (tests/llama_inference_test.cc checks it), so one set of weights, a training checkpoint
// or a Hugging Face folder, binds to all three.
// The functions then run through the normal pass pipelines (CompileInferenceModule).
#pragma once

#include <cstdint>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "frontends/llama.h"
#include "frontends/model_config.h"
#include "ir/graph.h"
#include "ir/host_tensor.h"
#include "passes/compile_options.h"
#include "passes/pipeline.h"

namespace kiln {

struct PagedKvLayout {
  int64_t num_blocks = 0;               // NB, >= 1
  int64_t block_size = 16;              // BS, tokens per block
  int64_t max_blocks_per_sequence = 0;  // M, the width of a block table row
};

// The pool's type: [L, NB, KV, BS, Dh] of the GEMM dtype of `precision` (f32 or bf16).
TensorType KvPoolType(const ModelConfig& config, const PagedKvLayout& layout, Precision precision);

// The type an inference function takes weight `spec` in (see above).
TensorType InferenceWeightType(const WeightSpec& spec, Precision precision);

// A weight of the inference functions: one of LlamaWeights, or several of them with their
// rows joined (dim 0), in `sources` order.
struct InferenceWeight {
  WeightSpec spec;           // the joint weight's name ("...self_attn.qkv_proj.weight"), shape
  std::vector<int> sources;  // indices into LlamaWeights(config)
};

// The weights the inference functions take, in order: every LlamaWeights entry exactly once,
// in its order, q/k/v and gate/up of each layer joined.
std::vector<InferenceWeight> LlamaInferenceWeights(const ModelConfig& config);

// `model_weights` (LlamaWeights order, f32 as a checkpoint or the init gives them) as the
// inference functions take them: joined as LlamaInferenceWeights says, each of
// InferenceWeightType (the GEMM operands rounded to bf16 under the bf16 policy).
absl::StatusOr<std::vector<HostTensor>> InferenceWeightsFromModel(const ModelConfig& config,
                                                                  std::vector<HostTensor> model_weights,
                                                                  Precision precision);

// The parameter index of the sampling operands, the pools and the first weight, in every
// function; the output index of the next tokens.
inline constexpr int kInferenceSamplingParameter = 4;
inline constexpr int kInferenceDrawsParameter = 5;
inline constexpr int kInferenceKPoolParameter = 6;
inline constexpr int kInferenceVPoolParameter = 7;
inline constexpr int kInferenceFirstWeightParameter = 8;
inline constexpr int kInferenceTokenOutput = 3;

enum class InferencePhase { kPrefill, kDecode, kFreshPrefill };

// The function's name: "prefill", "decode" or "fresh_prefill".
const char* InferenceFunctionName(InferencePhase phase);

// One inference function: its phase, and `batch` sequences of `tokens` tokens each (decode:
// one token).
struct InferenceShape {
  InferencePhase phase = InferencePhase::kDecode;
  int64_t batch = 1;
  int64_t tokens = 1;
  friend bool operator<(const InferenceShape& a, const InferenceShape& b) {
    return std::tie(a.phase, a.batch, a.tokens) < std::tie(b.phase, b.batch, b.tokens);
  }
  friend bool operator==(const InferenceShape& a, const InferenceShape& b) {
    return std::tie(a.phase, a.batch, a.tokens) == std::tie(b.phase, b.batch, b.tokens);
  }
};

// A module holding one function of `shape`, as the header describes. Not yet run through any
// pass. InvalidArgument for a decode of more than one token, or a size below 1.
absl::StatusOr<std::unique_ptr<Module>> BuildLlamaInferenceModule(const ModelConfig& config,
                                                                  const PagedKvLayout& layout, Precision precision,
                                                                  const InferenceShape& shape);
// The same for one prompt of `size` tokens (prefill phases) or `size` sequences (decode).
absl::StatusOr<std::unique_ptr<Module>> BuildLlamaInferenceModule(const ModelConfig& config,
                                                                  const PagedKvLayout& layout, Precision precision,
                                                                  InferencePhase phase, int64_t size);

// The forward pipeline, then the default pipeline (passes/default_pipeline.h) without
// merge-sibling-gemms (its concatenate of weight parameters would be a copy every call), on an
// inference module.
absl::StatusOr<PipelineReport> CompileInferenceModule(Module& module, const CompileOptions& options);

}  // namespace kiln
