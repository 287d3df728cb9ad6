// ir/token_sampling.h: SampleToken against the definition its header states, written the
// slow way (a sort of the whole vocabulary), on random logits with ties, -inf entries and
// every kind of parameter.
#include "ir/token_sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

namespace kiln {
namespace {

// The header's steps 1-4, literally.
int32_t ByTheDefinition(const std::vector<float>& logits, const TokenSampling& p) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  std::vector<int32_t> ranked(vocab);
  std::iota(ranked.begin(), ranked.end(), 0);
  std::stable_sort(ranked.begin(), ranked.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const float max = logits[ranked[0]];
  if (p.temperature == 0 || p.top_k == 1) return ranked[0];
  const float scale = 1.0f / p.temperature;
  auto mass = [&](int32_t t) -> uint64_t {
    if (logits[t] == max) return uint64_t{1} << 40;
    return static_cast<uint64_t>(std::nearbyint(std::exp((logits[t] - max) * scale) * 0x1p40f));
  };
  int32_t kept = vocab;
  if (p.top_k > 0) {
    int32_t finite = 0;
    for (float l : logits) finite += l != -std::numeric_limits<float>::infinity();
    kept = static_cast<int32_t>(std::min<int64_t>(p.top_k, finite));
  }
  if (p.top_p < 1) {
    uint64_t total = 0;
    for (int32_t i = 0; i < kept; ++i) total += mass(ranked[i]);
    const uint64_t need =
        std::max<uint64_t>(1, static_cast<uint64_t>(static_cast<double>(p.top_p) * static_cast<double>(total)));
    uint64_t running = 0;
    for (int32_t i = 0; i < kept; ++i) {
      running += mass(ranked[i]);
      if (running >= need) {
        kept = i + 1;
        break;
      }
    }
  }
  std::vector<bool> is_kept(vocab, false);
  for (int32_t i = 0; i < kept; ++i) is_kept[ranked[i]] = true;
  uint64_t total = 0;
  for (int32_t t = 0; t < vocab; ++t) total += is_kept[t] ? mass(t) : 0;
  const uint64_t target = static_cast<uint64_t>(
      (static_cast<unsigned __int128>(UniformBitsForDraw(p.seed, p.draw)) * total) >> 53);
  uint64_t running = 0;
  for (int32_t t = 0; t < vocab; ++t) {
    running += is_kept[t] ? mass(t) : 0;
    if (running > target) return t;
  }
  return -2;  // the definition says this cannot happen
}

std::vector<float> Logits(int64_t vocab, uint64_t seed, float spread, bool coarse) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0, spread);
  std::vector<float> logits(vocab);
  for (float& l : logits) {
    l = normal(rng);
    if (coarse) l = std::round(l * 4) / 4;  // many ties
  }
  return logits;
}

TEST(TokenSampling, DrawsWhatTheDefinitionDraws) {
  TokenSamplingScratch scratch;
  const std::vector<TokenSampling> kinds = {
      {.temperature = 1},
      {.temperature = 0.5f},
      {.temperature = 2},
      {.temperature = 1, .top_k = 7},
      {.temperature = 0.8f, .top_k = 200},
      {.temperature = 1, .top_k = 5000},
      {.temperature = 1, .top_p = 0.3f},
      {.temperature = 1.2f, .top_p = 0.9f},
      {.temperature = 0.7f, .top_k = 50, .top_p = 0.6f},
      {.temperature = 1, .top_p = 1e-9f},
  };
  int checked = 0;
  for (int64_t vocab : {1, 3, 100, 3001}) {
    for (uint64_t seed = 0; seed < 6; ++seed) {
      std::vector<float> logits = Logits(vocab, seed, seed % 2 ? 3.f : 0.7f, /*coarse=*/seed % 3 == 0);
      if (seed == 4 && vocab > 3) {  // some -inf entries, as a mask leaves
        for (int64_t i = 0; i < vocab; i += 3) logits[i] = -std::numeric_limits<float>::infinity();
      }
      for (TokenSampling p : kinds) {
        for (int64_t draw : {0, 1, 17, 1000}) {
          p.seed = seed * 0x9e3779b97f4a7c15ULL;
          p.draw = draw;
          ASSERT_EQ(SampleToken(logits, p, scratch), ByTheDefinition(logits, p))
              << "vocab " << vocab << ", logits seed " << seed << ", temperature " << p.temperature << ", top_k "
              << p.top_k << ", top_p " << p.top_p << ", draw " << draw;
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 4 * 6 * 10 * 4);
}

TEST(TokenSampling, GreedyIsTheFirstLargestLogit) {
  TokenSamplingScratch scratch;
  const std::vector<float> logits = {1, 3, -2, 3, 0};
  EXPECT_EQ(SampleToken(logits, {.temperature = 0}, scratch), 1);
  EXPECT_EQ(SampleToken(logits, {.temperature = 5, .top_k = 1}, scratch), 1);
  // A temperature whose inverse is inf in f32 leaves the largest logits alone in the running.
  for (int64_t draw = 0; draw < 20; ++draw) {
    const int32_t t = SampleToken(logits, {.temperature = 1e-40f, .draw = draw}, scratch);
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
}

TEST(TokenSampling, NoTokenForBadLogitsOrParameters) {
  TokenSamplingScratch scratch;
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(SampleToken({}, {}, scratch), -1);
  EXPECT_EQ(SampleToken(std::vector<float>{0, std::nanf(""), 1}, {}, scratch), -1);
  EXPECT_EQ(SampleToken(std::vector<float>{0, inf}, {.temperature = 0}, scratch), -1);
  EXPECT_EQ(SampleToken(std::vector<float>{-inf, -inf}, {}, scratch), -1);
  const std::vector<float> ok = {0, 1};
  EXPECT_EQ(SampleToken(ok, {.temperature = -1}, scratch), -1);
  EXPECT_EQ(SampleToken(ok, {.temperature = inf}, scratch), -1);
  EXPECT_EQ(SampleToken(ok, {.top_k = -1}, scratch), -1);
  EXPECT_EQ(SampleToken(ok, {.top_p = 0}, scratch), -1);
  EXPECT_EQ(SampleToken(ok, {.top_p = 1.5f}, scratch), -1);
  EXPECT_EQ(SampleToken(ok, {.draw = -1}, scratch), -1);
}

TEST(TokenSampling, OperandsHoldTheParameters) {
  const TokenSampling p{.temperature = 0.7f, .top_k = 40, .top_p = 0.9f, .seed = 0xfedcba9876543210ULL, .draw = 77};
  const TokenSamplingOperands o = ToOperands(p);
  const TokenSampling back = FromOperands(o.sampling, o.draws);
  EXPECT_EQ(back.temperature, p.temperature);
  EXPECT_EQ(back.top_k, p.top_k);
  EXPECT_EQ(back.top_p, p.top_p);
  EXPECT_EQ(back.seed, p.seed);
  EXPECT_EQ(back.draw, p.draw);
  const float fractional[3] = {1, 2.5f, 1};
  const int32_t draws[3] = {0, 0, 0};
  EXPECT_EQ(FromOperands(fractional, draws).top_k, -1);
  // A top_k beyond any vocabulary is held as 2^24, which keeps every token just the same.
  EXPECT_EQ(FromOperands(ToOperands({.top_k = int64_t{1} << 40}).sampling, draws).top_k, int64_t{1} << 24);
}

}  // namespace
}  // namespace kiln
