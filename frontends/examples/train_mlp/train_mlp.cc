// Trains a small model of your own with kiln's C++ API: an MLP (4 -> 32 -> 1, tanh) that
// learns y = sin(x0) + x1 * x2 / 2 - x3^2 / 4 from synthetic data, with AdamW. kiln
// differentiates the forward function and builds the whole training step (gradients,
// clipping, AdamW) as IR; TrainingSession compiles and runs that step on the CPU reference
// backend, or with --backend cuda on the GPU (one CUDA graph per step).
//   train_mlp [--backend cpu|cuda] [--save CHECKPOINT.safetensors]
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "frontends/nn.h"
#include "frontends/tensor.h"
#include "frontends/training_session.h"
#include "ir/host_tensor.h"

using kiln::DType;
using kiln::HostTensor;
using kiln::Tensor;
using kiln::TensorType;

constexpr int64_t kBatch = 128, kIn = 4, kHidden = 32;

// @forward(x, y, w1, b1, w2, b2) -> mean squared error. The first two parameters are the
// data of a step (TrainingSessionOptions::step.num_batch_inputs, 2 by default); the others
// are the weights the session trains, f32, Linear weights in the [out, in] layout.
absl::StatusOr<std::unique_ptr<kiln::Module>> BuildMlp() {
  auto module = std::make_unique<kiln::Module>("mlp");
  kiln::Graph g(module->AddFunction("forward"));
  Tensor x = g.Parameter("x", {DType::kF32, {kBatch, kIn}});
  Tensor y = g.Parameter("y", {DType::kF32, {kBatch, 1}});
  Tensor w1 = g.Parameter("w1", {DType::kF32, {kHidden, kIn}});
  Tensor b1 = g.Parameter("b1", {DType::kF32, {kHidden}});
  Tensor w2 = g.Parameter("w2", {DType::kF32, {1, kHidden}});
  Tensor b2 = g.Parameter("b2", {DType::kF32, {1}});
  Tensor h = kiln::Tanh(kiln::Linear(x, w1, DType::kF32) + kiln::BroadcastRow(b1, {kBatch, kHidden}));
  Tensor prediction = kiln::Linear(h, w2, DType::kF32) + kiln::BroadcastRow(b2, {kBatch, 1});
  Tensor error = prediction - y;
  Tensor loss = kiln::ReduceSum(error * error, {0, 1}) / static_cast<double>(kBatch);
  // The first error of the build, if any, names the op, the shapes and the line above.
  absl::Status built = g.Finish({loss});
  if (!built.ok()) return built;
  return module;
}

// A batch (x, y) of the function to learn, x uniform in [-2, 2).
std::vector<HostTensor> SyntheticBatch(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> uniform(-2.0, 2.0);
  std::vector<double> x(kBatch * kIn), y(kBatch);
  for (int64_t i = 0; i < kBatch; ++i) {
    double* xi = &x[i * kIn];
    for (int64_t j = 0; j < kIn; ++j) xi[j] = uniform(rng);
    y[i] = std::sin(xi[0]) + xi[1] * xi[2] / 2 - xi[3] * xi[3] / 4;
  }
  return {HostTensor::FromValues({DType::kF32, {kBatch, kIn}}, x), HostTensor::FromValues({DType::kF32, {kBatch, 1}}, y)};
}

int main(int argc, char** argv) {
  kiln::TrainingSessionOptions options;
  std::string save;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    absl::StatusOr<kiln::Backend> backend = kiln::ParseBackend(i + 1 < argc ? argv[i + 1] : "");
    if (arg == "--backend" && backend.ok()) {
      options.backend = *backend;
      ++i;
    } else if (arg == "--save" && i + 1 < argc) {
      save = argv[++i];
    } else {
      std::fprintf(stderr, "usage: train_mlp [--backend cpu|cuda] [--save CHECKPOINT.safetensors]\n");
      return 2;
    }
  }
  absl::StatusOr<std::unique_ptr<kiln::Module>> module = BuildMlp();
  if (!module.ok()) {
    std::fprintf(stderr, "%s\n", module.status().ToString().c_str());
    return 1;
  }
  // Initial weights in @forward's order: Linear weights uniform in +-1/sqrt(fan_in) (as
  // torch.nn.Linear), biases zero.
  std::vector<HostTensor> weights = {
      HostTensor::Random({DType::kF32, {kHidden, kIn}}, /*seed=*/1, -1 / std::sqrt(kIn), 1 / std::sqrt(kIn)),
      HostTensor({DType::kF32, {kHidden}}),
      HostTensor::Random({DType::kF32, {1, kHidden}}, /*seed=*/2, -1 / std::sqrt(kHidden), 1 / std::sqrt(kHidden)),
      HostTensor({DType::kF32, {1}}),
  };
  options.step.adamw.weight_decay = 0.0;  // AdamW's defaults otherwise (betas 0.9, 0.95; clip 1.0)
  absl::StatusOr<std::unique_ptr<kiln::TrainingSession>> session =
      kiln::TrainingSession::Create(*std::move(module), std::move(weights), options);
  if (!session.ok()) {
    std::fprintf(stderr, "%s\n", session.status().ToString().c_str());
    return 1;
  }

  std::mt19937_64 rng(1337);
  const std::vector<HostTensor> held_out = SyntheticBatch(rng);  // never trained on
  auto held_out_loss = [&]() -> double {
    absl::StatusOr<std::vector<HostTensor>> outputs = (*session)->Forward(held_out);  // @forward's loss
    if (!outputs.ok()) std::fprintf(stderr, "held-out: %s\n", outputs.status().ToString().c_str());
    return outputs.ok() ? (*outputs)[0][0] : NAN;
  };
  const double before = held_out_loss();
  std::printf("mlp: %lld -> %lld -> 1, batch %lld, AdamW lr 0.01, backend %s\n", static_cast<long long>(kIn),
              static_cast<long long>(kHidden), static_cast<long long>(kBatch),
              options.backend == kiln::Backend::kCuda ? "cuda" : "cpu (reference)");
  constexpr int kSteps = 300;
  for (int step = 1; step <= kSteps; ++step) {
    absl::StatusOr<double> loss = (*session)->Step(SyntheticBatch(rng), /*lr=*/0.01);  // a fresh batch each step
    if (!loss.ok()) {
      std::fprintf(stderr, "step %d: %s\n", step, loss.status().ToString().c_str());
      return 1;
    }
    if (step == 1 || step % 25 == 0) std::printf("step %3d  loss %.4f\n", step, *loss);
  }
  std::printf("held-out loss: %.4f before training, %.4f after\n", before, held_out_loss());
  if (!save.empty()) {
    // The weights and AdamW state, by @forward's parameter names; Load resumes from them.
    absl::Status saved = (*session)->Save(save);
    if (!saved.ok()) {
      std::fprintf(stderr, "%s\n", saved.ToString().c_str());
      return 1;
    }
    std::fprintf(stderr, "saved step %lld to %s\n", static_cast<long long>((*session)->steps_done()), save.c_str());
  }
}
