// Initial weights for a Llama or GPT-2 model, a deterministic function of (config, seed):
// linear and embedding weights ~ N(0, 0.02); the output projections of each residual
// branch (o_proj, down_proj; GPT-2's c_proj) ~ N(0, 0.02 / sqrt(2 * layers)) as in GPT-2;
// norm weights 1, biases 0 (GPT-2's), and GPT-2's padding rows of wte 0.
#pragma once

#include <cstdint>
#include <vector>

#include "frontends/model_config.h"
#include "ir/host_tensor.h"

namespace kiln {

// In ModelWeights(config) order (frontends/gpt2.h), f32.
std::vector<HostTensor> InitModelWeights(const ModelConfig& config, uint64_t seed);
// The same, named for the Llama callers.
std::vector<HostTensor> InitLlamaWeights(const ModelConfig& config, uint64_t seed);

}  // namespace kiln
