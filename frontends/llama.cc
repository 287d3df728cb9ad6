#include "frontends/llama.h"

#include "absl/strings/str_cat.h"
#include "frontends/nn.h"
#include "frontends/tensor.h"
#include "ir/status_macros.h"
#include "ir/verifier.h"

namespace kiln {
namespace {

std::string LayerPrefix(int64_t layer) { return absl::StrCat("model.layers.", layer, "."); }

// The weights of one decoder layer, as parameters of `graph`.
struct LayerWeights {
  Tensor input_norm;
  AttentionWeights attention;
  Tensor post_attention_norm;
  MlpWeights mlp;
};

// Hands out the weights of DeclareLlamaWeights (or LlamaInferenceWeights) in their order: the
// same list drives the names, the shapes and the parameter indices.
class WeightCursor {
 public:
  explicit WeightCursor(absl::Span<const Tensor> weights) : weights_(weights) {}
  Tensor Next() { return next_ < weights_.size() ? weights_[next_++] : Tensor(); }

 private:
  absl::Span<const Tensor> weights_;
  size_t next_ = 0;
};

}  // namespace


std::vector<WeightSpec> LlamaWeights(const ModelConfig& c) {
  const int64_t q_width = c.n_heads * c.head_dim, kv_width = c.n_kv_heads * c.head_dim;
  std::vector<WeightSpec> weights = {{"model.embed_tokens.weight", {c.vocab_size, c.d_model}}};
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = LayerPrefix(i);
    weights.push_back({p + "input_layernorm.weight", {c.d_model}});
    weights.push_back({p + "self_attn.q_proj.weight", {q_width, c.d_model}, true});
    weights.push_back({p + "self_attn.k_proj.weight", {kv_width, c.d_model}, true});
    weights.push_back({p + "self_attn.v_proj.weight", {kv_width, c.d_model}, true});
    weights.push_back({p + "self_attn.o_proj.weight", {c.d_model, q_width}, true});
    weights.push_back({p + "post_attention_layernorm.weight", {c.d_model}});
    weights.push_back({p + "mlp.gate_proj.weight", {c.d_ff, c.d_model}, true});
    weights.push_back({p + "mlp.up_proj.weight", {c.d_ff, c.d_model}, true});
    weights.push_back({p + "mlp.down_proj.weight", {c.d_model, c.d_ff}, true});
  }
  weights.push_back({"model.norm.weight", {c.d_model}});
  if (!c.tie_embeddings) weights.push_back({"lm_head.weight", {c.vocab_size, c.d_model}, true});
  return weights;
}

std::vector<Tensor> DeclareLlamaWeights(Graph& graph, const ModelConfig& config) {
  std::vector<Tensor> params;
  for (const WeightSpec& spec : LlamaWeights(config)) params.push_back(graph.Parameter(spec.name, {DType::kF32, spec.shape}));
  return params;
}

Tensor LlamaLogits(Graph& g, const ModelConfig& config, absl::Span<const Tensor> weight_params, Tensor tokens,
                   DType gemm_dtype, const LlamaAttention& attention, ProjectionLayout layout,
                   const HeadRows& head_rows) {
  WeightCursor weights(weight_params);
  Tensor embed_table = weights.Next();
  Tensor h = InScope(g, "embed", [&] { return Embedding(embed_table, tokens); });
  for (int64_t i = 0; i < config.n_layers; ++i) {
    ScopeGuard layer(g, absl::StrCat("layers.", i));
    LayerWeights w;
    w.input_norm = weights.Next();
    // In the order declared: q, k, v, o and gate, up, down, or qkv, o and gate_up, down.
    if (layout == ProjectionLayout::kJoined) {
      w.attention.qkv_proj = weights.Next();
      w.attention.o_proj = weights.Next();
    } else {
      // Braced lists evaluate left to right.
      w.attention = {weights.Next(), weights.Next(), weights.Next(), weights.Next()};
    }
    w.post_attention_norm = weights.Next();
    if (layout == ProjectionLayout::kJoined) {
      w.mlp.gate_up_proj = weights.Next();
      w.mlp.down_proj = weights.Next();
    } else {
      w.mlp = {weights.Next(), weights.Next(), weights.Next()};
    }
    // Residual adds sit in the layer's own scope, between the branches they join.
    Tensor x = InScope(g, "attn_norm", [&] { return RMSNorm(h, w.input_norm, config.rms_eps); });
    h = h + InScope(g, "attn", [&] { return attention(i, x, w.attention); });
    x = InScope(g, "mlp_norm", [&] { return RMSNorm(h, w.post_attention_norm, config.rms_eps); });
    h = h + InScope(g, "mlp", [&] { return SwiGLU(x, w.mlp, gemm_dtype); });
  }
  Tensor final_norm = weights.Next();
  Tensor head = config.tie_embeddings ? embed_table : weights.Next();
  if (head_rows) h = InScope(g, "head_rows", [&] { return head_rows(h); });
  h = InScope(g, "final_norm", [&] { return RMSNorm(h, final_norm, config.rms_eps); });
  return InScope(g, "lm_head", [&] { return LmHead(h, head, gemm_dtype); });
}

absl::StatusOr<std::unique_ptr<Module>> BuildLlamaModule(const ModelConfig& config, const LlamaBuildOptions& options) {
  RETURN_IF_ERROR(config.Validate());
  if (options.batch < 0 || options.seq_len < 0) {
    return absl::InvalidArgumentError(absl::StrCat("llama build options: batch (", options.batch, ") and seq_len (",
                                                   options.seq_len, ") must be >= 0 (0 takes the config's)"));
  }
  const int64_t batch = options.batch > 0 ? options.batch : config.batch;
  const int64_t seq_len = options.seq_len > 0 ? options.seq_len : config.seq_len;
  if (config.max_positions > 0 && seq_len > config.max_positions) {
    return absl::InvalidArgumentError(absl::StrCat("sequence length ", seq_len, " (--seq) is beyond model '", config.name,
                                                   "''s max_position_embeddings of ", config.max_positions));
  }
  // The sizes this build asks for (--batch, --seq) within the limits every reader applies.
  ModelConfig shaped = config;
  shaped.batch = batch;
  shaped.seq_len = seq_len;
  RETURN_IF_ERROR(shaped.Validate());
  const DType gemm_dtype = GemmOperandDType(options.precision);
  const AttentionShape attention_shape{config.n_heads, config.n_kv_heads, config.head_dim, config.rope_theta};

  auto module = std::make_unique<Module>(IsValidName(config.name) ? config.name : "llama");
  Graph g(module->AddFunction("forward"));
  Tensor tokens = g.Parameter("tokens", TensorType{DType::kI32, {batch, seq_len}});
  Tensor targets = g.Parameter("targets", TensorType{DType::kI32, {batch, seq_len}});
  const std::vector<Tensor> weights = DeclareLlamaWeights(g, config);
  Tensor logits = LlamaLogits(g, config, weights, tokens, gemm_dtype,
                              [&](int64_t /*layer*/, Tensor x, const AttentionWeights& w) {
                                return CausalSelfAttention(x, w, attention_shape, gemm_dtype);
                              });
  Tensor loss = InScope(g, "loss", [&] { return CrossEntropyLoss(logits, targets); });
  std::vector<Tensor> outputs = {loss};
  if (options.return_logits) outputs.push_back(logits);
  RETURN_IF_ERROR(g.Finish(outputs));
  RETURN_IF_ERROR(VerifyModule(*module));
  return module;
}

}  // namespace kiln
