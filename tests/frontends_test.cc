// The tensor API (ops, sticky errors with the caller's line, scopes), the model presets and
// the Hugging Face config.json import.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "frontends/llama.h"
#include "frontends/model_config.h"
#include "frontends/nn.h"
#include "frontends/tensor.h"
#include "ir/verifier.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// "frontends_test.cc:<line>", as FormatLocation prints this file's lines.
std::string HereAt(int line) { return absl::StrCat("frontends_test.cc:", line); }

TEST(TensorApi, OpsReadLikeMathAndBuildTypedNodes) {
  Module m("m");
  Graph g(m.AddFunction("f"));
  Tensor x = g.Parameter("x", {DType::kF32, {8, 16}});
  Tensor w = g.Parameter("w", {DType::kF32, {16, 4}});
  Tensor bias = g.Parameter("bias", {DType::kF32, {4}});
  Tensor y = Softmax(Matmul(x, w) * 0.25 + BroadcastRow(bias, {8, 4}));
  Tensor z = 1.0 - Sigmoid(-y);
  ASSERT_TRUE(g.Finish({z}).ok()) << g.status();
  EXPECT_EQ(z.type().ToString(), "f32[8,4]");
  EXPECT_EQ(z.node()->opcode(), Opcode::kSub);
  // The scalar is a rank-0 constant broadcast to the other side's shape.
  Node* one = z.node()->operand(0);
  ASSERT_EQ(one->opcode(), Opcode::kBroadcast);
  EXPECT_EQ(one->operand(0)->opcode(), Opcode::kConstant);
  EXPECT_EQ(one->operand(0)->type().ToString(), "f32[]");
  EXPECT_TRUE(VerifyModule(m).ok()) << VerifyModule(m);
}

TEST(TensorApi, BatchedMatmulAndBroadcastHelpers) {
  Module m("m");
  Graph g(m.AddFunction("f"));
  Tensor a = g.Parameter("a", {DType::kF32, {2, 3, 5, 7}});
  Tensor b = g.Parameter("b", {DType::kF32, {2, 3, 7, 4}});
  Tensor c = Matmul(a, b, DType::kF32);
  EXPECT_EQ(c.type().ToString(), "f32[2,3,5,4]");
  Tensor s = BroadcastScalar(g.Scalar(2.0), {2, 3});
  EXPECT_EQ(s.type().ToString(), "f32[2,3]");
  EXPECT_EQ(Convert(s, DType::kBF16).type().ToString(), "bf16[2,3]");
  EXPECT_EQ(Convert(s, DType::kF32).node(), s.node()) << "a convert to the same dtype adds no node";
  EXPECT_TRUE(g.ok()) << g.status();
}

TEST(TensorApi, ErrorNamesOpShapesAndTheCallersLine) {
  Module m("m");
  Graph g(m.AddFunction("f"));
  Tensor x = g.Parameter("x", {DType::kF32, {2, 3}});
  Tensor y = g.Parameter("y", {DType::kF32, {3, 2}});
  const int line = __LINE__ + 1;
  Tensor z = x + y;
  EXPECT_FALSE(z.ok());
  EXPECT_FALSE(g.ok());
  EXPECT_THAT(Message(g.status()), HasSubstr("add(f32[2,3], f32[3,2])"));
  EXPECT_THAT(Message(g.status()), HasSubstr(HereAt(line)));
}

TEST(TensorApi, ErrorsAreStickyAndLaterOpsAddNothing) {
  Module m("m");
  Graph g(m.AddFunction("f"));
  Tensor x = g.Parameter("x", {DType::kF32, {2, 3}});
  Tensor w = g.Parameter("w", {DType::kF32, {4, 5}});
  const int line = __LINE__ + 1;
  Tensor bad = Matmul(x, w);
  const absl::Status first = g.status();
  ASSERT_FALSE(first.ok());
  EXPECT_THAT(Message(first), HasSubstr("dot_general(f32[2,3], f32[4,5])"));
  EXPECT_THAT(Message(first), HasSubstr(HereAt(line)));

  const int64_t nodes = g.function()->num_nodes();
  Tensor later = Softmax(Exp(bad) * 2.0 + bad);
  Tensor unrelated = x * 3.0;  // fine on its own, but the graph has failed
  Tensor reshaped = Reshape(later, {later.dim(0), later.dim(-1)});
  EXPECT_FALSE(later.ok());
  EXPECT_FALSE(unrelated.ok());
  EXPECT_FALSE(reshaped.ok());
  EXPECT_EQ(later.type().ToString(), "f32[]") << "a failed tensor has a harmless type";
  EXPECT_EQ(g.function()->num_nodes(), nodes);
  EXPECT_EQ(g.status(), first);
  EXPECT_EQ(g.Finish({later}), first);
}

