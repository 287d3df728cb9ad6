// TrainingSession (frontends/training_session.h): a model written with the tensor API,
// trained from its @forward alone on the CPU reference backend, and its checkpoints.
// (tests/gpu_training_test.cc trains the same kind of model on CUDA against this backend.)
#include "frontends/training_session.h"

#include <gtest/gtest.h>

#include <cmath>

#include "absl/strings/match.h"
#include "runtime/safetensors.h"
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
  const std::vector<double> w = (*(*session)->Params())[0].values();
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
  EXPECT_NE((*(*session)->Params())[0].values(), HostTensor::Random({DType::kF32, {1, 3}}, 7).values());
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
  EXPECT_TRUE(absl::StrContains(wrong_shape.status().message(), "initial weight 0 %w must be f32[1,3], got f32[3,1]"))
      << wrong_shape.status();

  auto session = TrainingSession::Create(LinearRegression(), {HostTensor({DType::kF32, {1, 3}})});
  ASSERT_TRUE(session.ok()) << session.status();
  std::vector<HostTensor> batch = Batch(1);
  batch[1] = HostTensor({DType::kF32, {kRows}});
  absl::StatusOr<double> loss = (*session)->Step(batch, 0.01);
  ASSERT_FALSE(loss.ok());
  EXPECT_TRUE(absl::StrContains(loss.status().message(), "data input 1 %y must be f32[16,1], got f32[16]"))
      << loss.status();
  // The session is still usable after a refused step.
  EXPECT_TRUE((*session)->Step(Batch(1), 0.01).ok());
  EXPECT_EQ((*session)->steps_done(), 1);
}

TEST(TrainingSession, CudaWithoutAGpuSaysWhy) {
  if (CudaBackendAvailable().ok()) GTEST_SKIP() << "a GPU is usable here: tests/gpu_training_test.cc covers it";
  TrainingSessionOptions options = NoDecay();
  options.backend = Backend::kCuda;
  auto session = TrainingSession::Create(LinearRegression(), {HostTensor({DType::kF32, {1, 3}})}, options);
  ASSERT_FALSE(session.ok());
  EXPECT_EQ(session.status().code(), absl::StatusCode::kFailedPrecondition) << session.status();
  EXPECT_TRUE(absl::StrContains(session.status().message(), "backend cuda: ")) << session.status();
}

// Save, then Load into a fresh session: the state comes back bit for bit, and the resumed
// session's next steps are the uninterrupted session's.
TEST(TrainingSession, CheckpointRoundTripResumesExactly) {
  const std::string path = ::testing::TempDir() + "/kiln_session_ckpt.safetensors";
  auto a = TrainingSession::Create(LinearRegression(), {HostTensor::Random({DType::kF32, {1, 3}}, 7)}, NoDecay());
  ASSERT_TRUE(a.ok()) << a.status();
  for (int step = 0; step < 3; ++step) ASSERT_TRUE((*a)->Step(Batch(step), 0.05).ok());
  ASSERT_TRUE((*a)->Save(path, {{"note", "three steps"}}).ok());

  // The file: the weight under its @forward name, the moments, t, the step count.
  absl::StatusOr<Safetensors> file = ReadSafetensorsFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::string> names;
  for (const NamedTensor& t : file->tensors) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"w", "adamw.m.w", "adamw.v.w", "adamw.t"}));
  EXPECT_EQ(file->metadata.at("kiln.step"), "3");

  auto b = TrainingSession::Create(LinearRegression(), {HostTensor({DType::kF32, {1, 3}})}, NoDecay());
  ASSERT_TRUE(b.ok()) << b.status();
  absl::StatusOr<std::map<std::string, std::string>> metadata = (*b)->Load(path);
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  EXPECT_EQ(metadata->at("note"), "three steps");
  EXPECT_EQ((*b)->steps_done(), 3);
  TrainingState sa = *(*a)->State(), sb = *(*b)->State();
  EXPECT_EQ(sa.params[0].values(), sb.params[0].values());
  EXPECT_EQ(sa.m[0].values(), sb.m[0].values());
  EXPECT_EQ(sa.v[0].values(), sb.v[0].values());
  EXPECT_EQ(sa.t.values(), sb.t.values());
  EXPECT_NE(sa.m[0].values(), HostTensor({DType::kF32, {1, 3}}).values());  // the moments are not zeros
  for (int step = 3; step < 6; ++step) {
    absl::StatusOr<double> la = (*a)->Step(Batch(step), 0.05), lb = (*b)->Step(Batch(step), 0.05);
    ASSERT_TRUE(la.ok() && lb.ok());
    EXPECT_EQ(*la, *lb) << "step " << step + 1;
  }
  EXPECT_EQ((*(*a)->Params())[0].values(), (*(*b)->Params())[0].values());
}

