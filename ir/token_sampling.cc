#include "ir/token_sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ir/mix_bits.h"

namespace kiln {
namespace {

using Candidate = TokenSamplingScratch::Candidate;

// Most likely first; equal logits by token id, so that the order is total and a top-k of 1
// keeps what greedy picks.
bool MoreLikely(float a_logit, int32_t a_token, float b_logit, int32_t b_token) {
  return a_logit != b_logit ? a_logit > b_logit : a_token < b_token;
}
bool MoreLikelyCandidate(const Candidate& a, const Candidate& b) {
  return MoreLikely(a.logit, a.token, b.logit, b.token);
}

// A token's mass (the header's step 2): the largest logit weighs exactly 2^40, also where
// f32(logit - max) * scale would be 0 * inf (a temperature so small that 1 / it is inf).
uint64_t Mass(float logit, float max, float scale) {
  if (logit == max) return uint64_t{1} << kSamplingMassBits;
  const float w = std::exp((logit - max) * scale);
  return static_cast<uint64_t>(std::nearbyint(w * 0x1p40f));  // exact scaling; nearest even
}

// The k most likely finite logits into `out` (in no particular order): a heap of the k best
// so far, whose least likely is the bar a token must pass (nth_element over every token for a
// k near the vocabulary's size).
void TopK(absl::Span<const float> logits, size_t k, std::vector<Candidate>& out) {
  out.clear();
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
  // std::*_heap keeps the "largest" first: with MoreLikely as less-than, the least likely.
  auto less_likely_first = [](const Candidate& a, const Candidate& b) { return MoreLikelyCandidate(a, b); };
  if (k * 8 > logits.size()) {
    for (size_t i = 0; i < logits.size(); ++i) {
      if (logits[i] != kMinusInf) out.push_back({logits[i], static_cast<int32_t>(i), 0});
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
      out.push_back({v, static_cast<int32_t>(i), 0});
      std::push_heap(out.begin(), out.end(), less_likely_first);
    } else if (v > out.front().logit) {  // ties lose: the heap's token has the lower id
      std::pop_heap(out.begin(), out.end(), less_likely_first);
      out.back() = {v, static_cast<int32_t>(i), 0};
      std::push_heap(out.begin(), out.end(), less_likely_first);
    }
  }
}

// Reorders `c` so that its first n, for the least n, are the n most likely and their mass
// reaches `need`; returns n (need <= the mass of c). Linear, where a sort of the vocabulary
// is n log n (88 ms a decode step at batch 32 on 32000 tokens): the logits' range in equal
// buckets (about 16 tokens each, at most 1024), most likely first, each bucket's mass; the
// buckets before the one where the mass reaches `need` are kept whole, and only that
// bucket's tokens are sorted to find the cut. The masses are integers: the prefix sums are
// exact, so the cut is the one the ranked order gives, however it is found.
size_t SmallestPrefixWeighing(std::vector<Candidate>& c, uint64_t need, std::vector<uint64_t>& mass) {
  const int kBuckets = static_cast<int>(std::clamp<size_t>(c.size() / 16, 1, 1024));
  float top = -std::numeric_limits<float>::infinity(), bottom = std::numeric_limits<float>::infinity();
  for (const Candidate& x : c) top = std::max(top, x.logit), bottom = std::min(bottom, x.logit);
  const float per_unit = top > bottom ? (kBuckets - 1) / (top - bottom) : 0.f;
  // Monotone in the logit (a rounded difference times a positive constant, truncated): a more
  // likely token is never in a later bucket.
  auto bucket = [&](float logit) { return std::min(kBuckets - 1, static_cast<int>((top - logit) * per_unit)); };
  mass.assign(kBuckets, 0);
  for (const Candidate& x : c) mass[bucket(x.logit)] += x.mass;
  uint64_t before = 0;  // the mass of the buckets kept whole
  int cut = 0;
  while (cut < kBuckets - 1 && before + mass[cut] < need) before += mass[cut++];
  auto whole_end = std::partition(c.begin(), c.end(), [&](const Candidate& x) { return bucket(x.logit) < cut; });
  auto cut_end = std::partition(whole_end, c.end(), [&](const Candidate& x) { return bucket(x.logit) == cut; });
  std::sort(whole_end, cut_end, MoreLikelyCandidate);
  for (auto it = whole_end; it != cut_end; ++it) {
    before += it->mass;
    if (before >= need) return static_cast<size_t>(it - c.begin()) + 1;
  }
  return static_cast<size_t>(cut_end - c.begin());  // unreachable while need <= the mass of c
}

// The first token, in id order, whose running mass passes target (masses[i] is token i's
// mass if kept, else 0); -1 if none does.
int32_t FirstPassing(const std::vector<uint64_t>& masses, uint64_t target) {
  uint64_t running = 0;
  for (size_t i = 0; i < masses.size(); ++i) {
    running += masses[i];
    if (running > target) return static_cast<int32_t>(i);
  }
  return -1;
}

}  // namespace

TokenSamplingOperands ToOperands(const TokenSampling& params) {
  TokenSamplingOperands o;
  o.sampling[0] = params.temperature;
  o.sampling[1] = static_cast<float>(std::clamp<int64_t>(params.top_k, -1, int64_t{1} << 24));
  o.sampling[2] = params.top_p;
  o.draws[0] = static_cast<int32_t>(static_cast<uint32_t>(params.seed));
  o.draws[1] = static_cast<int32_t>(static_cast<uint32_t>(params.seed >> 32));
  o.draws[2] = static_cast<int32_t>(std::clamp<int64_t>(params.draw, -1, std::numeric_limits<int32_t>::max()));
  return o;
}

TokenSampling FromOperands(const float sampling[3], const int32_t draws[3]) {
  TokenSampling row;
  row.temperature = sampling[0];
  const float top_k = sampling[1];
  row.top_k = top_k >= 0 && top_k == std::floor(top_k) && top_k <= 0x1p24f ? static_cast<int64_t>(top_k) : -1;
  row.top_p = sampling[2];
  row.seed = uint64_t{static_cast<uint32_t>(draws[0])} | uint64_t{static_cast<uint32_t>(draws[1])} << 32;
  row.draw = draws[2];
  return row;
}

uint64_t UniformBitsForDraw(uint64_t seed, int64_t draw) {
  return MixBits(MixBits(seed) ^ MixBits(static_cast<uint64_t>(draw) + 0x9e3779b97f4a7c15ULL)) >> 11;
}

bool ValidTokenSampling(const TokenSampling& params) {
  return params.temperature >= 0 && std::isfinite(params.temperature) && params.top_k >= 0 &&
         params.top_p > 0 && params.top_p <= 1 && params.draw >= 0;  // NaN fails every comparison
}

int32_t SampleToken(absl::Span<const float> logits, const TokenSampling& params, TokenSamplingScratch& scratch) {
  if (logits.empty() || logits.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()) ||
      !ValidTokenSampling(params)) {
    return -1;
  }
  constexpr float kInf = std::numeric_limits<float>::infinity();
  size_t first_max = 0;
  float max = logits[0];
  bool nan_or_inf = false;  // NaN and +inf both fail v < inf
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    nan_or_inf |= !(v < kInf);
    if (v > max) {  // strict: ties keep the lowest id
      max = v;
      first_max = i;
    }
  }
  if (nan_or_inf || max == -kInf) return -1;
  if (params.temperature == 0 || params.top_k == 1) return static_cast<int32_t>(first_max);
  const float scale = 1.0f / params.temperature;

  std::vector<uint64_t>& masses = scratch.masses;
  if (params.top_k == 0 && params.top_p == 1) {  // every token kept
    masses.resize(logits.size());
    uint64_t total = 0;
    for (size_t i = 0; i < logits.size(); ++i) total += masses[i] = Mass(logits[i], max, scale);
    const uint64_t target = static_cast<uint64_t>(
        (static_cast<unsigned __int128>(UniformBitsForDraw(params.seed, params.draw)) * total) >> 53);
    return FirstPassing(masses, target);
  }

  std::vector<Candidate>& c = scratch.candidates;
  if (params.top_k > 0) {
    TopK(logits, static_cast<size_t>(params.top_k), c);
  } else {
    c.clear();
    for (size_t i = 0; i < logits.size(); ++i) {
      if (logits[i] != -kInf) c.push_back({logits[i], static_cast<int32_t>(i), 0});
    }
  }
  uint64_t total = 0;
  for (Candidate& x : c) total += x.mass = Mass(x.logit, max, scale);
  size_t kept = c.size();
  if (params.top_p < 1) {
    const uint64_t need = std::max<uint64_t>(
        1, static_cast<uint64_t>(static_cast<double>(params.top_p) * static_cast<double>(total)));
    kept = SmallestPrefixWeighing(c, need, scratch.bucket_mass);
  }
  masses.assign(logits.size(), 0);
  total = 0;
  for (size_t i = 0; i < kept; ++i) total += masses[c[i].token] = c[i].mass;
  const uint64_t target = static_cast<uint64_t>(
      (static_cast<unsigned __int128>(UniformBitsForDraw(params.seed, params.draw)) * total) >> 53);
  return FirstPassing(masses, target);
}

}  // namespace kiln