TEST(TensorApi, LayerErrorPointsAtTheLayersCaller) {
  Module m("m");
  Graph g(m.AddFunction("f"));
  Tensor x = g.Parameter("x", {DType::kF32, {2, 8}});
  Tensor w = g.Parameter("w", {DType::kF32, {4, 6}});  // [out, in] with in != 8
  const int line = __LINE__ + 1;
  Tensor y = Linear(x, w, DType::kBF16);
  EXPECT_FALSE(y.ok());
  EXPECT_THAT(Message(g.status()), HasSubstr(HereAt(line)));
  EXPECT_THAT(Message(g.status()), HasSubstr("contracting dims differ"));
}

TEST(TensorApi, EmptyTensorsAreErrorsNotCrashes) {
  Module m("m");
  Graph g(m.AddFunction("f"));
  Tensor x = g.Parameter("x", {DType::kF32, {2}});
  Tensor empty;
  EXPECT_EQ(empty.dim(0), 0);
  EXPECT_FALSE((empty + empty).ok());
  EXPECT_TRUE(g.ok()) << "ops on empty tensors alone have no graph to fail";
  const int line = __LINE__ + 1;
  Tensor y = x * empty;
  EXPECT_FALSE(y.ok());
  EXPECT_THAT(Message(g.status()), HasSubstr("operand 1 is an empty Tensor"));
  EXPECT_THAT(Message(g.status()), HasSubstr(HereAt(line)));

  Module m2("m2");
  Graph g2(m2.AddFunction("f"));
  absl::Status finished = g2.Finish({Tensor()});
  EXPECT_THAT(Message(finished), HasSubstr("output 0 is an empty Tensor"));
}

TEST(TensorApi, TensorsOfAnotherGraphAreRejected) {
  Module m("m");
  Graph g1(m.AddFunction("f1"));
  Graph g2(m.AddFunction("f2"));
  Tensor a = g1.Parameter("a", {DType::kF32, {2}});
  Tensor b = g2.Parameter("b", {DType::kF32, {2}});
  EXPECT_FALSE((a + b).ok());
  EXPECT_THAT(Message(g1.status()), HasSubstr("belongs to another Graph"));
}

TEST(TensorApi, ScopesNestAndRestore) {
  Module m("m");
  Graph g(m.AddFunction("f"));
  Tensor x = g.Parameter("x", {DType::kF32, {2}});
  Tensor inner, middle;
  {
    ScopeGuard layer(g, "layers.3");
    {
      ScopeGuard attn(g, "attn");
      inner = Exp(x);
    }
    middle = Exp(inner);
  }
  Tensor outer = Exp(middle);
  Tensor via_helper = InScope(g, "mlp", [&] { return Exp(outer); });
  EXPECT_EQ(x.node()->scope(), "");
  EXPECT_EQ(inner.node()->scope(), "layers.3.attn");
  EXPECT_EQ(middle.node()->scope(), "layers.3");
  EXPECT_EQ(outer.node()->scope(), "");
  EXPECT_EQ(via_helper.node()->scope(), "mlp");
  EXPECT_EQ(g.builder().scope(), "");
}

TEST(TensorApi, FinishRejectsAnInvalidScopeName) {
  Module m("m");
  Graph g(m.AddFunction("f"));
  Tensor x = g.Parameter("x", {DType::kF32, {2}});
  Tensor y = InScope(g, "not a name", [&] { return Exp(x); });
  EXPECT_THAT(Message(g.Finish({y})), HasSubstr("scope must match"));
}

// --- presets -------------------------------------------------------------------------

