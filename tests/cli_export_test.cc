// `kiln export-inputs`, run as the benchmark runs it: the files it writes are what
// `kiln train` starts from and feeds. Checked against `kiln train` itself: with --lr 0 the
// checkpoint after training holds the initial weights unchanged, and the loss `kiln train`
// prints at step n is the loss of the exported weights on exported batch n.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "frontends/hf_checkpoint.h"
#include "frontends/llama.h"
#include "frontends/model_config.h"
#include "frontends/training_checkpoint.h"
#include "ir/file_util.h"
#include "ir/reference_backend.h"
#include "runtime/training/dataset.h"
#include "tests/testing/run_command.h"

namespace kiln {
namespace {

using ::kiln::testing::Kiln;
using ::kiln::testing::RunCommand;

class CliExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("kiln_cli_export_", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

// int32 little-endian, as batches.bin holds them.
std::vector<int32_t> DecodeInt32(const std::string& bytes) {
  std::vector<int32_t> out(bytes.size() / 4);
  for (size_t i = 0; i < out.size(); ++i) {
    uint32_t v = 0;
    for (int b = 3; b >= 0; --b) v = (v << 8) | static_cast<unsigned char>(bytes[4 * i + b]);
    out[i] = static_cast<int32_t>(v);
  }
  return out;
}

TEST_F(CliExportTest, WritesWhatKilnTrainStartsFromAndFeeds) {
  constexpr int64_t kSteps = 3, kBatch = 2, kSeq = 16, kRow = kSeq + 1;
  const std::string shape = absl::StrCat(" --batch ", kBatch, " --seq ", kSeq, " --steps ", kSteps, " --seed 7");
  auto exported = RunCommand(Kiln() + " export-inputs llama-tiny" + shape + " --out " + Path("inputs"));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  for (const char* file : {"model.safetensors", "config.json", "batches.bin", "inputs.json"}) {
    EXPECT_TRUE(std::filesystem::is_regular_file(dir_ / "inputs" / file)) << file;
  }

  // inputs.json: shapes, the schedule (3 steps: warmup 1, then cosine from 3e-3 to 3e-4), counts.
  absl::StatusOr<std::string> json_text = ReadFileToString(Path("inputs/inputs.json"));
  ASSERT_TRUE(json_text.ok()) << json_text.status();
  const nlohmann::json json = nlohmann::json::parse(*json_text);
  EXPECT_EQ(json["batches"]["shape"], nlohmann::json({kSteps, kBatch, kRow}));
  EXPECT_EQ(json["batches"]["dtype"], "int32");
  EXPECT_EQ(json["seed"], 7);
  ASSERT_EQ(json["lr"].size(), 3u);
  EXPECT_DOUBLE_EQ(json["lr"][0].get<double>(), 3e-3);
  EXPECT_DOUBLE_EQ(json["lr"][1].get<double>(), 3e-3);
  EXPECT_DOUBLE_EQ(json["lr"][2].get<double>(), 3e-4);
  EXPECT_EQ(json["adamw"]["beta2"], 0.95);
  const ModelConfig config = *PresetConfig("llama-tiny");
  EXPECT_EQ(json["params"], ParameterCount(config));
  EXPECT_EQ(json["non_embedding_params"], NonEmbeddingParameterCount(config));
  EXPECT_EQ(json["flops_per_token"],
            6 * NonEmbeddingParameterCount(config) + 12 * config.n_layers * kSeq * config.d_model);

  // batches.bin: [steps, batch, seq+1] int32, every row a run of the built-in corpus.
  absl::StatusOr<std::string> batch_bytes = ReadFileToString(Path("inputs/batches.bin"));
  ASSERT_TRUE(batch_bytes.ok()) << batch_bytes.status();
  ASSERT_EQ(batch_bytes->size(), static_cast<size_t>(kSteps * kBatch * kRow * 4));
  const std::vector<int32_t> rows = DecodeInt32(*batch_bytes);
  const TokenDataset dataset = TokenDataset::Default();
  const std::vector<uint16_t> corpus = dataset.ToVector();
  for (int64_t r = 0; r < kSteps * kBatch; ++r) {
    const std::vector<uint16_t> row(rows.begin() + r * kRow, rows.begin() + (r + 1) * kRow);
    EXPECT_NE(std::search(corpus.begin(), corpus.end(), row.begin(), row.end()), corpus.end()) << "row " << r;
  }

  // kiln train with --lr 0 on the same seed and shape: its checkpoint holds the initial
  // weights unchanged, bit for bit the exported ones.
  auto train = RunCommand(Kiln() + " train llama-tiny --backend cpu --lr 0" + shape + " --save " + Path("ck.st"));
  ASSERT_EQ(train.exit_code, 0) << train.output;
  absl::StatusOr<TrainingCheckpoint> ckpt = LoadTrainingCheckpoint(Path("ck.st"));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  absl::StatusOr<HuggingFaceModel> hf = LoadHuggingFaceModel(Path("inputs"));
  ASSERT_TRUE(hf.ok()) << hf.status();
  ASSERT_EQ(hf->weights.size(), ckpt->state.params.size());
  const std::vector<WeightSpec> specs = LlamaWeights(config);
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(hf->weights[i].type(), ckpt->state.params[i].type()) << specs[i].name;
    EXPECT_TRUE(hf->weights[i].values() == ckpt->state.params[i].values()) << specs[i].name;
  }

  // The loss kiln train printed at step n is the exported weights' loss on exported batch n
  // (printed to 4 decimals).
  std::vector<double> printed;
  for (absl::string_view line : absl::StrSplit(train.output, '\n')) {
    std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    double loss = 0;
    if (words.size() >= 4 && words[0] == "step" && words[2] == "loss" && absl::SimpleAtod(words[3], &loss)) {
      printed.push_back(loss);
    }
  }
  ASSERT_EQ(printed.size(), static_cast<size_t>(kSteps)) << train.output;
  absl::StatusOr<std::unique_ptr<Module>> module =
      BuildLlamaModule(config, {.batch = kBatch, .seq_len = kSeq, .precision = Precision::kBf16});
  ASSERT_TRUE(module.ok()) << module.status();
  for (int64_t step = 0; step < kSteps; ++step) {
    std::vector<double> inputs, targets;
    for (int64_t b = 0; b < kBatch; ++b) {
      const int32_t* row = &rows[(step * kBatch + b) * kRow];
      inputs.insert(inputs.end(), row, row + kSeq);
      targets.insert(targets.end(), row + 1, row + kRow);
    }
    std::vector<HostTensor> args = {HostTensor::FromValues({DType::kI32, {kBatch, kSeq}}, inputs),
                                    HostTensor::FromValues({DType::kI32, {kBatch, kSeq}}, targets)};
    args.insert(args.end(), hf->weights.begin(), hf->weights.end());
    absl::StatusOr<std::vector<HostTensor>> out = EvaluateFunction(*(*module)->FindFunction("forward"), args);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_NEAR((*out)[0][0], printed[step], 6e-5) << "step " << step + 1;
  }

  // A different seed gives different weights and batches.
  auto other = RunCommand(Kiln() + " export-inputs llama-tiny --batch 2 --seq 16 --steps 3 --seed 8 --out " +
                          Path("other"));
  ASSERT_EQ(other.exit_code, 0) << other.output;
  EXPECT_NE(*ReadFileToString(Path("other/batches.bin")), *batch_bytes);
  EXPECT_NE(*ReadFileToString(Path("other/model.safetensors")), *ReadFileToString(Path("inputs/model.safetensors")));
}

TEST_F(CliExportTest, BadInputsAreClearErrors) {
  auto help = RunCommand(Kiln() + " export-inputs --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(help.output, "usage: kiln export-inputs")) << help.output;
  auto listed = RunCommand(Kiln() + " --help");
  EXPECT_TRUE(absl::StrContains(listed.output, "export-inputs")) << listed.output;

  auto unknown = RunCommand(Kiln() + " export-inputs llama-XL --out " + Path("x"));
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(unknown.output, "unknown model 'llama-XL'")) << unknown.output;
  EXPECT_FALSE(std::filesystem::exists(Path("x")));

  auto no_out = RunCommand(Kiln() + " export-inputs llama-tiny");
  EXPECT_EQ(no_out.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(no_out.output, "--out DIR is required")) << no_out.output;

  // A folder that cannot be made: its parent is a file (unwritable even for root).
  ASSERT_TRUE(WriteFileAtomically(Path("file"), "not a folder").ok());
  auto blocked = RunCommand(Kiln() + " export-inputs llama-tiny --steps 1 --out " + Path("file/sub"));
  EXPECT_EQ(blocked.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(blocked.output, "kiln export-inputs: cannot create the --out folder")) << blocked.output;
  EXPECT_TRUE(absl::StrContains(blocked.output, Path("file/sub"))) << blocked.output;
  auto is_file = RunCommand(Kiln() + " export-inputs llama-tiny --steps 1 --out " + Path("file"));
  EXPECT_EQ(is_file.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(is_file.output, "cannot create the --out folder")) << is_file.output;

  auto zero_steps = RunCommand(Kiln() + " export-inputs llama-tiny --steps 0 --out " + Path("y"));
  EXPECT_EQ(zero_steps.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(zero_steps.output, "--steps must be >= 1")) << zero_steps.output;
  auto bad_steps = RunCommand(Kiln() + " export-inputs llama-tiny --steps many --out " + Path("y"));
  EXPECT_EQ(bad_steps.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(bad_steps.output, "--steps expects an integer, got 'many'")) << bad_steps.output;
  auto missing_data = RunCommand(Kiln() + " export-inputs llama-tiny --data " + Path("missing.txt") + " --out " +
                                 Path("y"));
  EXPECT_EQ(missing_data.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(missing_data.output, "missing.txt")) << missing_data.output;
}

}  // namespace
}  // namespace kiln
