#include "frontends/gpt2.h"

#include "absl/strings/str_cat.h"
#include "frontends/nn.h"
#include "frontends/tensor.h"
#include "ir/status_macros.h"
#include "ir/verifier.h"

namespace kiln {
namespace {

std::string BlockPrefix(int64_t layer) { return absl::StrCat("transformer.h.", layer, "."); }

// [B,T,H,Dh] -> [B,H,T,Dh].
const std::vector<int64_t> kSwapSeqAndHeads = {0, 2, 1, 3};

struct BlockWeights {
  Tensor ln_1_w, ln_1_b, c_attn_w, c_attn_b, attn_proj_w, attn_proj_b;
  Tensor ln_2_w, ln_2_b, c_fc_w, c_fc_b, mlp_proj_w, mlp_proj_b;
};

// One fused projection to q, k, v ([B,T,3D], split along the last dim), each head's
// [B,H,T,Dh], then CausalAttentionCore and c_proj.
Tensor Gpt2Attention(Tensor x, const BlockWeights& w, const ModelConfig& c, DType gemm_dtype) {
  const int64_t b = x.dim(0), t = x.dim(1), d = c.d_model;
  Tensor qkv = Conv1D(x, w.c_attn_w, w.c_attn_b, gemm_dtype, gemm_dtype);  // activations: bf16 under bf16
  auto head_split = [&](int64_t part) {
    Tensor y = Slice(qkv, {0, 0, part * d}, {b, t, (part + 1) * d});
    return Transpose(Reshape(y, {b, t, c.n_heads, c.head_dim}), kSwapSeqAndHeads);
  };
  Tensor q = head_split(0);
  Tensor k = head_split(1);
  Tensor v = head_split(2);
  return Conv1D(CausalAttentionCore(q, k, v, gemm_dtype), w.attn_proj_w, w.attn_proj_b, gemm_dtype);
}

Tensor Gpt2Mlp(Tensor x, const BlockWeights& w, DType gemm_dtype) {
  Tensor hidden = Gelu(Conv1D(x, w.c_fc_w, w.c_fc_b, gemm_dtype, gemm_dtype));  // bf16 under bf16
  return Conv1D(hidden, w.mlp_proj_w, w.mlp_proj_b, gemm_dtype);
}

}  // namespace

std::vector<WeightSpec> Gpt2Weights(const ModelConfig& c) {
  const int64_t d = c.d_model;
  std::vector<WeightSpec> weights = {{"transformer.wte.weight", {c.padded_vocab_size(), d}},
                                     {"transformer.wpe.weight", {c.max_positions, d}}};
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = BlockPrefix(i);
    weights.push_back({p + "ln_1.weight", {d}});
    weights.push_back({p + "ln_1.bias", {d}});
    weights.push_back({p + "attn.c_attn.weight", {d, 3 * d}});
    weights.push_back({p + "attn.c_attn.bias", {3 * d}});
    weights.push_back({p + "attn.c_proj.weight", {d, d}});
    weights.push_back({p + "attn.c_proj.bias", {d}});
    weights.push_back({p + "ln_2.weight", {d}});
    weights.push_back({p + "ln_2.bias", {d}});
    weights.push_back({p + "mlp.c_fc.weight", {d, c.d_ff}});
    weights.push_back({p + "mlp.c_fc.bias", {c.d_ff}});
    weights.push_back({p + "mlp.c_proj.weight", {c.d_ff, d}});
    weights.push_back({p + "mlp.c_proj.bias", {d}});
  }
  weights.push_back({"transformer.ln_f.weight", {d}});
  weights.push_back({"transformer.ln_f.bias", {d}});
  return weights;
}

