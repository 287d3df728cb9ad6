// Picking the next token from a sequence's logits: greedy, temperature, top-k and top-p
// (nucleus), reproducibly. The random number of a draw is a function of (seed, draw index)
// alone (a counter-based generator, no state carried between calls), so the same seed and
// the same logits give the same tokens in any batch order, and a request that was
// preempted and recomputed draws what it would have drawn without the preemption.
//
// When to stop (EOS, max_new_tokens) is the scheduler's business, not the sampler's.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ir/token_sampling.h"
#include "runtime/inference/inference_types.h"

namespace kiln::inference {

struct SamplingParams {
  double temperature = 1.0;  // >= 0; 0 is greedy (argmax)
  int64_t top_k = 0;         // >= 0; keep the k most likely tokens, 0 = all
  double top_p = 1.0;        // (0, 1]; keep the fewest most likely tokens whose mass reaches top_p
  uint64_t seed = 0;
};

// InvalidArgument, naming the field and its value, for a temperature that is negative or
// not a finite f32, a negative top_k, or a top_p outside (0, 1] (NaN included) or 0 in f32.
absl::Status ValidateSamplingParams(const SamplingParams& params);

// The uniform number in [0, 1) of draw `draw` of a request seeded with `seed`.
double UniformForDraw(uint64_t seed, int64_t draw);

// Draws with SampleToken (ir/token_sampling.h, the sample_tokens op's meaning: a GPU's decode
// step draws the same tokens), adding what a caller needs to hear: which parameter or logit
// is wrong. Linear in the vocabulary (a decode batch of 32 over 32000 tokens is a million
// logits a step, against a GPU step of about 1.5 ms).
class Sampler {
 public:
  // The next token given `logits` (one per vocabulary entry). `draw` numbers the request's
  // draws (its output position), which makes the choice reproducible. Which tokens top-k and
  // top-p keep is decided in the order "larger logit, then lower token id", so ties at a
  // cut go to the lowest ids (and a top_k of 1 is greedy). The temperature and top_p are
  // used at f32 precision, as the op holds them. InvalidArgument for bad params, empty
  // logits, a NaN or +inf logit, logits that are all -inf, or a negative draw.
  absl::StatusOr<TokenId> Sample(absl::Span<const float> logits, const SamplingParams& params, int64_t draw);

 private:
  TokenSamplingScratch scratch_;  // reused between calls: no allocation per token
};

// The parameters as the sample_tokens op takes them (f32 temperature and top_p).
TokenSampling ToTokenSampling(const SamplingParams& params, int64_t draw);

}  // namespace kiln::inference
