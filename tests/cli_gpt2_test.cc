// The GPT-2 presets through the kiln command line, on the CPU reference backend: they are
// listed, gpt2-tiny trains (the loss falls within 50 steps), a training checkpoint and an
// exported Hugging Face folder evaluate, and generation (Llama-only) says so.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/testing/run_command.h"

namespace kiln {
namespace {

using ::kiln::testing::Kiln;
using ::kiln::testing::RunCommand;

// The first 8 KiB of the built-in corpus, in `dir`: enough windows to score, quick to run.
std::string SmallCorpus(const std::filesystem::path& dir) {
  std::ifstream in(absl::StrCat(KILN_SOURCE_DIR, "/runtime/data/default_corpus.txt"), std::ios::binary);
  std::string text(8192, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  const std::string path = (dir / "corpus.txt").string();
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::vector<double> Losses(const std::string& output) {
  std::vector<double> losses;
  static const std::regex kStep(R"(step \d+/\d+\s+loss (\S+))");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), kStep); it != std::sregex_iterator(); ++it) {
    losses.push_back(std::stod((*it)[1]));
  }
  return losses;
}

// The value of kiln eval's "loss X" line, or -1.
double EvalLoss(const std::string& output) {
  std::smatch m;
  static const std::regex kLoss(R"(\nloss (\S+))");
  return std::regex_search(output, m, kLoss) ? std::stod(m[1]) : -1;
}

TEST(CliGpt2Test, ModelsListsThePresets) {
  auto models = RunCommand(Kiln() + " models");
  ASSERT_EQ(models.exit_code, 0) << models.output;
  for (const char* preset : {"gpt2-tiny", "gpt2-124M", "gpt2-350M"}) EXPECT_TRUE(absl::StrContains(models.output, preset));
  EXPECT_TRUE(absl::StrContains(models.output, "124.4M")) << models.output;
}

TEST(CliGpt2Test, TinyTrainsSavesAndEvaluates) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "kiln_cli_gpt2";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string ckpt = (dir / "ck.safetensors").string();
  const std::string corpus = SmallCorpus(dir);
  auto train = RunCommand(Kiln() + " train gpt2-tiny --steps 50 --backend cpu --save " + ckpt + " 2>&1");
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const std::vector<double> losses = Losses(train.output);
  ASSERT_EQ(losses.size(), 50u) << train.output;
  EXPECT_GT(losses.front(), 5.0);  // about ln 256
  EXPECT_LT(losses.back(), 3.6) << train.output;

  auto eval = RunCommand(Kiln() + " eval gpt2-tiny --weights " + ckpt + " --data " + corpus + " --backend cpu 2>&1");
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  EXPECT_GT(EvalLoss(eval.output), 2.0) << eval.output;
  EXPECT_LT(EvalLoss(eval.output), 3.8) << eval.output;

  const std::string folder = (dir / "hf").string();
  auto exported = RunCommand(Kiln() + " export-inputs gpt2-tiny --steps 1 --out " + folder + " 2>&1");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  auto hf_eval = RunCommand(Kiln() + " eval " + folder + " --data " + corpus + " --backend cpu 2>&1");
  ASSERT_EQ(hf_eval.exit_code, 0) << hf_eval.output;
  EXPECT_GT(EvalLoss(hf_eval.output), 5.0) << hf_eval.output;  // random init: about ln 256
  EXPECT_LT(EvalLoss(hf_eval.output), 6.0) << hf_eval.output;

  auto generate = RunCommand(Kiln() + " generate gpt2-tiny --prompt hi --backend cpu 2>&1");
  EXPECT_NE(generate.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(generate.output, "built for Llama models only")) << generate.output;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln
