// BuildLlamaModule: every preset builds and verifies, weights follow Hugging Face, the
// attention pattern is the one frontends/nn.h documents, the precision policy holds and
// scopes group nodes by layer.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "frontends/llama.h"
#include "ir/text_format.h"
#include "ir/verifier.h"
#include "ir/reference_backend.h"

namespace kiln {
namespace {

// The presets of the Llama family (GPT-2's are tests/gpt2_model_test.cc's).
std::vector<std::string> LlamaPresetNames() {
  std::vector<std::string> names;
  for (const std::string& name : PresetNames()) {
    if (PresetConfig(name)->family == ModelFamily::kLlama) names.push_back(name);
  }
  return names;
}

using ::testing::HasSubstr;

std::unique_ptr<Module> Build(const ModelConfig& config, LlamaBuildOptions options = {}) {
  absl::StatusOr<std::unique_ptr<Module>> m = BuildLlamaModule(config, options);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

std::unique_ptr<Module> BuildPreset(const std::string& name, Precision precision = Precision::kBf16) {
  return Build(*PresetConfig(name), {.precision = precision});
}

const Function& Forward(const Module& m) { return *m.FindFunction("forward"); }

// Nodes whose scope is `scope` or nested under it.
std::vector<const Node*> NodesIn(const Function& f, const std::string& scope) {
  std::vector<const Node*> nodes;
  for (const auto& n : f.nodes()) {
    if (n->scope() == scope || absl::StartsWith(n->scope(), scope + ".")) nodes.push_back(n.get());
  }
  return nodes;
}

std::vector<const Node*> OfOp(const std::vector<const Node*>& nodes, Opcode op) {
  std::vector<const Node*> out;
  for (const Node* n : nodes) {
    if (n->opcode() == op) out.push_back(n);
  }
  return out;
}

std::vector<const Node*> AllNodes(const Function& f) {
  std::vector<const Node*> nodes;
  for (const auto& n : f.nodes()) nodes.push_back(n.get());
  return nodes;
}

// The one user of `n` (the pattern is a chain), or nullptr.
const Node* OnlyUser(const Node* n) { return n->users().size() == 1 ? n->users()[0] : nullptr; }

// Looks through a convert (present under bf16 only).
const Node* SkipConvert(const Node* n) { return n->opcode() == Opcode::kConvert ? n->operand(0) : n; }

std::vector<int64_t> Ints(const Node* n, const char* attr) { return *n->attrs().GetInts(attr); }

TEST(LlamaModel, EveryPresetBuildsAndVerifiesInBothPrecisions) {
  for (const std::string& name : LlamaPresetNames()) {
    for (Precision p : {Precision::kBf16, Precision::kFp32}) {
      std::unique_ptr<Module> m = BuildPreset(name, p);
      ASSERT_NE(m, nullptr) << name;
      EXPECT_TRUE(VerifyModule(*m).ok()) << name << ": " << VerifyModule(*m);
      EXPECT_EQ(m->name(), name);
      const Function& f = Forward(*m);
      ASSERT_EQ(f.outputs().size(), 1u);
      EXPECT_EQ(f.outputs()[0]->type().ToString(), "f32[]") << "the mean loss";
    }
  }
}

TEST(LlamaModel, NodeCountsGrowByOneLayerPatternPerLayer) {
  std::unique_ptr<Module> tiny = BuildPreset("llama-tiny");
  std::unique_ptr<Module> s = BuildPreset("llama-S");
  std::unique_ptr<Module> m = BuildPreset("llama-M");
  const Function& f = Forward(*tiny);
  const size_t per_layer = NodesIn(f, "layers.0").size();
  EXPECT_GT(per_layer, 40u);  // norms, 9 GEMMs with converts, RoPE, mask, softmax, SwiGLU...
  EXPECT_LT(per_layer, 80u);  // ...but no hidden blow-up
  EXPECT_EQ(NodesIn(f, "layers.1").size(), per_layer);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(NodesIn(Forward(*s), absl::StrCat("layers.", i)).size(), per_layer);
  // Same structure, more layers: each further layer adds its nodes and its 9 weights
  // (top-level parameters).
  EXPECT_EQ(Forward(*s).num_nodes(), f.num_nodes() + 14 * static_cast<int64_t>(per_layer + 9));
  EXPECT_EQ(Forward(*m).num_nodes(), Forward(*s).num_nodes());
}

TEST(LlamaModel, ParametersAreHuggingFaceWeightsInLlamaWeightsOrder) {
  const ModelConfig config = *PresetConfig("llama-tiny");
  std::unique_ptr<Module> m = BuildPreset("llama-tiny");
  std::vector<Node*> params = Forward(*m).parameters();
  const std::vector<WeightSpec> weights = LlamaWeights(config);
  ASSERT_EQ(params.size(), weights.size() + 2);
  EXPECT_EQ(params[0]->name(), "tokens");
  EXPECT_EQ(params[0]->type().ToString(), "i32[8,64]");
  EXPECT_EQ(params[1]->name(), "targets");
  EXPECT_EQ(params[1]->type().ToString(), "i32[8,64]");
  for (size_t i = 0; i < weights.size(); ++i) {
    EXPECT_EQ(params[i + 2]->name(), weights[i].name);
    EXPECT_EQ(params[i + 2]->type(), (TensorType{DType::kF32, weights[i].shape})) << weights[i].name;
  }
  // Hugging Face's names and [out, in] layouts, spelled out.
  std::map<std::string, std::string> shapes;
  for (const Node* p : params) shapes[p->name()] = p->type().ToString();
  EXPECT_EQ(shapes.size(), 2 + 1 + 2 * 9 + 1 + 1u);
  EXPECT_EQ(shapes["model.embed_tokens.weight"], "f32[256,128]");
  EXPECT_EQ(shapes["model.layers.0.input_layernorm.weight"], "f32[128]");
  EXPECT_EQ(shapes["model.layers.0.self_attn.q_proj.weight"], "f32[128,128]");
  EXPECT_EQ(shapes["model.layers.1.self_attn.k_proj.weight"], "f32[64,128]");
  EXPECT_EQ(shapes["model.layers.1.self_attn.v_proj.weight"], "f32[64,128]");
  EXPECT_EQ(shapes["model.layers.1.self_attn.o_proj.weight"], "f32[128,128]");
  EXPECT_EQ(shapes["model.layers.1.post_attention_layernorm.weight"], "f32[128]");
  EXPECT_EQ(shapes["model.layers.0.mlp.gate_proj.weight"], "f32[384,128]");
  EXPECT_EQ(shapes["model.layers.0.mlp.up_proj.weight"], "f32[384,128]");
  EXPECT_EQ(shapes["model.layers.0.mlp.down_proj.weight"], "f32[128,384]");
  EXPECT_EQ(shapes["model.norm.weight"], "f32[128]");
  EXPECT_EQ(shapes["lm_head.weight"], "f32[256,128]");
}

TEST(LlamaModel, WeightElementsAddUpToParameterCount) {
  for (const std::string& name : LlamaPresetNames()) {
    for (bool tied : {false, true}) {
      ModelConfig config = *PresetConfig(name);
      config.tie_embeddings = tied;
      int64_t total = 0;
      for (const WeightSpec& w : LlamaWeights(config)) total += TensorType{DType::kF32, w.shape}.num_elements();
      EXPECT_EQ(total, ParameterCount(config)) << name << (tied ? " tied" : "");
    }
  }
}

TEST(LlamaModel, TiedEmbeddingsReuseTheEmbeddingAsTheHead) {
  ModelConfig config = *PresetConfig("llama-tiny");
  config.tie_embeddings = true;
  for (Precision p : {Precision::kBf16, Precision::kFp32}) {
    std::unique_ptr<Module> m = Build(config, {.precision = p});
    ASSERT_NE(m, nullptr);
    const Function& f = Forward(*m);
    EXPECT_EQ(f.FindNode("lm_head.weight"), nullptr);
    std::vector<const Node*> head = OfOp(NodesIn(f, "lm_head"), Opcode::kDotGeneral);
    ASSERT_EQ(head.size(), 1u);
    EXPECT_EQ(SkipConvert(head[0]->operand(1))->name(), "model.embed_tokens.weight");
  }
}

TEST(LlamaModel, LossIsTheMeanTokenCrossEntropyAndLogitsOnRequest) {
  std::unique_ptr<Module> m =
      Build(*PresetConfig("llama-tiny"), {.batch = 2, .seq_len = 16, .return_logits = true});
  ASSERT_NE(m, nullptr);
  const Function& f = Forward(*m);
  EXPECT_EQ(f.parameters()[0]->type().ToString(), "i32[2,16]");
  ASSERT_EQ(f.outputs().size(), 2u);
  EXPECT_EQ(f.outputs()[1]->type().ToString(), "bf16[2,16,256]");  // the bf16 policy's logits
  const Node* loss = f.outputs()[0];
  ASSERT_EQ(loss->opcode(), Opcode::kMul);
  const Node* sum = loss->operand(0);
  ASSERT_EQ(sum->opcode(), Opcode::kReduceSum);
  ASSERT_EQ(sum->operand(0)->opcode(), Opcode::kGetResult);  // the loss, result 0
  EXPECT_EQ(sum->operand(0)->result_index(), 0);
  const Node* ce = sum->operand(0)->operand(0);
  ASSERT_EQ(ce->opcode(), Opcode::kCrossEntropy);
  EXPECT_EQ(ce->operand(0)->type().ToString(), "bf16[32,256]");
  EXPECT_EQ(ce->operand(1)->type().ToString(), "i32[32]");
  const Node* scale = loss->operand(1);
  ASSERT_EQ(scale->opcode(), Opcode::kConstant);
  EXPECT_EQ(*scale->attrs().GetFloat("value"), 1.0 / 32);
}

// Walks one layer's attention from QKᵀ to ·V along the documented pattern.
void ExpectAttentionPattern(const Function& f, int layer, const ModelConfig& c, int64_t batch, int64_t seq) {
  SCOPED_TRACE(absl::StrCat("layer ", layer));
  const std::vector<const Node*> attn = NodesIn(f, absl::StrCat("layers.", layer, ".attn"));
  const std::vector<int64_t> scores_shape = {batch, c.n_heads, seq, seq};
  EXPECT_EQ(OfOp(attn, Opcode::kDotGeneral).size(), 6u) << "q, k, v, o projections, QK^T and PV";
  EXPECT_EQ(OfOp(attn, Opcode::kRope).size(), 2u);
  EXPECT_EQ(OfOp(attn, Opcode::kSoftmax).size(), 1u);
  EXPECT_EQ(OfOp(attn, Opcode::kSelect).size(), 1u);
  std::vector<const Node*> compares = OfOp(attn, Opcode::kCompare);
  ASSERT_EQ(compares.size(), 1u);
  EXPECT_EQ(*compares[0]->attrs().GetSymbol("direction"), "ge");
  EXPECT_EQ(*compares[0]->operand(0)->attrs().GetInt("dim"), 0) << "query index (row)";
  EXPECT_EQ(*compares[0]->operand(1)->attrs().GetInt("dim"), 1) << "key index (column)";

  const Node* qk = nullptr;
  for (const Node* n : OfOp(attn, Opcode::kDotGeneral)) {
    if (n->type().dims == scores_shape) qk = n;
  }
  ASSERT_NE(qk, nullptr);
  EXPECT_EQ(Ints(qk, "lhs_batch"), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(Ints(qk, "rhs_batch"), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(Ints(qk, "lhs_contract"), (std::vector<int64_t>{3}));
  EXPECT_EQ(Ints(qk, "rhs_contract"), (std::vector<int64_t>{3}));
  EXPECT_EQ(SkipConvert(qk->operand(0))->opcode(), Opcode::kTranspose);
  const Node* k = SkipConvert(qk->operand(1));
  const int64_t groups = c.n_heads / c.n_kv_heads;
  if (groups > 1) {
    ASSERT_EQ(k->opcode(), Opcode::kReshape);
    const Node* repeat = k->operand(0);
    ASSERT_EQ(repeat->opcode(), Opcode::kBroadcast);
    EXPECT_EQ(Ints(repeat, "dims"), (std::vector<int64_t>{0, 1, 3, 4}));
    EXPECT_EQ(repeat->type().dims, (std::vector<int64_t>{batch, c.n_kv_heads, groups, seq, c.head_dim}));
    k = repeat->operand(0);
  }
  ASSERT_EQ(k->opcode(), Opcode::kTranspose);
  EXPECT_EQ(k->operand(0)->opcode(), Opcode::kRope);

  const Node* scaled = OnlyUser(qk);
  ASSERT_NE(scaled, nullptr);
  ASSERT_EQ(scaled->opcode(), Opcode::kMul);
  const Node* scale = scaled->operand(1);
  ASSERT_EQ(scale->opcode(), Opcode::kBroadcast);
  EXPECT_EQ(*scale->operand(0)->attrs().GetFloat("value"), 1.0 / std::sqrt(static_cast<double>(c.head_dim)));

  const Node* masked = OnlyUser(scaled);
  ASSERT_NE(masked, nullptr);
  ASSERT_EQ(masked->opcode(), Opcode::kSelect);
  EXPECT_EQ(masked->operand(0)->opcode(), Opcode::kBroadcast);
  EXPECT_EQ(masked->operand(0)->operand(0), compares[0]);
  EXPECT_EQ(masked->operand(1), scaled);
  ASSERT_EQ(masked->operand(2)->opcode(), Opcode::kBroadcast);
  EXPECT_EQ(*masked->operand(2)->operand(0)->attrs().GetFloat("value"), -std::numeric_limits<double>::infinity());

  const Node* probs = OnlyUser(masked);
  ASSERT_NE(probs, nullptr);
  ASSERT_EQ(probs->opcode(), Opcode::kSoftmax);
  const Node* pv = probs;
  while (pv != nullptr && pv->opcode() != Opcode::kDotGeneral) pv = OnlyUser(pv);  // through the convert
  ASSERT_NE(pv, nullptr);
  EXPECT_EQ(Ints(pv, "rhs_contract"), (std::vector<int64_t>{2}));
  EXPECT_EQ(pv->type().dims, (std::vector<int64_t>{batch, c.n_heads, seq, c.head_dim}));
}

TEST(LlamaModel, AttentionFollowsTheDocumentedPatternInEveryLayer) {
  for (const std::string& name : LlamaPresetNames()) {
    SCOPED_TRACE(name);
    const ModelConfig c = *PresetConfig(name);
    for (Precision p : {Precision::kBf16, Precision::kFp32}) {
      std::unique_ptr<Module> m = BuildPreset(name, p);
      for (int layer = 0; layer < c.n_layers; ++layer) {
        ExpectAttentionPattern(Forward(*m), layer, c, c.batch, c.seq_len);
      }
    }
  }
}

TEST(LlamaModel, MultiHeadAttentionHasNoKvRepeat) {
  ModelConfig c = *PresetConfig("llama-tiny");
  c.n_kv_heads = c.n_heads;
  std::unique_ptr<Module> m = Build(c);
  ASSERT_NE(m, nullptr);
  for (const Node* n : OfOp(AllNodes(Forward(*m)), Opcode::kBroadcast)) EXPECT_NE(n->type().rank(), 5);
  ExpectAttentionPattern(Forward(*m), 0, c, c.batch, c.seq_len);
}

// The bf16 policy (frontends/nn.h): every GEMM operand bf16 with f32 accumulation; the
// projections that make activations (q, k, v, gate, up) and the LM head round their result
// to bf16 as autocast stores it, those that join the residual stream (o, down) and the
// attention products keep f32; the residual stream, the norms and the loss stay f32.
TEST(LlamaModel, Bf16PolicyRoundsEveryGemmOperandAndStoresActivationsBf16) {
  const ModelConfig c = *PresetConfig("llama-tiny");
  std::unique_ptr<Module> m = BuildPreset("llama-tiny", Precision::kBf16);
  std::vector<const Node*> nodes = AllNodes(Forward(*m));
  std::vector<const Node*> dots = OfOp(nodes, Opcode::kDotGeneral);
  EXPECT_EQ(dots.size(), static_cast<size_t>(9 * c.n_layers + 1)) << "7 projections + 2 attention per layer, head";
  int bf16_results = 0;
  for (const Node* dot : dots) {
    EXPECT_EQ(dot->operand(0)->type().dtype, DType::kBF16) << dot->name();
    EXPECT_EQ(dot->operand(1)->type().dtype, DType::kBF16) << dot->name();
    const Node* rhs = dot->operand(1);
    const std::string weight = rhs->opcode() == Opcode::kConvert ? rhs->operand(0)->name() : "";
    const bool activation = absl::StrContains(weight, "q_proj") || absl::StrContains(weight, "k_proj") ||
                            absl::StrContains(weight, "v_proj") || absl::StrContains(weight, "gate_proj") ||
                            absl::StrContains(weight, "up_proj") || absl::StrContains(weight, "lm_head");
    EXPECT_EQ(dot->type().dtype, activation ? DType::kBF16 : DType::kF32) << dot->name() << " of " << weight;
    bf16_results += activation;
  }
  EXPECT_EQ(bf16_results, 5 * c.n_layers + 1);
  for (const Node* n : nodes) {
    if (n->has_multiple_results()) continue;  // cross_entropy: (f32 loss, f32 lse)
    if (n->opcode() == Opcode::kRmsNorm || n->opcode() == Opcode::kAdd || n->opcode() == Opcode::kSoftmax ||
        n->opcode() == Opcode::kGather) {
      EXPECT_EQ(n->type().dtype, DType::kF32) << n->name() << " (" << n->op_name() << ")";
    }
  }
}

TEST(LlamaModel, Fp32PolicyHasNoConverts) {
  std::unique_ptr<Module> fp32 = BuildPreset("llama-tiny", Precision::kFp32);
  std::unique_ptr<Module> bf16 = BuildPreset("llama-tiny", Precision::kBf16);
  std::vector<const Node*> nodes = AllNodes(Forward(*fp32));
  EXPECT_TRUE(OfOp(nodes, Opcode::kConvert).empty());
  for (const Node* dot : OfOp(nodes, Opcode::kDotGeneral)) {
    EXPECT_EQ(dot->operand(0)->type().dtype, DType::kF32);
    EXPECT_EQ(dot->operand(1)->type().dtype, DType::kF32);
    EXPECT_FALSE(dot->attrs().Has("out_dtype"));
  }
  // The two graphs differ by exactly the converts.
  const size_t converts = OfOp(AllNodes(Forward(*bf16)), Opcode::kConvert).size();
  EXPECT_GT(converts, 0u);
  EXPECT_EQ(Forward(*bf16).num_nodes(), Forward(*fp32).num_nodes() + static_cast<int64_t>(converts));
}

TEST(LlamaModel, ScopesGroupNodesByLayer) {
  const ModelConfig c = *PresetConfig("llama-tiny");
  std::unique_ptr<Module> m = BuildPreset("llama-tiny");
  std::set<std::string> scopes;
  for (const auto& n : Forward(*m).nodes()) scopes.insert(n->scope());
  std::set<std::string> expected = {"", "embed", "final_norm", "lm_head", "loss"};
  for (int i = 0; i < c.n_layers; ++i) {
    for (const char* part : {"", ".attn_norm", ".attn", ".mlp_norm", ".mlp"}) {
      expected.insert(absl::StrCat("layers.", i, part));
    }
  }
  EXPECT_EQ(scopes, expected);
  for (const Node* n : AllNodes(Forward(*m))) {
    if (n->opcode() == Opcode::kParameter) {
      EXPECT_EQ(n->scope(), "") << n->name();
    } else if (n->opcode() == Opcode::kGather) {
      EXPECT_EQ(n->scope(), "embed");
    } else if (n->opcode() == Opcode::kCrossEntropy) {
      EXPECT_EQ(n->scope(), "loss");
    }
  }
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string layer = absl::StrCat("layers.", i);
    EXPECT_EQ(OfOp(NodesIn(Forward(*m), layer + ".attn_norm"), Opcode::kRmsNorm).size(), 1u);
    EXPECT_EQ(OfOp(NodesIn(Forward(*m), layer + ".mlp_norm"), Opcode::kRmsNorm).size(), 1u);
    EXPECT_EQ(OfOp(NodesIn(Forward(*m), layer + ".mlp"), Opcode::kSigmoid).size(), 1u);
    // The residual adds belong to the layer itself, between its branches.
    size_t residual_adds = 0;
    for (const Node* n : OfOp(NodesIn(Forward(*m), layer), Opcode::kAdd)) residual_adds += n->scope() == layer;
    EXPECT_EQ(residual_adds, 2u) << layer;
  }
}

// --- numbers, on the CPU reference backend ----------------------------------------------

// Token ids below the vocabulary; small projections so activations stay moderate; norm
// weights around 1.
std::vector<HostTensor> RandomArgs(const Function& f, int64_t vocab, uint64_t seed) {
  std::vector<HostTensor> args;
  for (const Node* p : f.parameters()) {
    const TensorType& t = p->type();
    if (t.dtype == DType::kI32) {
      args.push_back(HostTensor::Random(t, seed++, 0, static_cast<double>(vocab)));
    } else if (t.rank() == 1) {
      args.push_back(HostTensor::Random(t, seed++, 0.5, 1.5));
    } else {
      args.push_back(HostTensor::Random(t, seed++, -0.1, 0.1));
    }
  }
  return args;
}

std::vector<HostTensor> Evaluate(const Module& m, const std::vector<HostTensor>& args) {
  absl::StatusOr<std::vector<HostTensor>> out = EvaluateFunction(Forward(m), args);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *std::move(out) : std::vector<HostTensor>{};
}

constexpr int64_t kSeq = 8;

ModelConfig TinyAt(int64_t n_kv_heads) {
  ModelConfig c = *PresetConfig("llama-tiny");
  c.n_kv_heads = n_kv_heads;
  return c;
}

TEST(LlamaNumerics, LaterTokensNeverChangeEarlierLogits) {
  const ModelConfig c = TinyAt(2);
  std::unique_ptr<Module> m =
      Build(c, {.batch = 1, .seq_len = kSeq, .precision = Precision::kFp32, .return_logits = true});
  std::vector<HostTensor> args = RandomArgs(Forward(*m), c.vocab_size, 1);
  std::vector<HostTensor> before = Evaluate(*m, args);
  double& last_token = args[0].mutable_values()[kSeq - 1];
  last_token = std::fmod(last_token + 1, static_cast<double>(c.vocab_size));
  std::vector<HostTensor> after = Evaluate(*m, args);
  ASSERT_EQ(before.size(), 2u);
  ASSERT_EQ(after.size(), 2u);
  const std::vector<double>& x = before[1].values();
  const std::vector<double>& y = after[1].values();
  const int64_t v = c.vocab_size;
  // The mask zeroes later keys exactly (exp(-inf) = 0), so earlier rows are bit-identical.
  EXPECT_TRUE(std::equal(x.begin(), x.begin() + (kSeq - 1) * v, y.begin())) << "a query saw a later key";
  EXPECT_FALSE(std::equal(x.begin() + (kSeq - 1) * v, x.end(), y.begin() + (kSeq - 1) * v))
      << "the last position must see its own token";
}

TEST(LlamaNumerics, LossIsTheMeanCrossEntropyOfTheLogits) {
  const ModelConfig c = TinyAt(2);
  std::unique_ptr<Module> m =
      Build(c, {.batch = 2, .seq_len = kSeq, .precision = Precision::kFp32, .return_logits = true});
  std::vector<HostTensor> args = RandomArgs(Forward(*m), c.vocab_size, 7);
  std::vector<HostTensor> out = Evaluate(*m, args);
  ASSERT_EQ(out.size(), 2u);
  const std::vector<double>& logits = out[1].values();
  const std::vector<double>& targets = args[1].values();
  double expected = 0;
  for (size_t row = 0; row < targets.size(); ++row) {
    const double* z = &logits[row * c.vocab_size];
    const double top = *std::max_element(z, z + c.vocab_size);
    double sum = 0;
    for (int64_t i = 0; i < c.vocab_size; ++i) sum += std::exp(z[i] - top);
    expected += top + std::log(sum) - z[static_cast<int64_t>(targets[row])];
  }
  expected /= static_cast<double>(targets.size());
  EXPECT_NEAR(out[0][0], expected, 1e-5 * std::abs(expected));
}

// Grouped-query attention equals multi-head attention whose key/value heads are copies:
// query head h reads kv head h / G.
TEST(LlamaNumerics, GroupedQueryAttentionEqualsMultiHeadWithRepeatedKvHeads) {
  const ModelConfig gqa = TinyAt(2), mha = TinyAt(4);
  const LlamaBuildOptions options{.batch = 1, .seq_len = kSeq, .precision = Precision::kFp32, .return_logits = true};
  std::unique_ptr<Module> gqa_module = Build(gqa, options);
  std::unique_ptr<Module> mha_module = Build(mha, options);
  std::vector<HostTensor> gqa_args = RandomArgs(Forward(*gqa_module), gqa.vocab_size, 3);
  std::vector<HostTensor> mha_args;
  const std::vector<Node*> mha_params = Forward(*mha_module).parameters();
  const int64_t groups = mha.n_heads / gqa.n_kv_heads, rows = gqa.head_dim * gqa.d_model;
  for (size_t i = 0; i < mha_params.size(); ++i) {
    const std::string& name = mha_params[i]->name();
    if (!absl::EndsWith(name, "k_proj.weight") && !absl::EndsWith(name, "v_proj.weight")) {
      mha_args.push_back(gqa_args[i]);
      continue;
    }
    std::vector<double> repeated;
    for (int64_t head = 0; head < mha.n_heads; ++head) {
      auto kv_head = gqa_args[i].values().begin() + (head / groups) * rows;
      repeated.insert(repeated.end(), kv_head, kv_head + rows);
    }
    mha_args.push_back(HostTensor::FromValues(mha_params[i]->type(), std::move(repeated)));
  }
  std::vector<HostTensor> a = Evaluate(*gqa_module, gqa_args);
  std::vector<HostTensor> b = Evaluate(*mha_module, mha_args);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (int64_t i = 0; i < a[1].num_elements(); ++i) {
    ASSERT_NEAR(a[1][i], b[1][i], 1e-6 * (1 + std::abs(b[1][i]))) << "logit " << i;
  }
}

TEST(LlamaNumerics, Bf16LossStaysCloseToFp32) {
  const ModelConfig c = TinyAt(2);
  std::unique_ptr<Module> fp32 = Build(c, {.batch = 2, .seq_len = kSeq, .precision = Precision::kFp32});
  std::unique_ptr<Module> bf16 = Build(c, {.batch = 2, .seq_len = kSeq, .precision = Precision::kBf16});
  std::vector<HostTensor> args = RandomArgs(Forward(*fp32), c.vocab_size, 11);
  const double exact = Evaluate(*fp32, args)[0][0];
  const double rounded = Evaluate(*bf16, args)[0][0];
  EXPECT_NE(exact, rounded) << "bf16 rounding must actually happen";
  EXPECT_NEAR(rounded, exact, 0.01 * std::abs(exact));
}

TEST(LlamaModel, PrintedIrParsesBackToTheSameText) {
  for (Precision p : {Precision::kBf16, Precision::kFp32}) {
    std::unique_ptr<Module> m = BuildPreset("llama-tiny", p);
    const std::string text = PrintModule(*m);
    absl::StatusOr<std::unique_ptr<Module>> parsed = ParseModule(text);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(PrintModule(**parsed), text);
  }
}

TEST(LlamaModel, RejectsBadConfigsAndOptions) {
  ModelConfig c = *PresetConfig("llama-tiny");
  c.n_kv_heads = 3;
  EXPECT_THAT(std::string(BuildLlamaModule(c).status().message()), HasSubstr("multiple of n_kv_heads"));
  absl::Status negative = BuildLlamaModule(*PresetConfig("llama-tiny"), {.batch = -1}).status();
  EXPECT_THAT(std::string(negative.message()), HasSubstr("batch (-1)"));
}

TEST(LlamaModel, PrecisionNamesRoundTrip) {
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp8}) {
    EXPECT_EQ(*ParsePrecision(PrecisionName(p)), p);
  }
  EXPECT_THAT(std::string(ParsePrecision("fp16").status().message()), HasSubstr("expected fp32, bf16 or fp8"));
}

}  // namespace
}  // namespace kiln
