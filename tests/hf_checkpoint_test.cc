#include "frontends/hf_checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "frontends/llama.h"
#include "ir/file_util.h"
#include "runtime/safetensors.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

std::string FreshDir(absl::string_view name) {
  const fs::path dir = fs::path(::testing::TempDir()) / absl::StrCat("hf_checkpoint_test_", name, "_", ::getpid());
  fs::remove_all(dir);
  return dir.string();
}

ModelConfig TinyConfig(bool tied = false) {
  ModelConfig config = PresetConfig("llama-tiny").value();
  config.tie_embeddings = tied;
  return config;
}

std::vector<HostTensor> RandomWeights(const ModelConfig& config, uint64_t seed = 1) {
  std::vector<HostTensor> weights;
  for (const WeightSpec& spec : LlamaWeights(config)) {
    weights.push_back(HostTensor::Random(TensorType{DType::kF32, spec.shape}, seed++, -0.5, 0.5));
  }
  return weights;
}

void ExpectSameConfig(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.d_model, b.d_model);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.d_ff, b.d_ff);
  EXPECT_EQ(a.rms_eps, b.rms_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.tie_embeddings, b.tie_embeddings);
  EXPECT_EQ(a.seq_len, b.seq_len);
}

void ExpectWeightsEqual(const std::vector<HostTensor>& expected, const std::vector<HostTensor>& actual,
                        const ModelConfig& config) {
  const std::vector<WeightSpec> specs = LlamaWeights(config);
  ASSERT_EQ(actual.size(), specs.size());
  ASSERT_EQ(expected.size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(actual[i].type(), (TensorType{DType::kF32, specs[i].shape})) << specs[i].name;
    EXPECT_EQ(actual[i].values(), expected[i].values()) << specs[i].name;
  }
}

// Exports `config` with random weights into a fresh folder, then edits its model.safetensors.
std::string ExportThenEdit(absl::string_view name, const ModelConfig& config,
                           const std::function<void(Safetensors&)>& edit) {
  const std::string dir = FreshDir(name);
  EXPECT_TRUE(ExportHuggingFaceModel(dir, config, RandomWeights(config)).ok());
  const std::string path = dir + "/model.safetensors";
  Safetensors st = ReadSafetensorsFile(path).value();
  edit(st);
  EXPECT_TRUE(WriteSafetensorsFile(path, st).ok());
  return dir;
}

void RemoveTensor(Safetensors& st, absl::string_view name) {
  std::erase_if(st.tensors, [&](const NamedTensor& t) { return t.name == name; });
}

HostTensor* FindTensor(Safetensors& st, absl::string_view name) {
  for (NamedTensor& t : st.tensors) {
    if (t.name == name) return &t.tensor;
  }
  return nullptr;
}

// The load fails with a message holding every one of `phrases`.
void ExpectLoadError(const std::string& dir, std::initializer_list<absl::string_view> phrases) {
  absl::StatusOr<HuggingFaceModel> model = LoadHuggingFaceModel(dir);
  ASSERT_FALSE(model.ok());
  for (absl::string_view phrase : phrases) {
    EXPECT_NE(model.status().message().find(phrase), std::string::npos) << model.status();
  }
}

