#include "runtime/inference/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "ir/status_macros.h"

namespace kiln::inference {
namespace {

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Most likely first; equal logits by token id, so that every order is total and a top-k of 1
// picks what greedy picks.
bool MoreLikely(float a_logit, TokenId a_token, float b_logit, TokenId b_token) {
  return a_logit != b_logit ? a_logit > b_logit : a_token < b_token;
}

absl::Status CheckLogits(absl::Span<const float> logits) {
  if (logits.empty()) return absl::InvalidArgumentError("sampling: no logits (the vocabulary is empty)");
  if (logits.size() > static_cast<size_t>(std::numeric_limits<TokenId>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("sampling: ", logits.size(), " logits: more than a token id can name"));
  }
  bool any_finite = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i]) || logits[i] == std::numeric_limits<float>::infinity()) {
      return absl::InvalidArgumentError(absl::StrCat("sampling: logit ", i, " is ", logits[i]));
    }
    any_finite |= std::isfinite(logits[i]);
  }
  if (!any_finite) return absl::InvalidArgumentError("sampling: every logit is -inf: no token can be drawn");
  return absl::OkStatus();
}

// Greedy's token with CheckLogits's checks in the same pass (a decode batch of 32 over a
// vocabulary of 32000 is a million logits a step): the first of the largest logits.
absl::StatusOr<TokenId> CheckedArgmax(absl::Span<const float> logits) {
  if (logits.empty() || logits.size() > static_cast<size_t>(std::numeric_limits<TokenId>::max())) {
    return CheckLogits(logits);
  }
  constexpr float kInf = std::numeric_limits<float>::infinity();
  size_t best = 0;
  float best_value = logits[0];
  bool nan_or_inf = false;  // NaN and +inf both fail v < inf
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    nan_or_inf |= !(v < kInf);
    if (v > best_value) {  // strict: ties keep the lowest id
      best_value = v;
      best = i;
    }
  }
  if (nan_or_inf || best_value == -kInf) return CheckLogits(logits);  // which error
  return static_cast<TokenId>(best);
}

}  // namespace

absl::Status ValidateSamplingParams(const SamplingParams& params) {
  if (!(params.temperature >= 0) || !std::isfinite(params.temperature)) {
    return absl::InvalidArgumentError(absl::StrCat("sampling: temperature is ", params.temperature,
                                                   "; it must be a finite number >= 0 (0 = greedy)"));
  }
  if (params.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling: top_k is ", params.top_k, "; it must be >= 0 (0 = no limit)"));
  }
  if (!(params.top_p > 0 && params.top_p <= 1)) {  // written so that NaN fails
    return absl::InvalidArgumentError(absl::StrCat("sampling: top_p is ", params.top_p, "; it must be in (0, 1]"));
  }
  return absl::OkStatus();
}

double UniformForDraw(uint64_t seed, int64_t draw) {
  const uint64_t bits = Mix(Mix(seed) ^ Mix(static_cast<uint64_t>(draw) + 0x9e3779b97f4a7c15ULL));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;  // 53 random bits: exactly representable, below 1
}

absl::StatusOr<TokenId> Sampler::Sample(absl::Span<const float> logits, const SamplingParams& params, int64_t draw) {
  RETURN_IF_ERROR(ValidateSamplingParams(params));
  if (draw < 0) return absl::InvalidArgumentError(absl::StrCat("sampling: draw index is ", draw, "; it must be >= 0"));
  if (IsGreedy(params)) return CheckedArgmax(logits);
  RETURN_IF_ERROR(CheckLogits(logits));

  candidates_.clear();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] != -std::numeric_limits<float>::infinity()) {  // probability 0: never drawn
      candidates_.push_back({logits[i], static_cast<TokenId>(i), 0.0});
    }
  }
  auto more_likely = [](const Candidate& a, const Candidate& b) { return MoreLikely(a.logit, a.token, b.logit, b.token); };
  const bool sorted = params.top_k > 0 || params.top_p < 1;
  if (params.top_k > 0 && params.top_k < static_cast<int64_t>(candidates_.size())) {
    std::nth_element(candidates_.begin(), candidates_.begin() + params.top_k, candidates_.end(), more_likely);
    candidates_.resize(params.top_k);
  }
  if (sorted) std::sort(candidates_.begin(), candidates_.end(), more_likely);

  float max_logit = -std::numeric_limits<float>::infinity();
  for (const Candidate& c : candidates_) max_logit = std::max(max_logit, c.logit);
  double total = 0;
  for (Candidate& c : candidates_) {
    // In double, relative to the largest: no overflow for any temperature, and the most
    // likely token always has weight 1.
    c.weight = std::exp((static_cast<double>(c.logit) - max_logit) / params.temperature);
    total += c.weight;
  }
  size_t kept = candidates_.size();
  if (params.top_p < 1) {
    // The nucleus: the shortest most-likely-first prefix whose mass reaches top_p.
    double mass = 0;
    for (size_t i = 0; i < candidates_.size(); ++i) {
      mass += candidates_[i].weight;
      if (mass >= params.top_p * total) {
        kept = i + 1;
        break;
      }
    }
    total = 0;
    for (size_t i = 0; i < kept; ++i) total += candidates_[i].weight;
  }
  const double target = UniformForDraw(params.seed, draw) * total;
  double cumulative = 0;
  for (size_t i = 0; i < kept; ++i) {
    cumulative += candidates_[i].weight;
    if (target < cumulative) return candidates_[i].token;
  }
  return candidates_[kept - 1].token;  // rounding left the target at the very top
}

}  // namespace kiln::inference
