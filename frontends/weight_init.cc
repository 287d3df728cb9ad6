#include "frontends/weight_init.h"

#include <cmath>
#include <numbers>
#include <random>

#include "absl/strings/match.h"
#include "frontends/llama.h"

namespace kiln {
namespace {

// Box-Muller over a fixed engine, so the weights are the same on every platform
// (std::normal_distribution's algorithm is left to the library).
class NormalSampler {
 public:
  explicit NormalSampler(uint64_t seed) : engine_(seed) {}
  double Next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = (static_cast<double>(engine_() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    double u2 = static_cast<double>(engine_() >> 11) * 0x1.0p-53;          // [0, 1)
    double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2.0 * std::numbers::pi * u2);
    has_spare_ = true;
    return r * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  std::mt19937_64 engine_;
  double spare_ = 0;
  bool has_spare_ = false;
};

}  // namespace

std::vector<HostTensor> InitLlamaWeights(const ModelConfig& config, uint64_t seed) {
  NormalSampler normal(seed);
  const double std_dev = 0.02;
  const double residual_std = std_dev / std::sqrt(2.0 * static_cast<double>(config.n_layers));
  std::vector<HostTensor> weights;
  for (const WeightSpec& spec : LlamaWeights(config)) {
    TensorType type{DType::kF32, spec.shape};
    std::vector<double> values(type.num_elements());
    if (absl::EndsWith(spec.name, "norm.weight")) {
      std::fill(values.begin(), values.end(), 1.0);
    } else {
      bool residual_out = absl::EndsWith(spec.name, "o_proj.weight") || absl::EndsWith(spec.name, "down_proj.weight");
      double s = residual_out ? residual_std : std_dev;
      for (double& v : values) v = s * normal.Next();
    }
    weights.push_back(HostTensor::FromValues(type, std::move(values)));
  }
  return weights;
}

}  // namespace kiln
