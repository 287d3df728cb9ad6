#include "frontends/weight_init.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/strings/match.h"
#include "frontends/gpt2.h"
#include "ir/thread_pool.h"

namespace kiln {
namespace {

// SplitMix64's finalizer: a bijection of 64-bit words that scatters neighbouring inputs.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// N(0, scale^2) samples by Box-Muller from a counter-based generator: pair k of tensor t
// draws its two uniforms from Mix(key_t + 2k) and Mix(key_t + 2k + 1). Every value is a
// function of (seed, tensor, index) alone, so the tensors fill on all cores at once and come
// out the same on every machine and for every thread count.
void FillNormal(double* out, int64_t n, uint64_t seed, uint64_t tensor, double scale) {
  const uint64_t key = Mix(Mix(seed) ^ (tensor * 0xd1b54a32d192ed03ull));
  ThreadPool::Shared(0).ParallelFor((n + 1) / 2, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const double u1 = (static_cast<double>(Mix(key + 2 * k) >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
      const double u2 = static_cast<double>(Mix(key + 2 * k + 1) >> 11) * 0x1.0p-53;      // [0, 1)
      const double r = std::sqrt(-2.0 * std::log(u1));
      const double a = 2.0 * std::numbers::pi * u2;
      out[2 * k] = scale * (r * std::cos(a));
      if (2 * k + 1 < n) out[2 * k + 1] = scale * (r * std::sin(a));
    }
  });
}

}  // namespace

std::vector<HostTensor> InitLlamaWeights(const ModelConfig& config, uint64_t seed) {
  return InitModelWeights(config, seed);
}

std::vector<HostTensor> InitModelWeights(const ModelConfig& config, uint64_t seed) {
  const double std_dev = 0.02;
  const double residual_std = std_dev / std::sqrt(2.0 * static_cast<double>(config.n_layers));
  std::vector<HostTensor> weights;
  uint64_t tensor = 0;
  for (const WeightSpec& spec : ModelWeights(config)) {
    ++tensor;
    TensorType type{DType::kF32, spec.shape};
    std::vector<double> values(type.num_elements());
    const bool gpt2_norm = absl::StrContains(spec.name, ".ln_");
    if (absl::EndsWith(spec.name, "norm.weight") || (gpt2_norm && absl::EndsWith(spec.name, ".weight"))) {
      std::fill(values.begin(), values.end(), 1.0);
    } else if (absl::EndsWith(spec.name, ".bias")) {
      std::fill(values.begin(), values.end(), 0.0);
    } else {
      bool residual_out = absl::EndsWith(spec.name, "o_proj.weight") || absl::EndsWith(spec.name, "down_proj.weight") ||
                          absl::EndsWith(spec.name, "c_proj.weight");
      FillNormal(values.data(), static_cast<int64_t>(values.size()), seed, tensor, residual_out ? residual_std : std_dev);
      if (spec.name == "transformer.wte.weight") {  // GPT-2's padding rows: zero, never read by the loss
        std::fill(values.begin() + config.vocab_size * config.d_model, values.end(), 0.0);
      }
    }
    weights.push_back(HostTensor::FromValues(type, std::move(values)));
  }
  return weights;
}

}  // namespace kiln
