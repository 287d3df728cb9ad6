// Initial weights for a Llama model, a deterministic function of (config, seed):
// linear and embedding weights ~ N(0, 0.02); the output projections of each residual
// branch (o_proj, down_proj) ~ N(0, 0.02 / sqrt(2 * layers)) as in GPT-2; norm weights 1.
#pragma once

#include <cstdint>
#include <vector>

#include "frontends/model_config.h"
#include "ir/host_tensor.h"

namespace kiln {

// In LlamaWeights(config) order, f32.
std::vector<HostTensor> InitLlamaWeights(const ModelConfig& config, uint64_t seed);

}  // namespace kiln
