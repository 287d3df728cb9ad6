#include "frontends/weight_init.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>

#include "absl/strings/match.h"
#include "frontends/llama.h"
#include "runtime/thread_pool.h"

namespace kiln {
namespace {

// Box-Muller over a fixed engine, so the weights are the same on every platform
// (std::normal_distribution's algorithm is left to the library). The engine's outputs are
// drawn in order, which is cheap; the transform, which is not (log, sqrt, sin, cos), runs
// on many threads over disjoint pairs. The values are those of drawing them one by one:
// pair k gives r cos(theta), then r sin(theta).
class NormalSampler {
 public:
  explicit NormalSampler(uint64_t seed) : engine_(seed) {}

  // out[i] = scale * (the next normal), for i < n.
  void Fill(double* out, int64_t n, double scale) {
    int64_t i = 0;
    if (has_spare_ && n > 0) {
      out[i++] = scale * spare_;
      has_spare_ = false;
    }
    constexpr int64_t kChunkPairs = int64_t{1} << 20;
    std::vector<uint64_t> draws;
    while (i < n) {
      const int64_t pairs = std::min<int64_t>(kChunkPairs, (n - i + 1) / 2);
      draws.resize(2 * pairs);
      for (uint64_t& d : draws) d = engine_();
      const int64_t first = i;
      const bool odd_end = first + 2 * pairs > n;  // the last pair's second value is kept as the spare
      double spare = 0;
      ThreadPool::Shared(0).ParallelFor(pairs, 4096, [&](int64_t begin, int64_t end) {
        for (int64_t k = begin; k < end; ++k) {
          const double u1 = (static_cast<double>(draws[2 * k] >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
          const double u2 = static_cast<double>(draws[2 * k + 1] >> 11) * 0x1.0p-53;      // [0, 1)
          const double r = std::sqrt(-2.0 * std::log(u1));
          const double a = 2.0 * std::numbers::pi * u2;
          out[first + 2 * k] = scale * (r * std::cos(a));
          if (first + 2 * k + 1 < n) {
            out[first + 2 * k + 1] = scale * (r * std::sin(a));
          } else {
            spare = r * std::sin(a);
          }
        }
      });
      i += 2 * pairs;
      if (odd_end) {
        has_spare_ = true;
        spare_ = spare;
      }
    }
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
      normal.Fill(values.data(), static_cast<int64_t>(values.size()), residual_out ? residual_std : std_dev);
    }
    weights.push_back(HostTensor::FromValues(type, std::move(values)));
  }
  return weights;
}

}  // namespace kiln