// A checkpoint of another model is refused, naming the tensor, and the session is unchanged.
TEST(TrainingSession, LoadRefusesAnotherModelsCheckpoint) {
  const std::string path = ::testing::TempDir() + "/kiln_session_other.safetensors";
  auto module = std::make_unique<Module>("other");
  Graph g(module->AddFunction("forward"));
  Tensor x = g.Parameter("x", {DType::kF32, {kRows, 3}});
  Tensor y = g.Parameter("y", {DType::kF32, {kRows, 1}});
  Tensor w = g.Parameter("w", {DType::kF32, {2, 3}});  // same name, another shape
  Tensor err = Reshape(ReduceSum(Linear(x, w, DType::kF32), {1}), {kRows, 1}) - y;
  ASSERT_TRUE(g.Finish({ReduceSum(err * err, {0, 1})}).ok());
  auto other = TrainingSession::Create(std::move(module), {HostTensor({DType::kF32, {2, 3}})}, NoDecay());
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_TRUE((*other)->Save(path).ok());

  auto session = TrainingSession::Create(LinearRegression(), {HostTensor::Random({DType::kF32, {1, 3}}, 7)}, NoDecay());
  ASSERT_TRUE(session.ok()) << session.status();
  absl::StatusOr<std::map<std::string, std::string>> loaded = (*session)->Load(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_TRUE(absl::StrContains(loaded.status().message(), "tensor 'w' is f32[2,3], expected f32[1,3]"))
      << loaded.status();
  EXPECT_EQ((*(*session)->Params())[0].values(), HostTensor::Random({DType::kF32, {1, 3}}, 7).values());

  // A file that is not a session checkpoint at all.
  Safetensors plain;
  plain.tensors.push_back({"w", HostTensor({DType::kF32, {1, 3}})});
  ASSERT_TRUE(WriteSafetensorsFile(path, plain).ok());
  loaded = (*session)->Load(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_TRUE(absl::StrContains(loaded.status().message(), "not a kiln training checkpoint")) << loaded.status();
}

// Data of any dtype: i32 class labels, a cross-entropy over a linear classifier's logits.
TEST(TrainingSession, TrainsOnIntegerData) {
  auto module = std::make_unique<Module>("classifier");
  Graph g(module->AddFunction("forward"));
  Tensor x = g.Parameter("x", {DType::kF32, {kRows, 3}});
  Tensor labels = g.Parameter("labels", {DType::kI32, {kRows}});
  Tensor w = g.Parameter("w", {DType::kF32, {4, 3}});
  ASSERT_TRUE(g.Finish({CrossEntropyLoss(Reshape(Linear(x, w, DType::kF32), {1, kRows, 4}),
                                         Reshape(labels, {1, kRows}))})
                  .ok());
  auto session = TrainingSession::Create(std::move(module), {HostTensor({DType::kF32, {4, 3}})}, NoDecay());
  ASSERT_TRUE(session.ok()) << session.status();
  // The label is the index of x's largest coordinate, or 3 when all are negative.
  auto batch = [](uint64_t seed) {
    HostTensor x = HostTensor::Random({DType::kF32, {kRows, 3}}, seed);
    std::vector<double> labels(kRows);
    for (int64_t i = 0; i < kRows; ++i) {
      int best = 0;
      for (int j = 1; j < 3; ++j) best = x[3 * i + j] > x[3 * i + best] ? j : best;
      labels[i] = x[3 * i + best] < 0 ? 3 : best;
    }
    return std::vector<HostTensor>{x, HostTensor::FromValues({DType::kI32, {kRows}}, labels)};
  };
  double first = 0, last = 0;
  for (int step = 0; step < 100; ++step) {
    absl::StatusOr<double> loss = (*session)->Step(batch(step), 0.05);
    ASSERT_TRUE(loss.ok()) << loss.status();
    (step == 0 ? first : last) = *loss;
  }
  EXPECT_LT(last, first / 2);
}

}  // namespace
}  // namespace kiln