TEST(Presets, HaveTheAgreedShapes) {
  EXPECT_EQ(PresetNames(), (std::vector<std::string>{"llama-tiny", "llama-S", "llama-M", "gpt2-tiny", "gpt2-124M",
                                                     "gpt2-350M"}));
  ModelConfig tiny = *PresetConfig("llama-tiny");
  EXPECT_EQ(tiny.vocab_size, 256);
  EXPECT_EQ(tiny.d_model, 128);
  EXPECT_EQ(tiny.n_layers, 2);
  EXPECT_EQ(tiny.n_heads, 4);
  EXPECT_EQ(tiny.n_kv_heads, 2);
  EXPECT_EQ(tiny.head_dim, 32);
  EXPECT_EQ(tiny.d_ff, 384);
  EXPECT_EQ(tiny.seq_len, 64);
  EXPECT_EQ(tiny.batch, 8);
  for (const std::string& name : PresetNames()) {
    ModelConfig c = *PresetConfig(name);
    EXPECT_EQ(c.name, name);
    EXPECT_EQ(c.tie_embeddings, c.family == ModelFamily::kGpt2) << name;  // GPT-2's head is wte
    EXPECT_EQ(c.rms_eps, 1e-5) << name;
    EXPECT_EQ(c.rope_theta, 10000.0) << name;
    EXPECT_TRUE(c.Validate().ok()) << c.Validate();
  }
  ModelConfig s = *PresetConfig("llama-S");
  EXPECT_EQ(std::vector<int64_t>({s.vocab_size, s.d_model, s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim, s.d_ff,
                                  s.seq_len, s.batch}),
            std::vector<int64_t>({32000, 768, 16, 12, 4, 64, 2048, 1024, 16}));
  ModelConfig mm = *PresetConfig("llama-M");
  EXPECT_EQ(std::vector<int64_t>({mm.vocab_size, mm.d_model, mm.n_layers, mm.n_heads, mm.n_kv_heads, mm.head_dim,
                                  mm.d_ff, mm.seq_len, mm.batch}),
            std::vector<int64_t>({32000, 2048, 16, 16, 8, 128, 5632, 2048, 4}));
}

TEST(Presets, ParameterCountsMatchDesign) {
  // DESIGN.md counts without the input embedding: S = 125M, M = 821M.
  EXPECT_EQ(NonEmbeddingParameterCount(*PresetConfig("llama-S")), 125'264'640);
  EXPECT_EQ(NonEmbeddingParameterCount(*PresetConfig("llama-M")), 820'578'304);
  EXPECT_EQ(std::lround(NonEmbeddingParameterCount(*PresetConfig("llama-S")) / 1e6), 125);
  EXPECT_EQ(std::lround(NonEmbeddingParameterCount(*PresetConfig("llama-M")) / 1e6), 821);
  EXPECT_EQ(ParameterCount(*PresetConfig("llama-S")), 125'264'640 + 32000 * 768);
  EXPECT_EQ(ParameterCount(*PresetConfig("llama-M")), 820'578'304 + 32000 * 2048);
  // tiny by hand: embed + 2 x (q,k,v,o + mlp + 2 norms) + final norm + head.
  const int64_t tiny_layer = 128 * 128 + 2 * 128 * 64 + 128 * 128 + 3 * 128 * 384 + 2 * 128;
  EXPECT_EQ(ParameterCount(*PresetConfig("llama-tiny")), 256 * 128 + 2 * tiny_layer + 128 + 256 * 128);
}

TEST(Presets, TiedEmbeddingsCountTheSharedMatrixOnce) {
  ModelConfig c = *PresetConfig("llama-tiny");
  const int64_t untied = ParameterCount(c);
  c.tie_embeddings = true;
  EXPECT_EQ(ParameterCount(c), untied - 256 * 128);
  EXPECT_EQ(NonEmbeddingParameterCount(c), ParameterCount(c));
}

TEST(Presets, UnknownNameListsThePresets) {
  absl::StatusOr<ModelConfig> c = PresetConfig("llama-XL");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(c.status()), HasSubstr("llama-tiny, llama-S, llama-M"));
  absl::StatusOr<ModelConfig> r = ResolveModelConfig("llama-XL");
  EXPECT_THAT(Message(r.status()), HasSubstr("unknown model 'llama-XL'"));
  EXPECT_THAT(Message(r.status()), HasSubstr("llama-tiny, llama-S, llama-M"));
  EXPECT_TRUE(ResolveModelConfig("llama-S").ok());
}

TEST(ModelConfigValidate, CatchesInconsistentSizes) {
  ModelConfig c = *PresetConfig("llama-tiny");
  c.n_kv_heads = 3;
  EXPECT_THAT(Message(c.Validate()), HasSubstr("n_heads (4) must be a multiple of n_kv_heads (3)"));
  c = *PresetConfig("llama-tiny");
  c.head_dim = 33;
  EXPECT_THAT(Message(c.Validate()), HasSubstr("head_dim (33) must be even"));
  c = *PresetConfig("llama-tiny");
  c.n_layers = 0;
  EXPECT_THAT(Message(c.Validate()), HasSubstr("n_layers is 0, must be > 0"));
  c = *PresetConfig("llama-tiny");
  c.rope_theta = -1;
  EXPECT_THAT(Message(c.Validate()), HasSubstr("rope_theta"));
  c = *PresetConfig("llama-tiny");
  c.vocab_size = int64_t{1} << 50;
  EXPECT_THAT(Message(c.Validate()), HasSubstr("too large"));
}

