// Training data: the built-in corpus, text and .bin token files, deterministic batches and
// evaluation windows (runtime/training/dataset.h), and the LR schedule.
#include "runtime/training/dataset.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "absl/strings/match.h"
#include "ir/file_util.h"
#include "runtime/training/lr_schedule.h"

namespace kiln {
namespace {

std::string TempPath(const std::string& name) { return ::testing::TempDir() + "/kiln_dataset_" + name; }

std::string Uint16Bytes(const std::vector<uint16_t>& tokens) {
  std::string out;
  for (uint16_t t : tokens) {
    out.push_back(static_cast<char>(t & 0xff));
    out.push_back(static_cast<char>(t >> 8));
  }
  return out;
}

// Whether `bytes` is well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF), so that a model trained on it generates text, not stray bytes.
bool IsUtf8(const std::vector<uint16_t>& bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    const uint16_t b = bytes[i];
    int extra = 0;
    uint32_t code = 0, least = 0;
    if (b < 0x80) {
      ++i;
      continue;
    } else if ((b & 0xe0) == 0xc0) {
      extra = 1, code = b & 0x1f, least = 0x80;
    } else if ((b & 0xf0) == 0xe0) {
      extra = 2, code = b & 0x0f, least = 0x800;
    } else if ((b & 0xf8) == 0xf0) {
      extra = 3, code = b & 0x07, least = 0x10000;
    } else {
      return false;
    }
    if (i + extra >= bytes.size()) return false;
    for (int k = 1; k <= extra; ++k) {
      if ((bytes[i + k] & 0xc0) != 0x80) return false;
      code = (code << 6) | (bytes[i + k] & 0x3f);
    }
    if (code < least || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return false;
    i += extra + 1;
  }
  return true;
}

TEST(Dataset, IsUtf8TellsTextFromStrayBytes) {
  EXPECT_TRUE(IsUtf8({'a', 0xe2, 0x84, 0xa2}));  // "a™"
  EXPECT_FALSE(IsUtf8({'a', 0xe2, 0x84}));       // cut short
  EXPECT_FALSE(IsUtf8({0xc0, 0xaf}));            // overlong '/'
  EXPECT_FALSE(IsUtf8({0xed, 0xa0, 0x80}));      // a surrogate
  EXPECT_FALSE(IsUtf8({0xff}));
}

TEST(Dataset, BuiltInCorpusIsByteTokensOfUtf8Text) {
  TokenDataset d = TokenDataset::Default();
  // runtime/data/README.md: large enough that a 500-step llama-M run (8,192 tokens a step)
  // reads less than one pass over the training part.
  EXPECT_GT(d.size(), 500 * 8192 * 10 / 9);
  EXPECT_TRUE(IsUtf8(d.ToVector()));
  EXPECT_TRUE(d.CheckFits(256, 2048).ok());
}

TEST(Dataset, TextFilesAreOneTokenPerByte) {
  ASSERT_TRUE(WriteFileAtomically(TempPath("a.txt"), "ab\xff").ok());
  absl::StatusOr<TokenDataset> d = TokenDataset::FromFile(TempPath("a.txt"));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->ToVector(), (std::vector<uint16_t>{'a', 'b', 255}));
}

TEST(Dataset, BinFilesAreLittleEndianUint16WithOptionalLlmcHeader) {
  std::vector<uint16_t> tokens = {1, 300, 65535, 7};
  ASSERT_TRUE(WriteFileAtomically(TempPath("plain.bin"), Uint16Bytes(tokens)).ok());
  absl::StatusOr<TokenDataset> plain = TokenDataset::FromFile(TempPath("plain.bin"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->ToVector(), tokens);
  EXPECT_EQ(plain->max_token(), 65535);

  std::string header(256 * 4, '\0');
  int32_t magic = 20240520, version = 1, count = 4;
  std::memcpy(header.data(), &magic, 4);
  std::memcpy(header.data() + 4, &version, 4);
  std::memcpy(header.data() + 8, &count, 4);
  ASSERT_TRUE(WriteFileAtomically(TempPath("llmc.bin"), header + Uint16Bytes(tokens)).ok());
  absl::StatusOr<TokenDataset> llmc = TokenDataset::FromFile(TempPath("llmc.bin"));
  ASSERT_TRUE(llmc.ok()) << llmc.status();
  EXPECT_EQ(llmc->ToVector(), tokens);

  ASSERT_TRUE(WriteFileAtomically(TempPath("odd.bin"), "abc").ok());
  absl::StatusOr<TokenDataset> odd = TokenDataset::FromFile(TempPath("odd.bin"));
  ASSERT_FALSE(odd.ok());
  EXPECT_TRUE(absl::StrContains(odd.status().message(), "odd count")) << odd.status();
  EXPECT_FALSE(TokenDataset::FromFile(TempPath("missing.bin")).ok());
}

// Issue 11: the llm.c header's version and token count were taken at face value.
TEST(Dataset, LlmcHeadersAreCheckedAgainstTheFile) {
  const std::vector<uint16_t> tokens = {1, 2, 3, 4};
  auto with_header = [&](int32_t version, int32_t count, const std::vector<uint16_t>& data) {
    std::string header(256 * 4, '\0');
    int32_t magic = 20240520;
    std::memcpy(header.data(), &magic, 4);
    std::memcpy(header.data() + 4, &version, 4);
    std::memcpy(header.data() + 8, &count, 4);
    return header + Uint16Bytes(data);
  };
  ASSERT_TRUE(WriteFileAtomically(TempPath("v2.bin"), with_header(2, 4, tokens)).ok());
  absl::StatusOr<TokenDataset> v2 = TokenDataset::FromFile(TempPath("v2.bin"));
  ASSERT_FALSE(v2.ok());
  EXPECT_TRUE(absl::StrContains(v2.status().message(), "llm.c header version 2 is not supported")) << v2.status();

  ASSERT_TRUE(WriteFileAtomically(TempPath("short.bin"), with_header(1, 1000, tokens)).ok());
  absl::StatusOr<TokenDataset> truncated = TokenDataset::FromFile(TempPath("short.bin"));
  ASSERT_FALSE(truncated.ok());
  EXPECT_TRUE(absl::StrContains(truncated.status().message(), "header says 1000 tokens")) << truncated.status();
  EXPECT_TRUE(absl::StrContains(truncated.status().message(), "short.bin")) << truncated.status();

  absl::StatusOr<TokenDataset> empty_name = TokenDataset::FromFile("");
  ASSERT_FALSE(empty_name.ok());
  EXPECT_TRUE(absl::StrContains(empty_name.status().message(), "the file name is empty")) << empty_name.status();
}

TEST(Dataset, SlicesShareTheTokens) {
  TokenDataset d = TokenDataset::FromTokens("t", {5, 6, 7, 8, 9});
  TokenDataset tail = d.Slice("tail", 3, 5);
  EXPECT_EQ(tail.ToVector(), (std::vector<uint16_t>{8, 9}));
  EXPECT_EQ(tail.max_token(), 9);
  EXPECT_EQ(tail.name(), "tail");
}

TEST(Dataset, CheckFitsNamesTheProblem) {
  TokenDataset d = TokenDataset::FromTokens("t", {1, 2, 300});
  absl::Status vocab = d.CheckFits(256, 2);
  EXPECT_TRUE(absl::StrContains(vocab.message(), "token id 300 does not fit the model's vocab of 256")) << vocab;
  absl::Status short_data = d.CheckFits(1000, 8);
  EXPECT_TRUE(absl::StrContains(short_data.message(), "fewer than one window of 9")) << short_data;
}

TEST(Dataset, BatchesAreADeterministicFunctionOfSeedAndStep) {
  std::vector<uint16_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 251);
  TokenDataset d = TokenDataset::FromTokens("t", tokens);
  TokenBatch a = SampleBatch(d, 7, 3, 4, 16), b = SampleBatch(d, 7, 3, 4, 16);
  EXPECT_EQ(a.inputs, b.inputs);
  EXPECT_NE(a.inputs, SampleBatch(d, 7, 4, 4, 16).inputs);
  EXPECT_NE(a.inputs, SampleBatch(d, 8, 3, 4, 16).inputs);
  for (int r = 0; r < 4; ++r) {
    for (int t = 0; t + 1 < 16; ++t) EXPECT_EQ(a.targets[r * 16 + t], a.inputs[r * 16 + t + 1]);
  }
}

// Data parallelism must not change the data: W ranks' batches, concatenated in rank order,
// are the batch one process draws at that step.
TEST(Dataset, RankBatchesConcatenateToTheSingleProcessBatch) {
  std::vector<uint16_t> tokens(5000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7919) % 65521);
  TokenDataset d = TokenDataset::FromTokens("t", tokens);
  const int64_t batch = 8, seq = 32;
  for (uint64_t seed : {0ull, 1ull, 1234ull}) {
    for (int64_t step : {0, 1, 17, 1000}) {
      TokenBatch whole = SampleBatch(d, seed, step, batch, seq);
      for (int64_t world : {1, 2, 4, 8}) {
        std::vector<int32_t> inputs, targets;
        for (int64_t rank = 0; rank < world; ++rank) {
          absl::StatusOr<TokenBatch> part = SampleRankBatch(d, seed, step, batch, seq, rank, world);
          ASSERT_TRUE(part.ok()) << part.status();
          EXPECT_EQ(part->batch, batch / world);
          EXPECT_EQ(part->seq_len, seq);
          inputs.insert(inputs.end(), part->inputs.begin(), part->inputs.end());
          targets.insert(targets.end(), part->targets.begin(), part->targets.end());
        }
        EXPECT_EQ(inputs, whole.inputs) << "seed " << seed << " step " << step << " world " << world;
        EXPECT_EQ(targets, whole.targets) << "seed " << seed << " step " << step << " world " << world;
      }
    }
  }
}