TEST(HuggingFaceCheckpointTest, F32ExportLoadRoundTripIsExact) {
  const ModelConfig config = TinyConfig();
  const std::vector<HostTensor> weights = RandomWeights(config);
  const std::string dir = FreshDir("f32");
  ASSERT_TRUE(ExportHuggingFaceModel(dir, config, weights).ok());
  absl::StatusOr<HuggingFaceModel> model = LoadHuggingFaceModel(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  ExpectSameConfig(config, model->config);
  ExpectWeightsEqual(weights, model->weights, config);
  EXPECT_EQ(ReadSafetensorsFile(dir + "/model.safetensors")->metadata.at("format"), "pt");
}

TEST(HuggingFaceCheckpointTest, Bf16ExportStoresRoundedWeights) {
  const ModelConfig config = TinyConfig();
  const std::vector<HostTensor> weights = RandomWeights(config);
  const std::string dir = FreshDir("bf16");
  ASSERT_TRUE(ExportHuggingFaceModel(dir, config, weights, DType::kBF16).ok());

  Safetensors file = ReadSafetensorsFile(dir + "/model.safetensors").value();
  for (const NamedTensor& t : file.tensors) EXPECT_EQ(t.tensor.type().dtype, DType::kBF16) << t.name;
  const nlohmann::json json = nlohmann::json::parse(ReadFileToString(dir + "/config.json").value());
  EXPECT_EQ(json["torch_dtype"], "bfloat16");

  std::vector<HostTensor> rounded;
  for (const HostTensor& w : weights) {
    rounded.push_back(HostTensor::FromValues(TensorType{DType::kBF16, w.type().dims}, w.values()));
    ASSERT_NE(rounded.back().values(), w.values()) << "random f32 weights should lose bits in bf16";
  }
  absl::StatusOr<HuggingFaceModel> model = LoadHuggingFaceModel(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  ExpectWeightsEqual(rounded, model->weights, config);
}

TEST(HuggingFaceCheckpointTest, ConfigJsonIsWhatTransformersReads) {
  ModelConfig config = PresetConfig("llama-S").value();
  const nlohmann::json json = nlohmann::json::parse(HuggingFaceConfigJson(config));
  EXPECT_EQ(json["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(json["model_type"], "llama");
  EXPECT_EQ(json["hidden_act"], "silu");
  EXPECT_EQ(json["torch_dtype"], "float32");
  EXPECT_EQ(json["hidden_size"], 768);
  EXPECT_EQ(json["intermediate_size"], 2048);
  EXPECT_EQ(json["num_hidden_layers"], 16);
  EXPECT_EQ(json["num_attention_heads"], 12);
  EXPECT_EQ(json["num_key_value_heads"], 4);
  EXPECT_EQ(json["head_dim"], 64);
  EXPECT_EQ(json["vocab_size"], 32000);
  EXPECT_EQ(json["rms_norm_eps"], 1e-5);
  EXPECT_EQ(json["rope_theta"], 10000.0);
  EXPECT_EQ(json["tie_word_embeddings"], false);
  EXPECT_EQ(json["max_position_embeddings"], 1024);
}

TEST(HuggingFaceCheckpointTest, TiedModelHasNoHeadInTheFile) {
  const ModelConfig config = TinyConfig(/*tied=*/true);
  const std::vector<HostTensor> weights = RandomWeights(config);
  const std::string dir = FreshDir("tied");
  ASSERT_TRUE(ExportHuggingFaceModel(dir, config, weights).ok());
  Safetensors file = ReadSafetensorsFile(dir + "/model.safetensors").value();
  EXPECT_EQ(FindTensor(file, "lm_head.weight"), nullptr);
  absl::StatusOr<HuggingFaceModel> model = LoadHuggingFaceModel(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE(model->config.tie_embeddings);
  ExpectWeightsEqual(weights, model->weights, config);
}

TEST(HuggingFaceCheckpointTest, TiedModelAcceptsOnlyAHeadEqualToTheEmbedding) {
  const ModelConfig config = TinyConfig(/*tied=*/true);
  auto add_head = [](bool perturb) {
    return [perturb](Safetensors& st) {
      HostTensor head = *FindTensor(st, "model.embed_tokens.weight");
      if (perturb) head.mutable_values()[5] += 1.0;
      st.tensors.push_back({"lm_head.weight", head});
    };
  };
  absl::StatusOr<HuggingFaceModel> copy = LoadHuggingFaceModel(ExportThenEdit("tied_copy", config, add_head(false)));
  EXPECT_TRUE(copy.ok()) << copy.status();
  ExpectLoadError(ExportThenEdit("tied_differs", config, add_head(true)),
                  {"lm_head.weight differs from model.embed_tokens.weight", "tie_word_embeddings"});
}

TEST(HuggingFaceCheckpointTest, RotaryBuffersAreIgnored) {
  const std::string dir = ExportThenEdit("inv_freq", TinyConfig(), [](Safetensors& st) {
    st.tensors.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", HostTensor(TensorType{DType::kF32, {16}})});
  });
  absl::StatusOr<HuggingFaceModel> model = LoadHuggingFaceModel(dir);
  EXPECT_TRUE(model.ok()) << model.status();
}

TEST(HuggingFaceCheckpointTest, LoadsShardedCheckpoints) {
  const ModelConfig config = TinyConfig();
  const std::vector<HostTensor> weights = RandomWeights(config);
  const std::string dir = FreshDir("sharded");
  ASSERT_TRUE(ExportHuggingFaceModel(dir, config, weights, DType::kBF16).ok());
  // Split the exported file in two shards, the bf16 file being what real checkpoints hold.
  const Safetensors whole = ReadSafetensorsFile(dir + "/model.safetensors").value();
  fs::remove(dir + "/model.safetensors");
  Safetensors shards[2];
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  for (size_t i = 0; i < whole.tensors.size(); ++i) {
    const int shard = i < whole.tensors.size() / 2 ? 0 : 1;
    shards[shard].tensors.push_back(whole.tensors[i]);
    index["weight_map"][whole.tensors[i].name] = absl::StrCat("model-0000", shard + 1, "-of-00002.safetensors");
  }
  for (int shard = 0; shard < 2; ++shard) {
    ASSERT_TRUE(
        WriteSafetensorsFile(absl::StrCat(dir, "/model-0000", shard + 1, "-of-00002.safetensors"), shards[shard]).ok());
  }
  ASSERT_TRUE(WriteFileAtomically(dir + "/model.safetensors.index.json", index.dump()).ok());

  absl::StatusOr<HuggingFaceModel> model = LoadHuggingFaceModel(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<HostTensor> rounded;
  for (const HostTensor& w : weights) {
    rounded.push_back(HostTensor::FromValues(TensorType{DType::kBF16, w.type().dims}, w.values()));
  }
  ExpectWeightsEqual(rounded, model->weights, config);

  // An index that disagrees with its shards, or points outside the folder, is refused.
  nlohmann::json wrong = index;
  wrong["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";
  ASSERT_TRUE(WriteFileAtomically(dir + "/model.safetensors.index.json", wrong.dump()).ok());
  ExpectLoadError(dir, {"model-00002-of-00002.safetensors: holds tensor 'model.norm.weight'",
                        "places in model-00001-of-00002.safetensors"});
  wrong = index;
  wrong["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors";
  ASSERT_TRUE(WriteFileAtomically(dir + "/model.safetensors.index.json", wrong.dump()).ok());
  ExpectLoadError(dir, {"weight_map entry for 'model.norm.weight'", "expected a file name in the same folder"});
}

TEST(HuggingFaceCheckpointTest, MissingFilesAreNamed) {
  const std::string dir = FreshDir("missing_files");
  fs::create_directories(dir);
  ExpectLoadError(dir, {dir + "/config.json"});
  ASSERT_TRUE(WriteFileAtomically(dir + "/config.json", HuggingFaceConfigJson(TinyConfig())).ok());
  ExpectLoadError(dir, {dir + "/model.safetensors", "model.safetensors.index.json"});
}

TEST(HuggingFaceCheckpointTest, MissingWeightIsNamed) {
  const std::string dir = ExportThenEdit("missing_weight", TinyConfig(), [](Safetensors& st) {
    RemoveTensor(st, "model.layers.1.mlp.up_proj.weight");
  });
  ExpectLoadError(dir, {"missing weight 'model.layers.1.mlp.up_proj.weight' of shape [384,128]"});
  const std::string no_head =
      ExportThenEdit("missing_head", TinyConfig(), [](Safetensors& st) { RemoveTensor(st, "lm_head.weight"); });
  ExpectLoadError(no_head, {"missing weight 'lm_head.weight'", "tie_word_embeddings"});
}

TEST(HuggingFaceCheckpointTest, ExtraWeightIsNamed) {
  const std::string dir = ExportThenEdit("extra_weight", TinyConfig(), [](Safetensors& st) {
    st.tensors.push_back({"model.layers.2.mlp.up_proj.weight", HostTensor(TensorType{DType::kF32, {384, 128}})});
  });
  ExpectLoadError(dir, {"unexpected tensor 'model.layers.2.mlp.up_proj.weight'"});
}

TEST(HuggingFaceCheckpointTest, MisshapedWeightIsNamed) {
  const std::string dir = ExportThenEdit("misshaped", TinyConfig(), [](Safetensors& st) {
    *FindTensor(st, "model.layers.0.self_attn.k_proj.weight") = HostTensor(TensorType{DType::kF32, {128, 64}});
  });
  ExpectLoadError(dir, {"weight 'model.layers.0.self_attn.k_proj.weight' is f32[128,64]", "shape [64,128]"});
  ExpectLoadError(ExportThenEdit("integer_weight", TinyConfig(), [](Safetensors& st) {
                    *FindTensor(st, "model.norm.weight") = HostTensor(TensorType{DType::kI32, {128}});
                  }),
                  {"weight 'model.norm.weight' is i32[128], expected a float tensor"});
}

TEST(HuggingFaceCheckpointTest, ExportRejectsBadArguments) {
  const ModelConfig config = TinyConfig();
  std::vector<HostTensor> weights = RandomWeights(config);
  const std::string dir = FreshDir("bad_export");
  EXPECT_NE(ExportHuggingFaceModel(dir, config, weights, DType::kF16).message().find("f32 or bf16"),
            std::string::npos);
  EXPECT_NE(ExportHuggingFaceModel(dir, config, absl::MakeConstSpan(weights).subspan(1)).message().find(
                absl::StrCat("got ", weights.size() - 1, " weights")),
            std::string::npos);
  weights[1] = HostTensor(TensorType{DType::kF32, {7}});
  EXPECT_NE(ExportHuggingFaceModel(dir, config, weights).message().find(
                "'model.layers.0.input_layernorm.weight' is f32[7]"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir)) << "a refused export should write nothing";
}

}  // namespace
}  // namespace kiln
