#include "runtime/inference/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "ir/status_macros.h"
#include "ir/thread_pool.h"

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

// The max of the logits with CheckLogits's checks in the same pass (a decode batch of 32 over
// a vocabulary of 32000 is a million logits a step), and the first index holding it: greedy's
// token.
struct CheckedMaxResult {
  float max;
  size_t first;
};
absl::StatusOr<CheckedMaxResult> CheckedMax(absl::Span<const float> logits) {
  if (logits.empty() || logits.size() > static_cast<size_t>(std::numeric_limits<TokenId>::max())) {
    RETURN_IF_ERROR(CheckLogits(logits));
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
  if (nan_or_inf || best_value == -kInf) {
    RETURN_IF_ERROR(CheckLogits(logits));  // which error
  }
  return CheckedMaxResult{best_value, best};
}

using Candidate = Sampler::Candidate;

bool MoreLikelyCandidate(const Candidate& a, const Candidate& b) {
  return MoreLikely(a.logit, a.token, b.logit, b.token);
}

// The k most likely of `logits`' finite entries into `out` (in no particular order): a heap
// of the k best so far, whose least likely is the bar a token must pass (k log k plus a
// comparison a token; nth_element over every token for a k near the vocabulary's size).
void TopK(absl::Span<const float> logits, size_t k, std::vector<Candidate>& out) {
  out.clear();
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
  // std::*_heap keeps the "largest" first: with MoreLikely as less-than, that is the least
  // likely of the heap.
  auto less_likely_first = [](const Candidate& a, const Candidate& b) { return MoreLikelyCandidate(a, b); };
  if (k * 8 > logits.size()) {
    for (size_t i = 0; i < logits.size(); ++i) {
      if (logits[i] != kMinusInf) out.push_back({logits[i], static_cast<TokenId>(i), 0.f});
    }
    if (k < out.size()) {
      std::nth_element(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(k), out.end(), MoreLikelyCandidate);
      out.resize(k);
    }
    return;
  }
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    if (v == kMinusInf) continue;
    if (out.size() < k) {
      out.push_back({v, static_cast<TokenId>(i), 0.f});
      std::push_heap(out.begin(), out.end(), less_likely_first);
    } else if (v > out.front().logit) {  // ties lose: the heap's token has the lower id
      std::pop_heap(out.begin(), out.end(), less_likely_first);
      out.back() = {v, static_cast<TokenId>(i), 0.f};
      std::push_heap(out.begin(), out.end(), less_likely_first);
    }
  }
}

// Reorders `c` so that its first n, for the least n, are the n most likely and weigh at least
// `need` (their weights summed in f64); returns n (all of c when even c falls short, which
// rounding alone can make happen). Linear, where a sort of the vocabulary is n log n (88 ms a
// decode step at batch 32 on 32000 tokens): the logits' range in equal buckets (about 16
// tokens each, at most 1024), most likely first, each bucket's mass (in `mass`, reused); the
// buckets before the one where the mass reaches `need` are kept whole, and only that bucket's
// tokens are sorted to find the last one kept.
size_t SmallestPrefixWeighing(std::vector<Candidate>& c, double need, std::vector<double>& mass) {
  const int kBuckets = static_cast<int>(std::clamp<size_t>(c.size() / 16, 1, 1024));
  float top = -std::numeric_limits<float>::infinity(), bottom = std::numeric_limits<float>::infinity();
  for (const Candidate& x : c) top = std::max(top, x.logit), bottom = std::min(bottom, x.logit);
  const float per_unit = top > bottom ? (kBuckets - 1) / (top - bottom) : 0.f;
  // Monotone in the logit (a rounded difference times a positive constant, truncated): a more
  // likely token is never in a later bucket.
  auto bucket = [&](float logit) { return std::min(kBuckets - 1, static_cast<int>((top - logit) * per_unit)); };
  mass.assign(kBuckets, 0.0);
  for (const Candidate& x : c) mass[bucket(x.logit)] += x.weight;
  double before = 0;  // the weight of the buckets kept whole
  int cut = 0;
  while (cut < kBuckets - 1 && before + mass[cut] < need) before += mass[cut++];
  auto whole_end = std::partition(c.begin(), c.end(), [&](const Candidate& x) { return bucket(x.logit) < cut; });
  auto cut_end = std::partition(whole_end, c.end(), [&](const Candidate& x) { return bucket(x.logit) == cut; });
  std::sort(whole_end, cut_end, MoreLikelyCandidate);
  for (auto it = whole_end; it != cut_end; ++it) {
    before += it->weight;
    if (before >= need) return static_cast<size_t>(it - c.begin()) + 1;
  }
  return static_cast<size_t>(cut_end - c.begin());  // summed in another order, the cut fell short
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
  ASSIGN_OR_RETURN(const CheckedMaxResult max, CheckedMax(logits));
  if (IsGreedy(params)) return static_cast<TokenId>(max.first);
  const float scale = static_cast<float>(1.0 / params.temperature);
  // In f32 relative to the largest: no overflow for any temperature, the most likely token
  // weighs 1, and a -inf logit 0 (never drawn).
  auto weight = [&](float logit) { return std::exp((logit - max.max) * scale); };
  const double u = UniformForDraw(params.seed, draw);

  if (params.top_k == 0 && params.top_p == 1) {  // every token kept: no candidates to gather
    weights_.resize(logits.size());
    double total = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      weights_[i] = weight(logits[i]);
      total += weights_[i];
    }
    const double target = u * total;
    double cumulative = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      cumulative += weights_[i];
      if (target < cumulative) return static_cast<TokenId>(i);
    }
    return static_cast<TokenId>(max.first);  // rounding left the target at the very top
  }

  if (params.top_k > 0) {
    TopK(logits, static_cast<size_t>(params.top_k), candidates_);
  } else {
    candidates_.clear();
    for (size_t i = 0; i < logits.size(); ++i) {
      if (logits[i] != -std::numeric_limits<float>::infinity()) {
        candidates_.push_back({logits[i], static_cast<TokenId>(i), 0.f});
      }
    }
  }
  double total = 0;
  for (Candidate& c : candidates_) {
    c.weight = weight(c.logit);
    total += c.weight;
  }
  size_t kept = candidates_.size();
  if (params.top_p < 1) {
    // The nucleus: the fewest most likely tokens whose mass reaches top_p.
    kept = SmallestPrefixWeighing(candidates_, params.top_p * total, bucket_mass_);
    total = 0;
    for (size_t i = 0; i < kept; ++i) total += candidates_[i].weight;
  }
  const double target = u * total;
  double cumulative = 0;
  for (size_t i = 0; i < kept; ++i) {
    cumulative += candidates_[i].weight;
    if (target < cumulative) return candidates_[i].token;
  }
  return candidates_[kept - 1].token;  // rounding left the target at the very top
}

std::vector<absl::StatusOr<TokenId>> SampleRows(absl::Span<const SampleRequest> rows, int threads) {
  std::vector<absl::StatusOr<TokenId>> tokens(rows.size());  // each set by its chunk below
  ThreadPool::Shared(threads).ParallelFor(static_cast<int64_t>(rows.size()), 1, [&](int64_t begin, int64_t end) {
    thread_local Sampler sampler;  // each thread's candidates, kept from call to call
    for (int64_t i = begin; i < end; ++i) tokens[i] = sampler.Sample(rows[i].logits, rows[i].params, rows[i].draw);
  });
  return tokens;
}

}  // namespace kiln::inference
