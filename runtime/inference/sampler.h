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
#include "ir/token_sampling.h"
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

// A row of a batch to sample: its logits, its request's parameters, the draw's index.
struct SampleRequest {
  absl::Span<const float> logits;
  SamplingParams params;
  int64_t draw = 0;
};

// Each row's token as Sampler::Sample draws it (the same tokens at any thread count, in any
// order), the rows spread over ThreadPool::Shared(threads) (0: the machine's cores), each
// thread with a sampler of its own: a decode step of 32 sampled requests over 32000 tokens is
// a million weights to compute, milliseconds on one core against a GPU step of about 1.5.
std::vector<absl::StatusOr<TokenId>> SampleRows(absl::Span<const SampleRequest> rows, int threads = 0);

}  // namespace kiln::inference
