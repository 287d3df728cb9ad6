// GPT-2 (frontends/gpt2.h) on the CPU reference backend: the presets' sizes, the graph's
// structure, causality, and the Hugging Face folder round trip (kiln's exporter, then its
// loader, gives the same loss), including the names of GPT-2's original upload. Gradients
// against finite differences: tests/autodiff_fd_test.cc (AutodiffGpt2Test).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "frontends/gpt2.h"
#include "frontends/hf_checkpoint.h"
#include "frontends/model_config.h"
#include "frontends/weight_init.h"
#include "ir/reference_backend.h"
#include "runtime/safetensors.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

std::string FreshDir(absl::string_view name) {
  const fs::path dir = fs::path(::testing::TempDir()) / absl::StrCat("gpt2_model_test_", name, "_", ::getpid());
  fs::remove_all(dir);
  return dir.string();
}

int CountOps(const Function& f, Opcode op) {
  int n = 0;
  for (const auto& node : f.nodes()) n += node->opcode() == op;
  return n;
}

// tokens, targets, then the weights: the arguments of @forward.
std::vector<HostTensor> Arguments(const Function& f, const std::vector<HostTensor>& weights, uint64_t seed,
                                  int64_t vocab) {
  std::vector<HostTensor> args;
  for (int i = 0; i < 2; ++i) {
    args.push_back(HostTensor::Random(f.parameters()[i]->type(), seed + i, 0, static_cast<double>(vocab)));
  }
  args.insert(args.end(), weights.begin(), weights.end());
  return args;
}

TEST(Gpt2Presets, SizesAreGpt2s) {
  const ModelConfig small = PresetConfig("gpt2-124M").value();
  EXPECT_EQ(small.family, ModelFamily::kGpt2);
  EXPECT_EQ(small.padded_vocab_size(), 50304);
  EXPECT_EQ(small.head_dim, 64);
  EXPECT_EQ(ParameterCount(small), 124439808);  // transformers' GPT2LMHeadModel, tied head counted once
  const ModelConfig medium = PresetConfig("gpt2-350M").value();
  EXPECT_EQ(medium.n_layers, 24);
  EXPECT_EQ(medium.d_model, 1024);
  EXPECT_EQ(medium.n_heads, 16);
  EXPECT_EQ(ParameterCount(medium), 354823168);
  EXPECT_TRUE(PresetConfig("gpt2-tiny").ok());
}

TEST(Gpt2Model, ForwardHasTheGpt2Layers) {
  const ModelConfig config = PresetConfig("gpt2-tiny").value();
  auto m = BuildGpt2Module(config, {.batch = 2, .seq_len = 16});
  ASSERT_TRUE(m.ok()) << m.status();
  const Function& f = *(*m)->FindFunction("forward");
  EXPECT_EQ(CountOps(f, Opcode::kLayerNorm), 2 * config.n_layers + 1);
  EXPECT_EQ(CountOps(f, Opcode::kGelu), config.n_layers);
  EXPECT_EQ(CountOps(f, Opcode::kRmsNorm), 0);
  EXPECT_EQ(CountOps(f, Opcode::kRope), 0);
  EXPECT_EQ(CountOps(f, Opcode::kGather), 2);  // wte and wpe
  EXPECT_EQ(f.parameters().size(), 2 + Gpt2Weights(config).size());
  // Too long a sequence for the position table.
  EXPECT_FALSE(BuildGpt2Module(config, {.batch = 1, .seq_len = config.max_positions + 1}).ok());
}

// Changing token t changes no logits before t (and does change those at t).
TEST(Gpt2Model, IsCausal) {
  const ModelConfig config = PresetConfig("gpt2-tiny").value();
  const int64_t seq = 12, changed = 7;
  auto m = BuildGpt2Module(config, {.batch = 1, .seq_len = seq, .precision = Precision::kFp32, .return_logits = true});
  ASSERT_TRUE(m.ok()) << m.status();
  const Function& f = *(*m)->FindFunction("forward");
  std::vector<HostTensor> args = Arguments(f, InitModelWeights(config, 7), 11, config.vocab_size);
  auto before = EvaluateFunction(f, args);
  ASSERT_TRUE(before.ok()) << before.status();
  args[0].mutable_values()[changed] = static_cast<double>((static_cast<int64_t>(args[0][changed]) + 1) % 256);
  auto after = EvaluateFunction(f, args);
  ASSERT_TRUE(after.ok()) << after.status();
  const HostTensor& a = (*before)[1];
  const HostTensor& b = (*after)[1];
  ASSERT_EQ(a.type().dims, (std::vector<int64_t>{1, seq, config.vocab_size}));
  const int64_t v = config.vocab_size;
  for (int64_t t = 0; t < seq; ++t) {
    bool same = true;
    for (int64_t i = 0; i < v; ++i) same = same && a[t * v + i] == b[t * v + i];
    EXPECT_EQ(same, t < changed) << "position " << t;
  }
}

double Loss(const ModelConfig& config, const std::vector<HostTensor>& weights) {
  auto m = BuildGpt2Module(config, {.batch = 2, .seq_len = 16, .precision = Precision::kFp32});
  EXPECT_TRUE(m.ok()) << m.status();
  const Function& f = *(*m)->FindFunction("forward");
  auto out = EvaluateFunction(f, Arguments(f, weights, 5, config.vocab_size));
  EXPECT_TRUE(out.ok()) << out.status();
  return (*out)[0][0];
}

