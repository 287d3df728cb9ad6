// The token sampler (runtime/inference/sampler.h): greedy is argmax, the same seed gives the
// same tokens, top-k and top-p keep what they should (measured over many draws with fixed
// seeds), and nonsense values are refused with the value named.
#include "runtime/inference/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kiln::inference {
namespace {

std::vector<float> RandomLogits(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> logits(n);
  for (float& l : logits) l = normal(rng);
  return logits;
}

std::vector<float> LogitsOf(const std::vector<double>& probabilities) {
  std::vector<float> logits;
  for (double p : probabilities) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

// How often each token is drawn in `draws` draws.
std::vector<double> Frequencies(const std::vector<float>& logits, const SamplingParams& params, int64_t draws) {
  Sampler sampler;
  std::vector<double> counts(logits.size(), 0);
  for (int64_t d = 0; d < draws; ++d) {
    absl::StatusOr<TokenId> t = sampler.Sample(logits, params, d);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) break;
    counts[*t] += 1.0 / draws;
  }
  return counts;
}

TEST(Sampler, GreedyIsArgmaxAndTiesGoToTheLowestId) {
  Sampler sampler;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const std::vector<float> logits = RandomLogits(1000, seed);
    const TokenId expected = static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    EXPECT_EQ(sampler.Sample(logits, {.temperature = 0}, seed).value(), expected);
  }
  EXPECT_EQ(sampler.Sample({1.f, 3.f, 3.f, 2.f}, {.temperature = 0}, 0).value(), 1);
}

TEST(Sampler, TheSameSeedGivesTheSameTokens) {
  const std::vector<float> logits = RandomLogits(500, 1);
  const SamplingParams params{.temperature = 1.0, .top_k = 50, .top_p = 0.9, .seed = 1234};
  Sampler a, b;
  std::vector<TokenId> first, second, other_seed;
  for (int64_t d = 0; d < 200; ++d) {
    first.push_back(a.Sample(logits, params, d).value());
    SamplingParams other = params;
    other.seed = 1235;
    other_seed.push_back(a.Sample(logits, other, d).value());
  }
  for (int64_t d = 0; d < 200; ++d) second.push_back(b.Sample(logits, params, d).value());
  EXPECT_EQ(first, second);
  EXPECT_NE(first, other_seed);
  // A draw depends on (seed, draw index) alone: asked out of order, the same answers.
  for (int64_t d = 199; d >= 0; --d) EXPECT_EQ(b.Sample(logits, params, d).value(), first[d]);
  // And the tokens do vary from draw to draw.
  EXPECT_GT(std::set<TokenId>(first.begin(), first.end()).size(), 5u);
}

TEST(Sampler, TopKOfOneIsGreedy) {
  Sampler sampler;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const std::vector<float> logits = RandomLogits(300, seed);
    const TokenId greedy = sampler.Sample(logits, {.temperature = 0}, 0).value();
    for (int64_t d = 0; d < 20; ++d) {
      EXPECT_EQ(sampler.Sample(logits, {.temperature = 2.0, .top_k = 1, .seed = seed}, d).value(), greedy);
    }
  }
}

TEST(Sampler, TopKKeepsTheKMostLikely) {
  // Probabilities 0.3, 0.25, 0.2, 0.15, 0.1 in a shuffled order: the top 2 are ids 3 and 0.
  const std::vector<float> logits = LogitsOf({0.25, 0.1, 0.15, 0.3, 0.2});
  const std::vector<double> f = Frequencies(logits, {.temperature = 1.0, .top_k = 2, .seed = 9}, 20000);
  EXPECT_EQ(f[1] + f[2] + f[4], 0);
  EXPECT_NEAR(f[3], 0.3 / 0.55, 0.02);
  EXPECT_NEAR(f[0], 0.25 / 0.55, 0.02);
}

