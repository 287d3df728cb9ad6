// A small model of a user's own, for the Compile API and TrainingSession tests on both
// backends: @forward(x f32[B,4], y f32[B,1], w1 f32[32,4], b1 f32[32], w2 f32[1,32], b2 f32[1])
// = mean((tanh(x w1ᵀ + b1) w2ᵀ + b2 - y)²), its GEMMs in `gemm_dtype` (f32, or bf16 with f32
// accumulation), and @predict(x, w1, b1, w2, b2) -> (prediction f32[B,1], hidden f32[B,32]).
#pragma once

#include <cmath>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "frontends/nn.h"
#include "frontends/tensor.h"
#include "ir/host_tensor.h"

namespace kiln::testing {

constexpr int64_t kMlpIn = 4, kMlpHidden = 32;

inline std::unique_ptr<Module> BuildMlp(int64_t batch, DType gemm_dtype = DType::kF32) {
  auto module = std::make_unique<Module>("mlp");
  auto body = [&](Tensor x, std::vector<Tensor> w) {
    Tensor h = Tanh(Linear(x, w[0], gemm_dtype) + BroadcastRow(w[1], {batch, kMlpHidden}));
    return std::make_pair(Linear(h, w[2], gemm_dtype) + BroadcastRow(w[3], {batch, 1}), h);
  };
  auto weights = [&](Graph& g) {
    return std::vector<Tensor>{g.Parameter("w1", {DType::kF32, {kMlpHidden, kMlpIn}}),
                               g.Parameter("b1", {DType::kF32, {kMlpHidden}}),
                               g.Parameter("w2", {DType::kF32, {1, kMlpHidden}}),
                               g.Parameter("b2", {DType::kF32, {1}})};
  };
  {
    Graph g(module->AddFunction("forward"));
    Tensor x = g.Parameter("x", {DType::kF32, {batch, kMlpIn}});
    Tensor y = g.Parameter("y", {DType::kF32, {batch, 1}});
    auto [prediction, hidden] = body(x, weights(g));
    Tensor error = prediction - y;
    EXPECT_TRUE(g.Finish({ReduceSum(error * error, {0, 1}) / static_cast<double>(batch)}).ok());
  }
  {
    Graph g(module->AddFunction("predict"));
    Tensor x = g.Parameter("x", {DType::kF32, {batch, kMlpIn}});
    auto [prediction, hidden] = body(x, weights(g));
    EXPECT_TRUE(g.Finish({prediction, hidden}).ok());
  }
  return module;
}

// Linear weights uniform in +-1/sqrt(fan_in), biases small and nonzero (so that their
// gradients and broadcasts are exercised from the first step).
inline std::vector<HostTensor> MlpWeights(uint64_t seed) {
  const double a = 1 / std::sqrt(static_cast<double>(kMlpIn)), b = 1 / std::sqrt(static_cast<double>(kMlpHidden));
  return {HostTensor::Random({DType::kF32, {kMlpHidden, kMlpIn}}, seed, -a, a),
          HostTensor::Random({DType::kF32, {kMlpHidden}}, seed + 1, -0.1, 0.1),
          HostTensor::Random({DType::kF32, {1, kMlpHidden}}, seed + 2, -b, b),
          HostTensor::Random({DType::kF32, {1}}, seed + 3, -0.1, 0.1)};
}

// (x, y) with y = sin(x0) + x1 x2 / 2 - x3² / 4, x uniform in [-2, 2).
inline std::vector<HostTensor> MlpBatch(int64_t batch, uint64_t seed) {
  HostTensor x = HostTensor::Random({DType::kF32, {batch, kMlpIn}}, seed, -2.0, 2.0);
  std::vector<double> y(batch);
  for (int64_t i = 0; i < batch; ++i) {
    const double* xi = &x.values()[i * kMlpIn];
    y[i] = std::sin(xi[0]) + xi[1] * xi[2] / 2 - xi[3] * xi[3] / 4;
  }
  return {x, HostTensor::FromValues({DType::kF32, {batch, 1}}, y)};
}

}  // namespace kiln::testing
