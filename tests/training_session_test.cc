// TrainingSession (frontends/training_session.h): a model written with the tensor API,
// trained from its @forward alone on the CPU reference backend.
#include "frontends/training_session.h"

#include <gtest/gtest.h>

#include <cmath>

#include "absl/strings/match.h"
#include "frontends/nn.h"
#include "frontends/tensor.h"

namespace kiln {
namespace {

constexpr int64_t kRows = 16;

// @forward(x f32[16,3], y f32[16,1], w f32[1,3]) = mean((x wᵀ - y)²).
std::unique_ptr<Module> LinearRegression() {
  auto module = std::make_unique<Module>("regression");
  Graph g(module->AddFunction("forward"));
  Tensor x = g.Parameter("x", {DType::kF32, {kRows, 3}});
  Tensor y = g.Parameter("y", {DType::kF32, {kRows, 1}});
  Tensor w = g.Parameter("w", {DType::kF32, {1, 3}});
  Tensor err = Linear(x, w, DType::kF32) - y;
  EXPECT_TRUE(g.Finish({ReduceSum(err * err, {0, 1}) / static_cast<double>(kRows)}).ok());
  return module;
}

// y = x · (1, -2, 0.5) on random x.
std::vector<HostTensor> Batch(uint64_t seed) {
  HostTensor x = HostTensor::Random({DType::kF32, {kRows, 3}}, seed);
  std::vector<double> y(kRows);
  for (int64_t i = 0; i < kRows; ++i) y[i] = x[3 * i] - 2 * x[3 * i + 1] + 0.5 * x[3 * i + 2];
  return {x, HostTensor::FromValues({DType::kF32, {kRows, 1}}, y)};
}

TrainingSessionOptions NoDecay() {
  TrainingSessionOptions options;
  options.step.adamw.weight_decay = 0.0;
  return options;
}

TEST(TrainingSession, LearnsALinearRegression) {
  auto session = TrainingSession::Create(LinearRegression(), {HostTensor({DType::kF32, {1, 3}})}, NoDecay());
  ASSERT_TRUE(session.ok()) << session.status();
  double first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    absl::StatusOr<double> loss = (*session)->Step(Batch(step), 0.05);
    ASSERT_TRUE(loss.ok()) << loss.status();
    (step == 0 ? first : last) = *loss;
  }
  EXPECT_EQ((*session)->steps_done(), 200);
  EXPECT_LT(last, first / 100);
  const std::vector<double>& w = (*session)->params()[0].values();
  EXPECT_NEAR(w[0], 1.0, 0.05);
  EXPECT_NEAR(w[1], -2.0, 0.05);
  EXPECT_NEAR(w[2], 0.5, 0.05);
  // Forward evaluates the trained weights on new data.
  absl::StatusOr<std::vector<HostTensor>> held_out = (*session)->Forward(Batch(1000));
  ASSERT_TRUE(held_out.ok()) << held_out.status();
  EXPECT_LT((*held_out)[0][0], first / 100);
}

TEST(TrainingSession, StepReturnsTheLossBeforeTheUpdate) {
  auto session = TrainingSession::Create(LinearRegression(), {HostTensor::Random({DType::kF32, {1, 3}}, 7)}, NoDecay());
  ASSERT_TRUE(session.ok()) << session.status();
  absl::StatusOr<std::vector<HostTensor>> before = (*session)->Forward(Batch(1));
  ASSERT_TRUE(before.ok()) << before.status();
  absl::StatusOr<double> loss = (*session)->Step(Batch(1), 0.01);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_DOUBLE_EQ(*loss, (*before)[0][0]);
  EXPECT_NE((*session)->params()[0].values(), HostTensor::Random({DType::kF32, {1, 3}}, 7).values());
}

TEST(TrainingSession, AccumulatesMicroBatches) {
  TrainingSessionOptions options = NoDecay();
  options.step.accum_steps = 2;
  auto session = TrainingSession::Create(LinearRegression(), {HostTensor::Random({DType::kF32, {1, 3}}, 7)}, options);
  ASSERT_TRUE(session.ok()) << session.status();
  double mean = 0;
  for (uint64_t seed : {1, 2}) mean += (*(*session)->Forward(Batch(seed)))[0][0] / 2;
  absl::StatusOr<double> loss = (*session)->Step({Batch(1), Batch(2)}, 0.01);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(*loss, mean, 1e-6 * mean);
  absl::StatusOr<double> one = (*session)->Step(Batch(1), 0.01);
  EXPECT_FALSE(one.ok());
  EXPECT_TRUE(absl::StrContains(one.status().message(), "2 micro-batches")) << one.status();
}

TEST(TrainingSession, ErrorsNameWhatIsWrong) {
  auto no_forward = TrainingSession::Create(std::make_unique<Module>("empty"), {});
  ASSERT_FALSE(no_forward.ok());
  EXPECT_TRUE(absl::StrContains(no_forward.status().message(), "no @forward")) << no_forward.status();

  auto no_weights = TrainingSession::Create(LinearRegression(), {});
  ASSERT_FALSE(no_weights.ok());
  EXPECT_TRUE(absl::StrContains(no_weights.status().message(), "0 initial weights")) << no_weights.status();

  auto wrong_shape = TrainingSession::Create(LinearRegression(), {HostTensor({DType::kF32, {3, 1}})});
  ASSERT_FALSE(wrong_shape.ok());
  EXPECT_TRUE(absl::StrContains(wrong_shape.status().message(), "f32[1,3]")) << wrong_shape.status();

  auto session = TrainingSession::Create(LinearRegression(), {HostTensor({DType::kF32, {1, 3}})});
  ASSERT_TRUE(session.ok()) << session.status();
  std::vector<HostTensor> batch = Batch(1);
  batch[1] = HostTensor({DType::kF32, {kRows}});
  absl::StatusOr<double> loss = (*session)->Step(batch, 0.01);
  ASSERT_FALSE(loss.ok());
  EXPECT_TRUE(absl::StrContains(loss.status().message(), "%y must be f32[16,1]")) << loss.status();
  // The session is still usable after a refused step.
  EXPECT_TRUE((*session)->Step(Batch(1), 0.01).ok());
  EXPECT_EQ((*session)->steps_done(), 1);
}

}  // namespace
}  // namespace kiln
