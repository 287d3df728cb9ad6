#include "runtime/inference/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "ir/status_macros.h"

namespace kiln::inference {
namespace {

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

}  // namespace

absl::Status ValidateSamplingParams(const SamplingParams& params) {
  if (!(params.temperature >= 0) || !std::isfinite(static_cast<float>(params.temperature))) {
    return absl::InvalidArgumentError(absl::StrCat("sampling: temperature is ", params.temperature,
                                                   "; it must be a finite number >= 0 (0 = greedy), at most ",
                                                   std::numeric_limits<float>::max()));
  }
  if (params.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling: top_k is ", params.top_k, "; it must be >= 0 (0 = no limit)"));
  }
  if (!(static_cast<float>(params.top_p) > 0 && params.top_p <= 1)) {  // written so that NaN fails
    return absl::InvalidArgumentError(absl::StrCat("sampling: top_p is ", params.top_p, "; it must be in (0, 1]"));
  }
  return absl::OkStatus();
}

double UniformForDraw(uint64_t seed, int64_t draw) {
  return static_cast<double>(UniformBitsForDraw(seed, draw)) * 0x1.0p-53;  // exactly representable, below 1
}

TokenSampling ToTokenSampling(const SamplingParams& params, int64_t draw) {
  return {static_cast<float>(params.temperature), params.top_k, static_cast<float>(params.top_p), params.seed, draw};
}

absl::StatusOr<TokenId> Sampler::Sample(absl::Span<const float> logits, const SamplingParams& params, int64_t draw) {
  RETURN_IF_ERROR(ValidateSamplingParams(params));
  if (draw < 0) return absl::InvalidArgumentError(absl::StrCat("sampling: draw index is ", draw, "; it must be >= 0"));
  const int32_t token = SampleToken(logits, ToTokenSampling(params, draw), scratch_);
  if (token >= 0) return token;
  RETURN_IF_ERROR(CheckLogits(logits));  // which logit
  return absl::InternalError("sampling: no token drawn from valid logits and parameters");
}

}  // namespace kiln::inference
