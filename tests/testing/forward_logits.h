// The logits of a Llama model's own @forward (frontends/llama.h) on the reference backend:
// what the inference functions' tests (tests/llama_inference_test.cc,
// tests/batched_prefill_test.cc) check every sampled token's logits against.
#pragma once

#include <vector>

#include "frontends/model_config.h"
#include "ir/host_tensor.h"
#include "passes/compile_options.h"
#include "runtime/inference/inference_types.h"

namespace kiln::testing {

// The logits [T][V] of @forward over `tokens` (batch 1, `weights` in LlamaWeights order) under
// `precision`. A failure to build or run is a test failure (and an empty result).
std::vector<std::vector<double>> ForwardLogits(const ModelConfig& config, const std::vector<HostTensor>& weights,
                                               const std::vector<inference::TokenId>& tokens, Precision precision);

}  // namespace kiln::testing