// --- Hugging Face config.json ----------------------------------------------------------

class HuggingFaceConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(::testing::TempDir()) / absl::StrCat("kiln_hf_", info->name(), "_", ::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes `json` as <dir>/<folder>/config.json and returns the file's path.
  std::string Write(const std::string& json, const std::string& folder = "model") {
    std::filesystem::create_directories(dir_ / folder);
    std::filesystem::path file = dir_ / folder / "config.json";
    std::ofstream(file) << json;
    return file.string();
  }

  absl::Status Rejection(const std::string& json) { return ConfigFromHuggingFace(Write(json)).status(); }

  std::filesystem::path dir_;
};

// Llama-2-7B's config.json (its published parameter count is 6,738,415,616).
constexpr char kLlama2_7B[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008,
  "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 32, "pretraining_tp": 1,
  "rms_norm_eps": 1e-05, "rope_scaling": null, "tie_word_embeddings": false,
  "torch_dtype": "float16", "transformers_version": "4.31.0.dev0", "use_cache": true,
  "vocab_size": 32000
})";

TEST_F(HuggingFaceConfig, ReadsALlamaConfig) {
  absl::StatusOr<ModelConfig> c = ConfigFromHuggingFace(Write(kLlama2_7B, "Llama-2-7b"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->name, "Llama-2-7b");
  EXPECT_EQ(c->d_model, 4096);
  EXPECT_EQ(c->d_ff, 11008);
  EXPECT_EQ(c->n_layers, 32);
  EXPECT_EQ(c->n_heads, 32);
  EXPECT_EQ(c->n_kv_heads, 32);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->vocab_size, 32000);
  EXPECT_EQ(c->rms_eps, 1e-5);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_FALSE(c->tie_embeddings);
  EXPECT_EQ(c->seq_len, 1024) << "min(max_position_embeddings, 1024)";
  EXPECT_EQ(ParameterCount(*c), 6'738'415'616);
}

TEST_F(HuggingFaceConfig, ReadsAFolderAndResolvesPathsAndFolders) {
  const std::string file = Write(kLlama2_7B, "llama 2 (7b)");
  const std::string folder = std::filesystem::path(file).parent_path().string();
  absl::StatusOr<ModelConfig> from_folder = ConfigFromHuggingFace(folder);
  ASSERT_TRUE(from_folder.ok()) << from_folder.status();
  EXPECT_EQ(from_folder->d_model, 4096);
  EXPECT_EQ(from_folder->name, "llama_2__7b_") << "names are made valid IR names";
  EXPECT_TRUE(IsValidName(from_folder->name));
  EXPECT_EQ(ResolveModelConfig(folder)->n_layers, 32);
  EXPECT_EQ(ResolveModelConfig(file)->n_layers, 32);
}

TEST_F(HuggingFaceConfig, GroupedQueryDefaults) {
  // No num_key_value_heads: one kv head per query head. No head_dim: hidden / heads.
  absl::StatusOr<ModelConfig> mha = ConfigFromHuggingFace(Write(R"({"model_type": "llama",
      "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
      "num_attention_heads": 8, "vocab_size": 1000, "max_position_embeddings": 512})"));
  ASSERT_TRUE(mha.ok()) << mha.status();
  EXPECT_EQ(mha->n_kv_heads, 8);
  EXPECT_EQ(mha->head_dim, 32);
  EXPECT_EQ(mha->seq_len, 512);
  EXPECT_EQ(mha->rms_eps, 1e-6) << "Hugging Face's LlamaConfig default";
  EXPECT_FALSE(mha->tie_embeddings);

  // Llama-3.2-1B style: GQA, explicit head_dim, tied, large context and theta.
  absl::StatusOr<ModelConfig> gqa = ConfigFromHuggingFace(Write(R"({"model_type": "llama",
      "architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 8192,
      "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
      "head_dim": 64, "vocab_size": 128256, "rope_theta": 500000.0, "tie_word_embeddings": true,
      "max_position_embeddings": 131072, "rms_norm_eps": 1e-05})",
                                                                  "gqa"));
  ASSERT_TRUE(gqa.ok()) << gqa.status();
  EXPECT_EQ(gqa->n_kv_heads, 8);
  EXPECT_EQ(gqa->head_dim, 64);
  EXPECT_EQ(gqa->rope_theta, 500000.0);
  EXPECT_TRUE(gqa->tie_embeddings);
  EXPECT_EQ(gqa->seq_len, 1024);
  EXPECT_TRUE(BuildLlamaModule(*gqa, {.batch = 1, .seq_len = 8}).ok());
}

