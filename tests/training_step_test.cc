// The training step (passes/training_step.h) against hand-computed AdamW, clipping and
// accumulation, on the CPU reference backend; and llama-tiny training end to end.
#include <gtest/gtest.h>

#include <cmath>

#include "frontends/llama.h"
#include "frontends/trainer.h"
#include "frontends/weight_init.h"
#include "ir/builder.h"
#include "ir/verifier.h"
#include "passes/training_step.h"
#include "ir/reference_backend.h"
#include "runtime/training/dataset.h"

namespace kiln {
namespace {

// @forward(x: f32[3] batch input, w: f32[1,3], b: f32[3]) = sum(0.5 w^2 * x) + sum(0.5 b^2)
// so dloss/dw = w * x and dloss/db = b.
std::unique_ptr<Module> QuadraticModule() {
  auto m = std::make_unique<Module>("quadratic");
  Builder b(m->AddFunction("forward"));
  Node* x = *b.Parameter("x", {DType::kF32, {3}});
  Node* w = *b.Parameter("w", {DType::kF32, {1, 3}});
  Node* bias = *b.Parameter("b", {DType::kF32, {3}});
  Node* half = *b.BroadcastScalar(*b.Constant(0.5, {DType::kF32, {}}), {1, 3});
  Node* xr = *b.Reshape(x, {1, 3});
  Node* lw = *b.ReduceSum(*b.Mul(*b.Mul(*b.Mul(w, w), half), xr), {0, 1});
  Node* half3 = *b.BroadcastScalar(*b.Constant(0.5, {DType::kF32, {}}), {3});
  Node* lb = *b.ReduceSum(*b.Mul(*b.Mul(bias, bias), half3), {0});
  EXPECT_TRUE(b.Return({*b.Add(lw, lb)}).ok());
  return m;
}

struct StepResult {
  double loss;
  std::vector<HostTensor> outputs;
};

StepResult RunStep(const TrainingStepOptions& options, const std::vector<std::vector<double>>& micro_xs,
                   const std::vector<double>& w, const std::vector<double>& bias, double lr) {
  std::unique_ptr<Module> m = QuadraticModule();
  TrainingStepLayout layout;
  absl::StatusOr<Function*> step = BuildTrainingStep(*m, *m->FindFunction("forward"), options, &layout);
  EXPECT_TRUE(step.ok()) << step.status();
  EXPECT_TRUE(VerifyModule(*m).ok()) << VerifyModule(*m);
  EXPECT_EQ(layout.num_params, 2);
  std::vector<double> xs;
  for (const auto& x : micro_xs) xs.insert(xs.end(), x.begin(), x.end());
  std::vector<HostTensor> args = {
      HostTensor::FromValues({DType::kF32, {1, 3}}, w), HostTensor::FromValues({DType::kF32, {3}}, bias),
      HostTensor({DType::kF32, {1, 3}}), HostTensor({DType::kF32, {3}}),  // m
      HostTensor({DType::kF32, {1, 3}}), HostTensor({DType::kF32, {3}}),  // v
      HostTensor({DType::kF32, {}}),                                      // t
      HostTensor::FromValues({DType::kF32, {static_cast<int64_t>(micro_xs.size()), 3}}, xs),
      HostTensor::FromValues({DType::kF32, {}}, {lr})};
  absl::StatusOr<std::vector<HostTensor>> out = EvaluateFunction(**step, args);
  EXPECT_TRUE(out.ok()) << out.status();
  return {(*out)[0][0], *out};
}

TrainingStepOptions Options(double clip, int64_t accum = 1) {
  TrainingStepOptions o;
  o.num_batch_inputs = 1;
  o.accum_steps = accum;
  o.adamw.clip_norm = clip;
  return o;
}

// torch.optim.AdamW's first step for one element, in double.
double AdamWFirstStep(double p, double g, double lr, double wd, const AdamWConfig& h) {
  double m = (1 - h.beta1) * g, v = (1 - h.beta2) * g * g;
  double bc1 = 1 - h.beta1, bc2 = 1 - h.beta2;
  return p * (1 - lr * wd) - (lr / bc1) * m / (std::sqrt(v) / std::sqrt(bc2) + h.eps);
}

TEST(TrainingStep, FirstAdamWStepMatchesTorchFormula) {
  const std::vector<double> w = {0.5, -1.0, 2.0}, bias = {0.25, -0.75, 1.5}, x = {1.0, 2.0, -0.5};
  const double lr = 0.01;
  TrainingStepOptions o = Options(/*clip=*/0);
  StepResult r = RunStep(o, {x}, w, bias, lr);
  // Outputs: loss, w', b', m_w, m_b, v_w, v_b, t'.
  ASSERT_EQ(r.outputs.size(), 8u);
  for (int i = 0; i < 3; ++i) {
    double gw = w[i] * x[i];
    EXPECT_NEAR(r.outputs[1][i], AdamWFirstStep(w[i], gw, lr, o.adamw.weight_decay, o.adamw), 1e-6) << i;
    // Rank-1 parameters (norm weights) are not decayed.
    EXPECT_NEAR(r.outputs[2][i], AdamWFirstStep(bias[i], bias[i], lr, 0.0, o.adamw), 1e-6) << i;
    EXPECT_NEAR(r.outputs[3][i], (1 - o.adamw.beta1) * gw, 1e-7);
    EXPECT_NEAR(r.outputs[5][i], (1 - o.adamw.beta2) * gw * gw, 1e-7);
  }
  EXPECT_EQ(r.outputs[7][0], 1.0);
  double loss = 0;
  for (int i = 0; i < 3; ++i) loss += 0.5 * w[i] * w[i] * x[i] + 0.5 * bias[i] * bias[i];
  EXPECT_NEAR(r.loss, loss, 1e-6);
}

TEST(TrainingStep, ClipsByGlobalNorm) {
  const std::vector<double> w = {3.0, 0.0, 0.0}, bias = {0.0, 4.0, 0.0}, x = {1.0, 1.0, 1.0};
  // Gradients: dw = (3, 0, 0), db = (0, 4, 0): global norm 5; clip to 1 scales by 1/5.
  StepResult r = RunStep(Options(/*clip=*/1.0), {x}, w, bias, 0.01);
  const double b1 = AdamWConfig{}.beta1;
  EXPECT_NEAR(r.outputs[3][0], (1 - b1) * 3.0 / (5.0 + 1e-6), 1e-6);
  EXPECT_NEAR(r.outputs[4][1], (1 - b1) * 4.0 / (5.0 + 1e-6), 1e-6);
  // Below the threshold nothing changes.
  StepResult unclipped = RunStep(Options(/*clip=*/10.0), {x}, w, bias, 0.01);
  EXPECT_NEAR(unclipped.outputs[3][0], (1 - b1) * 3.0, 1e-6);
}

TEST(TrainingStep, AccumulationAveragesMicroBatchGradients) {
  const std::vector<double> w = {0.5, -1.0, 2.0}, bias = {0.25, -0.75, 1.5};
  const std::vector<double> x1 = {1.0, 2.0, -0.5}, x2 = {-3.0, 0.5, 4.0};
  StepResult r = RunStep(Options(/*clip=*/0, /*accum=*/2), {x1, x2}, w, bias, 0.01);
  const double b1 = AdamWConfig{}.beta1;
  for (int i = 0; i < 3; ++i) {
    double mean_grad = w[i] * (x1[i] + x2[i]) / 2;
    EXPECT_NEAR(r.outputs[3][i], (1 - b1) * mean_grad, 1e-6) << i;
  }
}

TEST(TrainingStep, OutputsAreDonatedToTheirInputs) {
  std::unique_ptr<Module> m = QuadraticModule();
  TrainingStepLayout layout;
  Function* step = *BuildTrainingStep(*m, *m->FindFunction("forward"), Options(1.0), &layout);
  std::vector<int64_t> expected = {-1, 0, 1, 2, 3, 4, 5, 6};
  EXPECT_EQ(step->output_aliases(), expected);
  EXPECT_EQ(layout.lr_index(), 8);
}

TEST(TrainingStep, RejectsNonScalarLossAndBadAccumulation) {
  std::unique_ptr<Module> m = QuadraticModule();
  TrainingStepOptions o = Options(1.0, /*accum=*/0);
  absl::StatusOr<Function*> step = BuildTrainingStep(*m, *m->FindFunction("forward"), o);
  ASSERT_FALSE(step.ok());
  EXPECT_NE(step.status().message().find("accum_steps"), absl::string_view::npos);
}

// llama-tiny end to end on the reference backend: the loss falls, and the run is a
// deterministic function of the seed.
std::vector<double> TrainTiny(int steps, uint64_t seed) {
  ModelConfig config = *PresetConfig("llama-tiny");
  LlamaBuildOptions build{.batch = 4, .seq_len = 32, .precision = Precision::kBf16};
  std::unique_ptr<Module> m = *BuildLlamaModule(config, build);
  TrainingStepLayout layout;
  Function* step = *BuildTrainingStep(*m, *m->FindFunction("forward"), {}, &layout);
  auto trainer = *ReferenceTrainer::Create(std::move(m), step, layout, InitLlamaWeights(config, seed));
  TokenDataset data = TokenDataset::Default();
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    absl::StatusOr<double> loss = trainer->Step({SampleBatch(data, seed, i, 4, 32)}, 3e-3);
    EXPECT_TRUE(loss.ok()) << loss.status();
    losses.push_back(loss.ok() ? *loss : NAN);
  }
  return losses;
}

TEST(Trainer, LlamaTinyLossFallsAndRunsAreDeterministic) {
  std::vector<double> a = TrainTiny(20, 7);
  EXPECT_GT(a.front(), 5.0);  // ~ln(256) = 5.55 at initialisation
  EXPECT_LT(a.back(), a.front() - 1.0);
  std::vector<double> b = TrainTiny(3, 7);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a[i], b[i]) << i;
}

}  // namespace
}  // namespace kiln
