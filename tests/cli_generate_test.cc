// kiln generate, run as a user runs it: bytes in and out for the presets, token ids for a
// Hugging Face folder, trained checkpoints, --prompts files, and clear errors for bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_split.h"
#include "frontends/hf_checkpoint.h"
#include "frontends/model_config.h"
#include "frontends/weight_init.h"
#include "ir/file_util.h"
#include "tests/testing/run_command.h"

namespace kiln {
namespace {

using ::kiln::testing::CommandResult;
using ::kiln::testing::Kiln;
using ::kiln::testing::RunCommand;

class CliGenerateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("kiln_generate_", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  // stdout only: the generated text.
  CommandResult Generate(const std::string& args) {
    return RunCommand(absl::StrCat("(", Kiln(), " generate ", args, " 2>", Path("stderr.txt"), ")"));
  }
  std::string Stderr() const { return *ReadFileToString(Path("stderr.txt")); }
  std::filesystem::path dir_;
};

TEST_F(CliGenerateTest, PresetGeneratesBytesAndReportsSpeeds) {
  CommandResult r = Generate("llama-tiny --prompt hello --max-new-tokens 8 --backend cpu --seed 3");
  ASSERT_EQ(r.exit_code, 0) << r.output << Stderr();
  EXPECT_TRUE(absl::StartsWith(r.output, "hello")) << r.output;
  const std::string err = Stderr();
  EXPECT_NE(err.find("llama-tiny, bf16, weights: random init (seed 1337"), std::string::npos) << err;
  EXPECT_NE(err.find("prefill 5 tokens in"), std::string::npos) << err;
  EXPECT_NE(err.find("decode 7 tokens in"), std::string::npos) << err;
  EXPECT_TRUE(std::regex_search(err, std::regex(R"(decode calls: median [0-9.]+ ms, min [0-9.]+, max [0-9.]+ \(7 calls\))")))
      << err;
  // The same seed, the same bytes; greedy too.
  EXPECT_EQ(Generate("llama-tiny --prompt hello --max-new-tokens 8 --seed 3").output, r.output);
  CommandResult greedy = Generate("llama-tiny --prompt hello --max-new-tokens 8 --temperature 0");
  ASSERT_EQ(greedy.exit_code, 0) << greedy.output << Stderr();
  EXPECT_EQ(Generate("llama-tiny --prompt hello --max-new-tokens 8 --temperature 0 --seed 9").output, greedy.output);
}

// --trace writes a decode call's launches where a GPU runs them; on the CPU it says there are
// none and writes nothing; a folder that does not exist is refused before any work.
TEST_F(CliGenerateTest, TraceOnTheCpuSaysThereAreNoLaunchesAndABadPathIsRefused) {
  CommandResult r = Generate(absl::StrCat("llama-tiny --prompt hello --max-new-tokens 4 --backend cpu --trace ",
                                          Path("trace.json")));
  ASSERT_EQ(r.exit_code, 0) << r.output << Stderr();
  EXPECT_NE(Stderr().find("--trace: no decode call was profiled (the CPU backend has no launches to time)"),
            std::string::npos)
      << Stderr();
  EXPECT_FALSE(std::filesystem::exists(Path("trace.json")));
  CommandResult bad = Generate("llama-tiny --prompt hello --max-new-tokens 4 --trace /nonexistent-dir/t.json");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(Stderr().find("--trace"), std::string::npos) << Stderr();
}

// --kv-memory sizes the pool: llama-tiny's bf16 block of 16 tokens is K and V of 2 layers x 2
// kv heads x 16 x 32 = 8 KiB, so 1M holds 128 blocks.
TEST_F(CliGenerateTest, KvMemorySizesThePool) {
  CommandResult r = Generate("llama-tiny --prompt hello --max-new-tokens 4 --kv-memory 1M");
  ASSERT_EQ(r.exit_code, 0) << r.output << Stderr();
  EXPECT_NE(Stderr().find("KV pool of 128 blocks of 16 tokens (1.0 MiB)"), std::string::npos) << Stderr();
}

TEST_F(CliGenerateTest, TrainedCheckpointsAndHuggingFaceFoldersLoad) {
  CommandResult train = RunCommand(absl::StrCat(Kiln(), " train llama-tiny --steps 2 --backend cpu --save ",
                                                Path("ck.safetensors"), " 2>&1"));
  ASSERT_EQ(train.exit_code, 0) << train.output;
  CommandResult r = Generate(absl::StrCat("llama-tiny --weights ", Path("ck.safetensors"),
                                          " --prompt hi --max-new-tokens 4 --temperature 0"));
  ASSERT_EQ(r.exit_code, 0) << r.output << Stderr();
  EXPECT_NE(Stderr().find("weights: checkpoint"), std::string::npos) << Stderr();
  EXPECT_TRUE(absl::StartsWith(r.output, "hi")) << r.output;

  // A Hugging Face folder (here exported from llama-tiny with a vocabulary of 300, so that it
  // is not byte-level): token ids in, token ids out.
  ModelConfig config = *PresetConfig("llama-tiny");
  config.name = "hf-tiny";
  config.vocab_size = 300;
  config.max_positions = 128;
  ASSERT_TRUE(ExportHuggingFaceModel(Path("hf"), config, InitLlamaWeights(config, 5)).ok());
  CommandResult hf = Generate(absl::StrCat(Path("hf"), " --prompt-tokens 1,2,299 --max-new-tokens 5 --temperature 0"));
  ASSERT_EQ(hf.exit_code, 0) << hf.output << Stderr();
  std::vector<std::string> ids = absl::StrSplit(absl::StripAsciiWhitespace(hf.output), ' ');
  EXPECT_EQ(ids.size(), 3u + 5u) << hf.output;
  EXPECT_EQ(ids[2], "299");
  CommandResult text = Generate(absl::StrCat(Path("hf"), " --prompt hello"));
  EXPECT_EQ(text.exit_code, 1);
  EXPECT_NE(Stderr().find("--prompt takes text only for the byte-level presets"), std::string::npos) << Stderr();
}

TEST_F(CliGenerateTest, PromptsFileRunsTogetherAndABadLineHarmsNoOther) {
  ASSERT_TRUE(WriteFileAtomically(Path("prompts.txt"), "hello\n\nthe cat\n").ok());
  CommandResult r = Generate(absl::StrCat("llama-tiny --prompts ", Path("prompts.txt"), " --max-new-tokens 6 --seed 4"));
  EXPECT_EQ(r.exit_code, 1) << r.output << Stderr();
  EXPECT_NE(Stderr().find("request 1: the prompt is empty (line 2 skipped)"), std::string::npos) << Stderr();
  EXPECT_NE(Stderr().find("1 of 3 requests were rejected"), std::string::npos) << Stderr();
  std::vector<std::string> lines = absl::StrSplit(r.output, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << r.output;
  // Each request's tokens are what it gets alone: batching and the bad line change nothing.
  CommandResult alone = Generate("llama-tiny --prompt hello --max-new-tokens 6 --seed 4");
  ASSERT_EQ(alone.exit_code, 0);
  ASSERT_TRUE(absl::EndsWith(alone.output, "\n"));
  const std::string alone_text = alone.output.substr(0, alone.output.size() - 1);
  // A request's line writes a newline byte as \n.
  EXPECT_EQ(lines[0], absl::StrCat("[0] ", absl::StrReplaceAll(alone_text, {{"\n", "\\n"}})));
  EXPECT_TRUE(absl::StartsWith(lines[1], "[2] the cat")) << lines[1];
}

// A .jsonl --prompts file: text or token ids a line, each with its own output budget; the
// summary line counts the workload, and --no-prefix-cache prefills the shared prefix again
// without changing a token.
TEST_F(CliGenerateTest, JsonlPromptsCarryTheirOwnBudgetsAndTheSummaryCountsThePrefixCache) {
  ASSERT_TRUE(WriteFileAtomically(Path("w.jsonl"), "{\"prompt\": \"the cat sat\", \"max_new_tokens\": 3}\n\n"
                                                   "{\"tokens\": [116, 104, 101, 32, 99, 97, 116, 32, 114, 97, 110], "
                                                   "\"max_new_tokens\": 7}\n")
                  .ok());
  const std::string common =
      absl::StrCat("llama-tiny --prompts ", Path("w.jsonl"), " --temperature 0 --block-size 4 --max-running 1");
  CommandResult r = Generate(common);
  ASSERT_EQ(r.exit_code, 0) << r.output << Stderr();
  std::vector<std::string> lines = absl::StrSplit(r.output, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << r.output;
  // Each line is its prompt and then what it generated (3 and 7 tokens: the summary counts them).
  EXPECT_TRUE(absl::StartsWith(lines[0], "[0] the cat sat")) << lines[0];
  EXPECT_TRUE(absl::StartsWith(lines[1], "[1] the cat ran")) << lines[1];
  const std::string err = Stderr();
  // Blocks of 4: "the cat " is two full blocks that the second request (run after the first:
  // --max-running 1) finds cached; 11 + 11 prompt tokens, 3 + 7 new.
  EXPECT_NE(err.find("kiln generate: 2 requests, 22 prompt tokens (8 from the prefix cache: 36.4%), 10 new tokens in "),
            std::string::npos)
      << err;
  CommandResult uncached = Generate(common + " --no-prefix-cache");
  ASSERT_EQ(uncached.exit_code, 0) << uncached.output << Stderr();
  EXPECT_EQ(uncached.output, r.output);
  EXPECT_NE(Stderr().find("22 prompt tokens (0 from the prefix cache: 0.0%), 10 new tokens in "), std::string::npos)
      << Stderr();
  EXPECT_NE(Stderr().find("(--no-prefix-cache)"), std::string::npos) << Stderr();

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{\"prompt\": 3}", "\"prompt\" must be a string"},
      {"{\"tokens\": [1, 2], \"max_new\": 3}", "unknown field \"max_new\""},
      {"[1, 2]", "not a JSON object"},
      {"{\"tokens\": [1, 2.5]}", "\"tokens\" holds 2.5, not a token id"},
      {"{\"tokens\": [1], \"max_new_tokens\": 0}", "\"max_new_tokens\" must be an integer >= 1, got 0"},
      {"{\"prompt\": \"a\", \"tokens\": [1]}", "give exactly one of \"prompt\" (text) or \"tokens\" (ids)"},
  };
  for (const auto& [line, message] : bad) {
    ASSERT_TRUE(WriteFileAtomically(Path("bad.jsonl"), "\n" + line + "\n").ok());
    CommandResult e = Generate(absl::StrCat("llama-tiny --prompts ", Path("bad.jsonl")));
    EXPECT_EQ(e.exit_code, 1) << line;
    EXPECT_NE(Stderr().find(absl::StrCat(Path("bad.jsonl"), " line 2: ")), std::string::npos) << line << Stderr();
    EXPECT_NE(Stderr().find(message), std::string::npos) << line << "\n" << Stderr();
  }
}

// Prompts of one length bucket are prefilled in one call (the stderr line counts the calls),
// of @fresh_prefill when nothing of them is cached and they are 64 tokens or more;
// --prefill-call-tokens 1 gives each its own call, --no-fresh-prefill takes @prefill for them
// too; no token changes (fp32).
TEST_F(CliGenerateTest, PromptsShareAPrefillCallWithoutChangingATokenAndTheFlagsSayHow) {
  std::string lines;
  for (int i = 0; i < 4; ++i) {  // 70 bytes each: bucket 128
    lines += absl::StrCat("prompt number ", i, " of a batch of four, each of them sixty-nine bytes long\n");
  }
  ASSERT_TRUE(WriteFileAtomically(Path("four.txt"), lines).ok());
  const std::string common = absl::StrCat("llama-tiny --prompts ", Path("four.txt"),
                                          " --temperature 0 --precision fp32 --max-new-tokens 4 --context 96");
  CommandResult together = Generate(common);
  ASSERT_EQ(together.exit_code, 0) << together.output << Stderr();
  EXPECT_NE(Stderr().find("kiln generate: prefill 280 tokens in"), std::string::npos) << Stderr();
  EXPECT_NE(Stderr().find("kiln generate: prefill calls: 1 (1 of @fresh_prefill)"), std::string::npos) << Stderr();
  CommandResult apart = Generate(common + " --prefill-call-tokens 1");
  ASSERT_EQ(apart.exit_code, 0) << apart.output << Stderr();
  EXPECT_NE(Stderr().find("kiln generate: prefill calls: 4 (4 of @fresh_prefill)"), std::string::npos) << Stderr();
  EXPECT_EQ(apart.output, together.output);
  CommandResult paged = Generate(common + " --no-fresh-prefill");
  ASSERT_EQ(paged.exit_code, 0) << paged.output << Stderr();
  EXPECT_NE(Stderr().find("kiln generate: prefill calls: 1 (0 of @fresh_prefill)"), std::string::npos) << Stderr();
  EXPECT_EQ(paged.output, together.output);
  CommandResult bad = Generate(common + " --prefill-call-tokens 0");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(Stderr().find("--prefill-call-tokens 0 must be >= 1"), std::string::npos) << Stderr();
}

TEST_F(CliGenerateTest, BadInputsAreClearErrors) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"llama-tiny --prompt ''", "request 0: the prompt is empty"},
      {"llama-tiny --prompt-tokens 1,300", "prompt token 1 is 300, outside the vocabulary [0, 256)"},
      {"llama-tiny --prompt-tokens 1,x", "--prompt-tokens: 'x' is not a token id"},
      {absl::StrCat("llama-tiny --prompt ", std::string(70, 'a')), "exceed the model's context of 64"},
      {"llama-tiny --prompt hi --temperature=-1", "temperature"},
      {"llama-tiny --prompt hi --top-p 2", "top_p"},
      {"llama-tiny --prompt hi --top-k=-3", "top_k"},
      {"llama-tiny --prompt hi --max-new-tokens 0", "--max-new-tokens 0 must be >= 1"},
      {"llama-tiny --prompt hi --backend tpu", "--backend must be cpu, cuda or auto, got 'tpu'"},
      {"llama-tiny", "give exactly one of --prompt TEXT, --prompt-tokens IDS or --prompts FILE"},
      {"llama-tiny --prompt hi --kv-memory 100", "--kv-memory 100 holds no KV block: one block of 16 tokens takes 8192 bytes"},
      {"llama-tiny --prompt hi --kv-memory 12Q", "--kv-memory '12Q': expected a positive byte count"},
      {"llama-tiny --prompt hi --kv-memory 1M --kv-blocks 4", "give --kv-memory or --kv-blocks, not both"},
      {"llama-tiny --prompt hi --kv-memory 0%", "--kv-memory 0%: a share of the free GPU memory is a percentage in (0, 100]"},
      {"llama-tiny --prompt hi --kv-memory 120%", "--kv-memory 120%: a share of the free GPU memory is a percentage"},
      {"llama-tiny --prompt hi --kv-memory 90%", "--kv-memory 90% sizes the pool from the free GPU memory"},
  };
  for (const auto& [args, message] : cases) {
    CommandResult r = Generate(args);
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output << Stderr();
    EXPECT_NE(Stderr().find(message), std::string::npos) << args << "\n" << Stderr();
  }
}

}  // namespace
}  // namespace kiln
