// Drawing the next token from a row of logits: the meaning of the sample_tokens op
// (ir/op_table.h), in one place. The reference backend evaluates the op with it, the host's
// Sampler (runtime/inference/sampler.h) draws with it, and the GPU kernel
// (kernels/sampling.cuh) computes the same steps, so that a seed draws the same tokens on
// either backend.
//
// A row's draw:
//   1. Greedy (temperature 0, or top_k 1): the first index of the largest logit.
//   2. Each token's weight w = f32 exp(f32(f32(logit - max) * scale)), scale = f32(1 /
//      temperature): the most likely token weighs 1, a -inf logit 0. Its mass is w in fixed
//      point, Q = round-to-nearest-even(w * 2^kMassBits), an integer. Sums of masses are exact
//      in any order, which is what lets a GPU block sum them in parallel and still cut and
//      draw exactly where the host does. (Tokens lighter than 2^-41 of the most likely one
//      have mass 0 and are never drawn: together less than V * 2^-41 of the probability.)
//   3. The order "larger logit, then lower token id" ranks the tokens. top_k > 0 keeps the
//      top_k first of it. top_p < 1 then keeps the fewest first of those whose mass reaches
//      need = max(1, u64(f64(top_p) * f64(kept mass))). Either way the kept tokens are those
//      ranked at or before a cut token.
//   4. u = UniformBitsForDraw(seed, draw), 53 bits; target = floor(u * total / 2^53), total
//      the kept tokens' mass; the token is the first kept one, in token id order, whose
//      running mass passes target. The most likely token is always kept and weighs 2^40, so
//      total > target and some token passes it.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace kiln {

inline constexpr int kSamplingMassBits = 40;

// One row's sampling parameters as the op takes them (f32 temperature and top_p, as the
// sampling operand holds them).
struct TokenSampling {
  float temperature = 1;  // >= 0; 0 is greedy
  int64_t top_k = 0;      // >= 0; 0 keeps every token
  float top_p = 1;        // (0, 1]
  uint64_t seed = 0;
  int64_t draw = 0;  // >= 0: the request's draw index (its output position)
};

// A row's parameters as the op's operands hold them: sampling f32 (temperature, top_k,
// top_p) and draws i32 (the seed's low and high 32 bits, the draw index). top_k is held as an
// f32 whole number (a top_k above 2^24, more than any vocabulary, is held as 2^24); the draw
// index must fit an i32.
struct TokenSamplingOperands {
  float sampling[3];
  int32_t draws[3];
};
TokenSamplingOperands ToOperands(const TokenSampling& params);
// The inverse; a top_k that is not a whole number, or is negative, reads as -1 (out of range).
TokenSampling FromOperands(const float sampling[3], const int32_t draws[3]);

// The 53 random bits of draw `draw` of a request seeded with `seed` (a counter-based
// generator: a function of the pair alone). The uniform in [0, 1) is bits * 2^-53.
uint64_t UniformBitsForDraw(uint64_t seed, int64_t draw);

// Whether `params` are in range: temperature finite and >= 0, top_k >= 0, top_p in (0, 1],
// draw >= 0. The op draws -1 for a row that is not (the host's Sampler names the field).
bool ValidTokenSampling(const TokenSampling& params);

// What SampleToken reuses between calls (no allocation per token).
struct TokenSamplingScratch {
  struct Candidate {
    float logit;
    int32_t token;
    uint64_t mass;
  };
  std::vector<Candidate> candidates;
  std::vector<uint64_t> bucket_mass;
  std::vector<uint64_t> masses;
};

// The token drawn from `logits` (one per vocabulary entry), as the header describes; -1 when
// none can be: no logits, a NaN or +inf logit, every logit -inf, more logits than an i32 can
// index, or parameters out of range. Linear in the vocabulary.
int32_t SampleToken(absl::Span<const float> logits, const TokenSampling& params, TokenSamplingScratch& scratch);

}  // namespace kiln