TEST(Sampler, TopPDrawsFromTheNucleusOnly) {
  // Sorted: 0.5 (id 2), 0.3 (id 0), 0.15 (id 3), 0.05 (id 1). top_p 0.75 needs the first two.
  const std::vector<float> logits = LogitsOf({0.3, 0.05, 0.5, 0.15});
  const std::vector<double> f = Frequencies(logits, {.temperature = 1.0, .top_p = 0.75, .seed = 3}, 20000);
  EXPECT_EQ(f[1] + f[3], 0) << "drew outside the nucleus";
  EXPECT_NEAR(f[2], 0.5 / 0.8, 0.02);  // renormalized within the nucleus
  EXPECT_NEAR(f[0], 0.3 / 0.8, 0.02);
  // A larger top_p takes the third in too, never the fourth.
  const std::vector<double> g = Frequencies(logits, {.temperature = 1.0, .top_p = 0.9, .seed = 3}, 20000);
  EXPECT_EQ(g[1], 0);
  EXPECT_NEAR(g[3], 0.15 / 0.95, 0.02);
  // top_p = 1 keeps everything, and the frequencies are the probabilities.
  const std::vector<double> h = Frequencies(logits, {.temperature = 1.0, .top_p = 1.0, .seed = 3}, 20000);
  EXPECT_NEAR(h[1], 0.05, 0.01);
  EXPECT_NEAR(h[2], 0.5, 0.02);
}

// Ties at a top-k cut go to the lowest ids, on either way of selecting (a heap of k for a k
// well under the vocabulary, nth_element past it): 3000 equal logits keep ids 0..k-1.
TEST(Sampler, TopKTiesAtTheCutGoToTheLowestIds) {
  const std::vector<float> flat(3000, 0.5f);
  for (int64_t k : {1, 10, 2000}) {
    Sampler sampler;
    TokenId highest = 0;
    for (int64_t d = 0; d < 4000; ++d) {
      absl::StatusOr<TokenId> t = sampler.Sample(flat, {.temperature = 1.0, .top_k = k, .seed = 4}, d);
      ASSERT_TRUE(t.ok()) << t.status();
      highest = std::max(highest, *t);
    }
    EXPECT_LT(highest, k);
    if (k > 1) EXPECT_GT(highest, k * 3 / 4) << "k = " << k << ": the kept tokens are drawn across the range";
  }
}