TEST_F(HuggingFaceConfig, RejectsOtherModels) {
  EXPECT_THAT(Message(Rejection(R"({"model_type": "mistral", "hidden_size": 768})")),
              HasSubstr("model_type is \"mistral\"; kiln imports only \"llama\" and \"gpt2\" models"));
  EXPECT_THAT(Message(Rejection(R"({"model_type": "gpt2", "activation_function": "relu"})")),
              HasSubstr("activation_function \"relu\" is not supported"));
  EXPECT_THAT(Message(Rejection(R"({"model_type": "llama", "architectures": ["MistralForCausalLM"]})")),
              HasSubstr("\"MistralForCausalLM\" is not a Llama architecture"));
  EXPECT_THAT(Message(Rejection(R"({"hidden_size": 768})")), HasSubstr("missing field \"model_type\""));
  EXPECT_THAT(Message(Rejection(R"({"model_type": "llama", "rope_scaling": {"rope_type": "llama3"}})")),
              HasSubstr("rope_scaling {\"rope_type\":\"llama3\"} is not supported"));
  EXPECT_THAT(Message(Rejection(R"({"model_type": "llama", "hidden_act": "gelu"})")),
              HasSubstr("hidden_act \"gelu\" is not supported"));
  EXPECT_THAT(Message(Rejection(R"({"model_type": "llama", "attention_bias": true})")),
              HasSubstr("attention_bias = true is not supported"));
}

TEST_F(HuggingFaceConfig, RejectsMissingFieldsAndWrongTypes) {
  const std::string file = Write(R"({"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
      "num_attention_heads": 8, "vocab_size": 1000})");
  absl::Status missing = ConfigFromHuggingFace(file).status();
  EXPECT_THAT(Message(missing), HasSubstr(file + ": missing field \"num_hidden_layers\""));

  EXPECT_THAT(Message(Rejection(R"({"model_type": "llama", "hidden_size": "256"})")),
              HasSubstr("field \"hidden_size\" must be an integer, got string \"256\""));
  EXPECT_THAT(Message(Rejection(R"({"model_type": "llama", "hidden_size": 256.5})")),
              HasSubstr("field \"hidden_size\" must be an integer, got number 256.5"));
  const char* base = R"("model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
      "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 1000)";
  EXPECT_THAT(Message(Rejection(absl::StrCat("{", base, R"(, "tie_word_embeddings": "yes"})"))),
              HasSubstr("field \"tie_word_embeddings\" must be true or false, got string"));
  EXPECT_THAT(Message(Rejection(absl::StrCat("{", base, R"(, "rms_norm_eps": [1e-5]})"))),
              HasSubstr("field \"rms_norm_eps\" must be a number, got array"));
  EXPECT_THAT(Message(Rejection(R"(["model_type", "llama"])")), HasSubstr("expected a JSON object"));
}

TEST_F(HuggingFaceConfig, RejectsInconsistentSizes) {
  const char* base = R"("model_type": "llama", "intermediate_size": 512, "num_hidden_layers": 2,
      "vocab_size": 1000)";
  EXPECT_THAT(Message(Rejection(absl::StrCat(
                  "{", base, R"(, "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 3})"))),
              HasSubstr("n_heads (8) must be a multiple of n_kv_heads (3)"));
  EXPECT_THAT(Message(Rejection(absl::StrCat("{", base, R"(, "hidden_size": 250, "num_attention_heads": 8})"))),
              HasSubstr("hidden_size (250) is not a multiple of num_attention_heads (8)"));
  EXPECT_THAT(Message(Rejection(absl::StrCat("{", base, R"(, "hidden_size": 256, "num_attention_heads": 0})"))),
              HasSubstr("num_attention_heads is 0"));
}

TEST_F(HuggingFaceConfig, MalformedJsonGivesTheBytePosition) {
  const std::string text = R"({"model_type": "llama", "hidden_size": @})";
  absl::Status s = Rejection(text);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  // nlohmann counts bytes from 1, up to and including the offending one.
  EXPECT_THAT(Message(s), HasSubstr(absl::StrCat("malformed JSON at byte ", text.find('@') + 1)));
}

TEST_F(HuggingFaceConfig, MissingFileIsNotFound) {
  absl::Status s = ConfigFromHuggingFace((dir_ / "nowhere" / "config.json").string()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(s), HasSubstr("nowhere/config.json: no such file"));
  std::filesystem::create_directories(dir_ / "empty");
  absl::Status folder = ConfigFromHuggingFace((dir_ / "empty").string()).status();
  EXPECT_THAT(Message(folder), HasSubstr("empty/config.json: no such file"));
}

}  // namespace
}  // namespace kiln