TEST(Dataset, RankBatchesNeedABatchDivisibleByTheWorldSize) {
  TokenDataset d = TokenDataset::FromTokens("t", std::vector<uint16_t>(100, 1));
  absl::StatusOr<TokenBatch> uneven = SampleRankBatch(d, 0, 0, 6, 8, 0, 4);
  ASSERT_FALSE(uneven.ok());
  EXPECT_TRUE(absl::StrContains(uneven.status().message(), "6 sequences does not split evenly over 4 ranks"))
      << uneven.status();
  absl::StatusOr<TokenBatch> bad_rank = SampleRankBatch(d, 0, 0, 8, 8, 2, 2);
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_TRUE(absl::StrContains(bad_rank.status().message(), "rank 2 is not one of world size 2")) << bad_rank.status();
}

TEST(Dataset, EvalWindowsAreStrideTWithTPlusOneTokens) {
  std::vector<uint16_t> tokens(10);
  for (int i = 0; i < 10; ++i) tokens[i] = static_cast<uint16_t>(i);
  TokenDataset d = TokenDataset::FromTokens("t", tokens);
  EXPECT_EQ(NumEvalWindows(d, 3), 3);  // [0..3], [3..6], [6..9]
  TokenBatch b = EvalBatch(d, 1, 2, 3);
  EXPECT_EQ(b.inputs, (std::vector<int32_t>{3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(b.targets, (std::vector<int32_t>{4, 5, 6, 7, 8, 9}));
}

TEST(LrSchedule, WarmsUpLinearlyThenFollowsACosineToMin) {
  LrSchedule s{.peak_lr = 1.0, .min_lr = 0.1, .warmup_steps = 4, .total_steps = 14};
  EXPECT_DOUBLE_EQ(s.At(0), 0.25);
  EXPECT_DOUBLE_EQ(s.At(3), 1.0);
  EXPECT_DOUBLE_EQ(s.At(4), 1.0);
  EXPECT_DOUBLE_EQ(s.At(8), 0.1 + 0.45 * (1 + std::cos(M_PI * 4 / 9)));  // decay over steps 4..13
  EXPECT_DOUBLE_EQ(s.At(13), 0.1);
  EXPECT_DOUBLE_EQ(s.At(100), 0.1);
}

}  // namespace
}  // namespace kiln