Tensor Gpt2Logits(Graph& g, const ModelConfig& config, absl::Span<const Tensor> weights, Tensor tokens,
                  DType gemm_dtype) {
  size_t next = 0;
  auto take = [&] { return next < weights.size() ? weights[next++] : Tensor(); };
  const int64_t b = tokens.dim(0), t = tokens.dim(1), d = config.d_model;
  Tensor wte = take();
  Tensor wpe = take();
  Tensor h = InScope(g, "embed", [&] {
    Tensor tok = Embedding(wte, tokens);                      // [B,T,D]
    Tensor pos = Embedding(wpe, Positions(g, t));             // [T,D]
    return Add(tok, Broadcast(pos, {1, 2}, {b, t, d}));
  });
  for (int64_t i = 0; i < config.n_layers; ++i) {
    ScopeGuard layer(g, absl::StrCat("layers.", i));
    BlockWeights w;
    // Statement by statement: the order of Gpt2Weights.
    w.ln_1_w = take(), w.ln_1_b = take(), w.c_attn_w = take(), w.c_attn_b = take();
    w.attn_proj_w = take(), w.attn_proj_b = take(), w.ln_2_w = take(), w.ln_2_b = take();
    w.c_fc_w = take(), w.c_fc_b = take(), w.mlp_proj_w = take(), w.mlp_proj_b = take();
    Tensor x = InScope(g, "ln_1", [&] { return LayerNorm(h, w.ln_1_w, w.ln_1_b, config.rms_eps); });
    h = h + InScope(g, "attn", [&] { return Gpt2Attention(x, w, config, gemm_dtype); });
    x = InScope(g, "ln_2", [&] { return LayerNorm(h, w.ln_2_w, w.ln_2_b, config.rms_eps); });
    h = h + InScope(g, "mlp", [&] { return Gpt2Mlp(x, w, gemm_dtype); });
  }
  Tensor ln_f_w = take();
  Tensor ln_f_b = take();
  h = InScope(g, "ln_f", [&] { return LayerNorm(h, ln_f_w, ln_f_b, config.rms_eps); });
  // [B,T,Vp]: the tied table, padded rows included (the loss skips their columns).
  return InScope(g, "lm_head", [&] { return LmHead(h, wte, gemm_dtype); });
}

absl::StatusOr<std::unique_ptr<Module>> BuildGpt2Module(const ModelConfig& config, const LlamaBuildOptions& options) {
  if (config.family != ModelFamily::kGpt2) {
    return absl::InvalidArgumentError(absl::StrCat("model '", config.name, "' is not a GPT-2 model"));
  }
  if (options.batch < 0 || options.seq_len < 0) {
    return absl::InvalidArgumentError(absl::StrCat("gpt2 build options: batch (", options.batch, ") and seq_len (",
                                                   options.seq_len, ") must be >= 0 (0 takes the config's)"));
  }
  ModelConfig shaped = config;
  if (options.batch > 0) shaped.batch = options.batch;
  if (options.seq_len > 0) shaped.seq_len = options.seq_len;
  if (shaped.seq_len > config.max_positions) {
    return absl::InvalidArgumentError(absl::StrCat("sequence length ", shaped.seq_len, " (--seq) is beyond model '",
                                                   config.name, "''s ", config.max_positions, " positions"));
  }
  RETURN_IF_ERROR(shaped.Validate());
  const DType gemm_dtype = GemmOperandDType(options.precision);

  auto module = std::make_unique<Module>(IsValidName(config.name) ? config.name : "gpt2");
  Graph g(module->AddFunction("forward"));
  Tensor tokens = g.Parameter("tokens", TensorType{DType::kI32, {shaped.batch, shaped.seq_len}});
  Tensor targets = g.Parameter("targets", TensorType{DType::kI32, {shaped.batch, shaped.seq_len}});
  std::vector<Tensor> weights;
  for (const WeightSpec& spec : Gpt2Weights(config)) {
    weights.push_back(g.Parameter(spec.name, TensorType{DType::kF32, spec.shape}));
  }
  Tensor logits = Gpt2Logits(g, config, weights, tokens, gemm_dtype);
  const bool padded = config.padded_vocab_size() != config.vocab_size;
  Tensor loss = InScope(g, "loss", [&] { return CrossEntropyLoss(logits, targets, padded ? config.vocab_size : 0); });
  std::vector<Tensor> outputs = {loss};
  if (options.return_logits) {
    outputs.push_back(padded ? InScope(g, "lm_head", [&] {
      return Slice(logits, {0, 0, 0}, {shaped.batch, shaped.seq_len, config.vocab_size});
    })
                             : logits);
  }
  RETURN_IF_ERROR(g.Finish(outputs));
  RETURN_IF_ERROR(VerifyModule(*module));
  return module;
}

std::vector<WeightSpec> ModelWeights(const ModelConfig& config) {
  return config.family == ModelFamily::kGpt2 ? Gpt2Weights(config) : LlamaWeights(config);
}

absl::StatusOr<std::unique_ptr<Module>> BuildModelModule(const ModelConfig& config, const LlamaBuildOptions& options) {
  if (config.family == ModelFamily::kGpt2) return BuildGpt2Module(config, options);
  return BuildLlamaModule(config, options);
}

}  // namespace kiln