// A vocabulary that pads (250 -> 256): the file holds 250 rows of wte, kiln 256.
ModelConfig PaddedTiny() {
  ModelConfig config = PresetConfig("gpt2-tiny").value();
  config.vocab_size = 250;
  return config;
}

TEST(Gpt2HuggingFace, ExportThenLoadGivesTheSameLoss) {
  const ModelConfig config = PaddedTiny();
  const std::vector<HostTensor> weights = InitModelWeights(config, 3);
  const std::string dir = FreshDir("round_trip");
  ASSERT_TRUE(ExportHuggingFaceModel(dir, config, weights).ok());

  Safetensors st = ReadSafetensorsFile(dir + "/model.safetensors").value();
  bool saw_wte = false;
  for (const NamedTensor& t : st.tensors) {
    EXPECT_EQ(t.name.rfind("transformer.", 0), 0u) << t.name << ": save_pretrained's names";
    if (t.name == "transformer.wte.weight") {
      saw_wte = true;
      EXPECT_EQ(t.tensor.type().dims, (std::vector<int64_t>{250, config.d_model}));
    }
    if (t.name == "transformer.h.0.mlp.c_fc.weight") {  // Conv1D: [in, out]
      EXPECT_EQ(t.tensor.type().dims, (std::vector<int64_t>{config.d_model, 4 * config.d_model}));
    }
  }
  EXPECT_TRUE(saw_wte);

  auto loaded = LoadHuggingFaceModel(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->config.family, ModelFamily::kGpt2);
  EXPECT_EQ(loaded->config.vocab_size, 250);
  EXPECT_EQ(loaded->config.n_layers, config.n_layers);
  EXPECT_EQ(loaded->config.max_positions, config.max_positions);
  ASSERT_EQ(loaded->weights.size(), weights.size());
  for (size_t i = 0; i < weights.size(); ++i) EXPECT_EQ(loaded->weights[i].values(), weights[i].values()) << i;
  EXPECT_EQ(Loss(loaded->config, loaded->weights), Loss(config, weights));
}

// The original upload (openai-community/gpt2): names without "transformer.", each block's
// causal-mask buffers (attn.bias, attn.masked_bias), and a copy of wte as lm_head.weight.
TEST(Gpt2HuggingFace, LoadsTheOriginalUploadsNames) {
  const ModelConfig config = PaddedTiny();
  const std::vector<HostTensor> weights = InitModelWeights(config, 4);
  const std::string dir = FreshDir("original");
  ASSERT_TRUE(ExportHuggingFaceModel(dir, config, weights).ok());
  Safetensors st = ReadSafetensorsFile(dir + "/model.safetensors").value();
  HostTensor wte;
  for (NamedTensor& t : st.tensors) {
    t.name = t.name.substr(std::string("transformer.").size());
    if (t.name == "wte.weight") wte = t.tensor;
  }
  st.tensors.push_back({"lm_head.weight", wte});
  for (int64_t i = 0; i < config.n_layers; ++i) {
    const int64_t n = config.max_positions;
    st.tensors.push_back({absl::StrCat("h.", i, ".attn.bias"), HostTensor::Random({DType::kF32, {1, 1, n, n}}, 1)});
    st.tensors.push_back({absl::StrCat("h.", i, ".attn.masked_bias"), HostTensor::Random({DType::kF32, {}}, 2)});
  }
  ASSERT_TRUE(WriteSafetensorsFile(dir + "/model.safetensors", st).ok());
  auto loaded = LoadHuggingFaceModel(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  for (size_t i = 0; i < weights.size(); ++i) EXPECT_EQ(loaded->weights[i].values(), weights[i].values()) << i;

  // An lm_head.weight that is not wte is refused: the head is tied.
  for (NamedTensor& t : st.tensors) {
    if (t.name == "lm_head.weight") t.tensor.mutable_values()[0] += 1;
  }
  ASSERT_TRUE(WriteSafetensorsFile(dir + "/model.safetensors", st).ok());
  EXPECT_FALSE(LoadHuggingFaceModel(dir).ok());
}

TEST(Gpt2HuggingFace, ConfigJsonRoundTrips) {
  const ModelConfig config = PresetConfig("gpt2-124M").value();
  const std::string json = HuggingFaceConfigJson(config);
  auto parsed = ConfigFromHuggingFaceJson(json, "config.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->family, ModelFamily::kGpt2);
  EXPECT_EQ(parsed->d_model, 768);
  EXPECT_EQ(parsed->n_heads, 12);
  EXPECT_EQ(parsed->head_dim, 64);
  EXPECT_EQ(parsed->d_ff, 3072);
  EXPECT_EQ(parsed->padded_vocab_size(), 50304);
  EXPECT_EQ(HuggingFaceConfigJson(*parsed), json);
  // transformers' own file leaves n_inner null and names the activation gelu_new.
  auto hf = ConfigFromHuggingFaceJson(R"({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
      "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": null, "n_positions": 1024, "n_ctx": 1024,
      "vocab_size": 50257, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05})",
                                      "gpt2/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(ParameterCount(*hf), 124439808);
}

}  // namespace
}  // namespace kiln