// Over a vocabulary of 3000 with ties (logits in halves), the tokens top-k and top-p keep are
// exactly those a sort of the whole vocabulary keeps (larger logit, then lower id; the nucleus
// the fewest whose mass reaches top_p), and within them each is drawn in proportion to its
// weight.
TEST(Sampler, TopKAndTopPKeepWhatASortOfTheVocabularyKeeps) {
  std::vector<float> logits = RandomLogits(3000, 21);
  for (float& l : logits) l = std::round(l * 2) / 2;
  std::vector<TokenId> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<TokenId>(i);
  std::sort(order.begin(), order.end(), [&](TokenId a, TokenId b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  const float max = logits[order[0]];
  for (const auto& [top_k, top_p] : std::vector<std::pair<int64_t, double>>{{0, 0.3}, {0, 0.9}, {40, 1.0}, {40, 0.5},
                                                                           {1500, 0.8}}) {
    SCOPED_TRACE(absl::StrCat("top_k ", top_k, ", top_p ", top_p));
    const size_t k = top_k > 0 ? static_cast<size_t>(top_k) : order.size();
    std::vector<double> w(k);
    double total = 0;
    for (size_t i = 0; i < k; ++i) total += w[i] = std::exp(static_cast<double>(logits[order[i]]) - max);
    // The nucleus by the definition; a mass within 1e-6 of top_p's would leave its cut to
    // rounding, which these logits avoid (checked).
    size_t kept = k;
    double mass = 0;
    for (size_t i = 0; i < k && top_p < 1; ++i) {
      mass += w[i];
      if (mass >= top_p * total) {
        ASSERT_GT(mass - top_p * total, 1e-6 * total);
        ASSERT_GT(top_p * total - (mass - w[i]), 1e-6 * total);
        kept = i + 1;
        break;
      }
    }
    double kept_total = 0;
    for (size_t i = 0; i < kept; ++i) kept_total += w[i];
    std::vector<int> rank(logits.size(), -1);
    for (size_t i = 0; i < kept; ++i) rank[order[i]] = static_cast<int>(i);
    constexpr int kDraws = 20000;
    const std::vector<double> f = Frequencies(logits, {.temperature = 1.0, .top_k = top_k, .top_p = top_p, .seed = 8},
                                              kDraws);
    for (size_t t = 0; t < f.size(); ++t) {
      if (rank[t] < 0) {
        EXPECT_EQ(f[t], 0) << "token " << t << " is outside the kept set";
      } else if (rank[t] < 3) {
        EXPECT_NEAR(f[t], w[rank[t]] / kept_total, 0.02) << "token " << t;
      }
    }
  }
}

TEST(Sampler, TemperatureSharpensAndFlattens) {
  const std::vector<double> p = {0.6, 0.3, 0.1};
  const std::vector<float> logits = LogitsOf(p);
  // At temperature T the probabilities are p^(1/T), normalized.
  for (double t : {0.5, 2.0}) {
    std::vector<double> expected;
    double z = 0;
    for (double q : p) z += std::pow(q, 1 / t);
    for (double q : p) expected.push_back(std::pow(q, 1 / t) / z);
    const std::vector<double> f = Frequencies(logits, {.temperature = t, .seed = 11}, 20000);
    for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(f[i], expected[i], 0.02) << "T=" << t << " token " << i;
  }
}

TEST(Sampler, MinusInfinityLogitsAreNeverDrawn) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const std::vector<double> f = Frequencies({ninf, 0.f, ninf, 0.f}, {.temperature = 1.0, .seed = 5}, 2000);
  EXPECT_EQ(f[0] + f[2], 0);
  EXPECT_GT(f[1], 0.4);
  EXPECT_GT(f[3], 0.4);
}

TEST(Sampler, NonsenseValuesAreRefusedWithTheValueNamed) {
  const std::vector<float> logits = {0.f, 1.f};
  Sampler sampler;
  auto message_of = [&](const SamplingParams& params) {
    absl::StatusOr<TokenId> t = sampler.Sample(logits, params, 0);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ValidateSamplingParams(params).code(), absl::StatusCode::kInvalidArgument);
    return std::string(t.status().message());
  };
  EXPECT_TRUE(absl::StrContains(message_of({.temperature = -0.5}), "temperature is -0.5"));
  EXPECT_TRUE(absl::StrContains(message_of({.temperature = std::nan("")}), "temperature is nan"));
  EXPECT_TRUE(absl::StrContains(message_of({.temperature = std::numeric_limits<double>::infinity()}), "temperature is inf"));
  EXPECT_TRUE(absl::StrContains(message_of({.top_k = -3}), "top_k is -3"));
  EXPECT_TRUE(absl::StrContains(message_of({.top_p = 0}), "top_p is 0"));
  EXPECT_TRUE(absl::StrContains(message_of({.top_p = 1.5}), "top_p is 1.5"));
  EXPECT_TRUE(absl::StrContains(message_of({.top_p = std::nan("")}), "top_p is nan"));
  EXPECT_TRUE(ValidateSamplingParams({.temperature = 0, .top_k = 0, .top_p = 1}).ok());
  EXPECT_TRUE(ValidateSamplingParams({.temperature = 0.7, .top_k = 100000, .top_p = 1e-9}).ok());
}

TEST(Sampler, BadLogitsAreRefused) {
  Sampler sampler;
  const float ninf = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(sampler.Sample({}, {}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<TokenId> nan = sampler.Sample({0.f, std::nanf(""), 1.f}, {}, 0);
  EXPECT_EQ(nan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(nan.status().message(), "logit 1 is nan")) << nan.status();
  EXPECT_EQ(sampler.Sample({0.f, -ninf}, {}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sampler.Sample({ninf, ninf}, {.temperature = 0}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sampler.Sample({0.f, 1.f}, {}, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Sampler, DrawsAreUniform) {
  double sum = 0, below_tenth = 0;
  constexpr int kDraws = 100000;
  for (int d = 0; d < kDraws; ++d) {
    const double u = UniformForDraw(42, d);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    below_tenth += u < 0.1 ? 1 : 0;
  }
  EXPECT_NEAR(sum / kDraws, 0.5, 0.005);
  EXPECT_NEAR(below_tenth / kDraws, 0.1, 0.005);
}

}  // namespace
}  // namespace kiln::inference
