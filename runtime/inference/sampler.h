// Picking the next token from a sequence's logits: greedy, temperature, top-k and top-p
// (nucleus), reproducibly. The random number of a draw is a function of (seed, draw index)
// alone (a counter-based generator, no state carried between calls), so the same seed and
// the same logits give the same tokens in any batch order, and a request that was
// preempted and recomputed draws what it would have drawn without the preemption.
//
// When to stop (EOS, max_new_tokens) is the scheduler's business, not the sampler's.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/inference/inference_types.h"

namespace kiln::inference {

struct SamplingParams {
  double temperature = 1.0;  // >= 0; 0 is greedy (argmax)
  int64_t top_k = 0;         // >= 0; keep the k most likely tokens, 0 = all
  double top_p = 1.0;        // (0, 1]; keep the fewest most likely tokens whose mass reaches top_p
  uint64_t seed = 0;
};

// Greedy: the first of the largest logits, no draw (temperature 0, or top_k 1).
inline bool IsGreedy(const SamplingParams& params) { return params.temperature == 0 || params.top_k == 1; }

// InvalidArgument, naming the field and its value, for a temperature that is negative or
// not finite, a negative top_k, or a top_p outside (0, 1] (NaN included).
absl::Status ValidateSamplingParams(const SamplingParams& params);

// The uniform number in [0, 1) of draw `draw` of a request seeded with `seed`.
double UniformForDraw(uint64_t seed, int64_t draw);

class Sampler {
 public:
  // The next token given `logits` (one per vocabulary entry). `draw` numbers the request's
  // draws (its output position), which makes the choice reproducible. Ties go to the lowest
  // token id. InvalidArgument for bad params, empty logits, a NaN or +inf logit, logits that
  // are all -inf, or a negative draw.
  absl::StatusOr<TokenId> Sample(absl::Span<const float> logits, const SamplingParams& params, int64_t draw);

 private:
  struct Candidate {
    float logit;
    TokenId token;
    double weight;  // exp((logit - max) / temperature), unnormalized
  };
  std::vector<Candidate> candidates_;  // reused between calls: no allocation per token
};

}  // namespace kiln::inference
