// kiln::Compile (frontends/compile.h) on the CPU reference backend: a function of the user's
// own module compiled and run on host tensors, the errors that name the function, the input
// and the types, and the pipeline options. tests/gpu_training_test.cc compiles the same
// function for CUDA and compares it with this backend.
#include "frontends/compile.h"

#include <gtest/gtest.h>

#include <cmath>

#include "absl/strings/match.h"
#include "ir/text_format.h"
#include "tests/testing/mlp.h"

namespace kiln {
namespace {

using testing::BuildMlp;
using testing::MlpBatch;
using testing::MlpWeights;

constexpr int64_t kBatch = 8;

// @predict's inputs: x, then the weights.
std::vector<HostTensor> PredictInputs() {
  std::vector<HostTensor> inputs = {MlpBatch(kBatch, 5)[0]};
  for (HostTensor& w : MlpWeights(1)) inputs.push_back(std::move(w));
  return inputs;
}

bool HasOp(const Function& f, absl::string_view op) {
  return absl::StrContains(PrintFunction(f), absl::StrCat(" ", op, "("));
}

TEST(CompileApi, RunsAFunctionOfTheUsersModuleOnTheCpu) {
  std::unique_ptr<Module> module = BuildMlp(kBatch);
  const std::string before = PrintModule(*module);
  absl::StatusOr<std::unique_ptr<Executable>> exe = Compile(*module, "predict");
  ASSERT_TRUE(exe.ok()) << exe.status();
  EXPECT_EQ((*exe)->backend(), Backend::kCpu);
  EXPECT_EQ(PrintModule(*module), before) << "Compile must not change the caller's module";
  // The default pipelines ran on the copy: the GEMMs are the backend's gemm op.
  EXPECT_FALSE(HasOp((*exe)->function(), "dot_general")) << PrintFunction((*exe)->function());
  EXPECT_TRUE(HasOp((*exe)->function(), "gemm")) << PrintFunction((*exe)->function());
  EXPECT_EQ((*exe)->report().pipeline, "forward + default");

  const std::vector<HostTensor> in = PredictInputs();
  absl::StatusOr<std::vector<HostTensor>> out = (*exe)->Run(in);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 2u);
  EXPECT_EQ((*out)[0].type().ToString(), "f32[8,1]");
  EXPECT_EQ((*out)[1].type().ToString(), "f32[8,32]");
  // The MLP by hand, in double: f32 rounding is far inside 1e-5.
  const HostTensor &x = in[0], &w1 = in[1], &b1 = in[2], &w2 = in[3], &b2 = in[4];
  for (int64_t i = 0; i < kBatch; ++i) {
    double prediction = b2[0];
    for (int64_t j = 0; j < testing::kMlpHidden; ++j) {
      double pre = b1[j];
      for (int64_t k = 0; k < testing::kMlpIn; ++k) pre += x[i * testing::kMlpIn + k] * w1[j * testing::kMlpIn + k];
      const double h = std::tanh(pre);
      EXPECT_NEAR((*out)[1][i * testing::kMlpHidden + j], h, 1e-5) << "hidden " << i << "," << j;
      prediction += h * w2[j];
    }
    EXPECT_NEAR((*out)[0][i], prediction, 1e-5) << "row " << i;
  }
  // Runs again with other inputs: nothing of the first run is kept.
  std::vector<HostTensor> other = in;
  other[0] = MlpBatch(kBatch, 6)[0];
  absl::StatusOr<std::vector<HostTensor>> again = (*exe)->Run(other);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE((*again)[0].values(), (*out)[0].values());
}

// bf16 GEMMs: the compiled function (fused, narrowed) against the function as built, on the
// reference backend; the passes preserve meaning under the precision policy.
TEST(CompileApi, CompiledBf16FunctionMatchesTheFunctionAsBuilt) {
  std::unique_ptr<Module> module = BuildMlp(kBatch, DType::kBF16);
  absl::StatusOr<std::unique_ptr<Executable>> compiled = Compile(*module, "forward");
  ExecutableOptions as_built;
  as_built.passes = std::vector<std::string>{};
  absl::StatusOr<std::unique_ptr<Executable>> plain = Compile(*module, "forward", as_built);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->report().pipeline, "none");
  EXPECT_TRUE(HasOp((*plain)->function(), "dot_general"));
  std::vector<HostTensor> in = MlpBatch(kBatch, 3);
  for (HostTensor& w : MlpWeights(2)) in.push_back(std::move(w));
  absl::StatusOr<std::vector<HostTensor>> a = (*compiled)->Run(in), b = (*plain)->Run(in);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_GT((*b)[0][0], 0);
  EXPECT_NEAR((*a)[0][0], (*b)[0][0], 1e-6 * (*b)[0][0]);
}

TEST(CompileApi, InputErrorsNameTheFunctionTheInputAndTheTypes) {
  std::unique_ptr<Module> module = BuildMlp(kBatch);
  absl::StatusOr<std::unique_ptr<Executable>> exe = Compile(*module, "predict");
  ASSERT_TRUE(exe.ok()) << exe.status();
  std::vector<HostTensor> in = PredictInputs();

  std::vector<HostTensor> too_few(in.begin(), in.end() - 1);
  absl::StatusOr<std::vector<HostTensor>> out = (*exe)->Run(too_few);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(), "@predict takes 5 inputs (%x, %w1, %b1, %w2, %b2), given 4");

  std::vector<HostTensor> wrong_shape = in;
  wrong_shape[0] = HostTensor({DType::kF32, {kBatch, 3}});
  out = (*exe)->Run(wrong_shape);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(), "@predict input 0 (%x): expected f32[8,4], given f32[8,3]");

  std::vector<HostTensor> wrong_dtype = in;
  wrong_dtype[2] = HostTensor({DType::kBF16, {testing::kMlpHidden}});
  out = (*exe)->Run(wrong_dtype);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(), "@predict input 2 (%b1): expected f32[32], given bf16[32]");

  // The executable is still usable after refused runs.
  EXPECT_TRUE((*exe)->Run(in).ok());
}

TEST(CompileApi, UnknownFunctionListsTheModulesFunctions) {
  std::unique_ptr<Module> module = BuildMlp(kBatch);
  absl::StatusOr<std::unique_ptr<Executable>> exe = Compile(*module, "backward");
  ASSERT_FALSE(exe.ok());
  EXPECT_EQ(exe.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(exe.status().message(), "Compile: module @mlp has no function @backward (it has @forward, @predict)");
}

TEST(CompileApi, PipelineOptions) {
  std::unique_ptr<Module> module = BuildMlp(kBatch);
  ExecutableOptions options;
  options.passes = std::vector<std::string>{"lower-gemm"};
  absl::StatusOr<std::unique_ptr<Executable>> exe = Compile(*module, "predict", options);
  ASSERT_TRUE(exe.ok()) << exe.status();
  EXPECT_EQ((*exe)->report().pipeline, "lower-gemm");
  ASSERT_EQ((*exe)->report().passes.size(), 1u);
  EXPECT_FALSE(HasOp((*exe)->function(), "dot_general"));
  EXPECT_FALSE(HasOp((*exe)->function(), "fusion")) << "only the named pass runs";

  options.passes = std::vector<std::string>{"no-such-pass"};
  exe = Compile(*module, "predict", options);
  ASSERT_FALSE(exe.ok());
  EXPECT_TRUE(absl::StrContains(exe.status().message(), "Compile @predict: unknown pass 'no-such-pass'"))
      << exe.status();

  // Disabling a pass of the default pipeline by name.
  ExecutableOptions no_fusion;
  no_fusion.compile.disabled_passes = {"fuse-loops"};
  exe = Compile(*module, "predict", no_fusion);
  ASSERT_TRUE(exe.ok()) << exe.status();
  EXPECT_FALSE(HasOp((*exe)->function(), "fusion"));
  no_fusion.compile.disabled_passes = {"fuse-everything"};
  exe = Compile(*module, "predict", no_fusion);
  ASSERT_FALSE(exe.ok());
  EXPECT_TRUE(absl::StrContains(exe.status().message(), "cannot disable unknown pass 'fuse-everything'"))
      << exe.status();
}

TEST(CompileApi, DeviceBufferRunsNeedTheCudaBackend) {
  std::unique_ptr<Module> module = BuildMlp(kBatch);
  absl::StatusOr<std::unique_ptr<Executable>> exe = Compile(*module, "predict");
  ASSERT_TRUE(exe.ok()) << exe.status();
  absl::Status status = (*exe)->RunOnDevice({}, {});
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(), "@predict: RunOnDevice needs the cuda backend; this executable runs on cpu");
  EXPECT_FALSE((*exe)->InputBuffer(0).ok());
  EXPECT_FALSE((*exe)->OutputBuffer(0).ok());
  EXPECT_FALSE((*exe)->RunInPlace().ok());
}

// The CUDA backend is a run-time choice: here, without a GPU, it is an error that says why.
TEST(CompileApi, CudaBackendWithoutAGpuSaysWhy) {
  if (CudaBackendAvailable().ok()) GTEST_SKIP() << "a GPU is usable here: tests/gpu_training_test.cc covers it";
  std::unique_ptr<Module> module = BuildMlp(kBatch);
  ExecutableOptions options;
  options.backend = Backend::kCuda;
  absl::StatusOr<std::unique_ptr<Executable>> exe = Compile(*module, "predict", options);
  ASSERT_FALSE(exe.ok());
  EXPECT_TRUE(exe.status().code() == absl::StatusCode::kFailedPrecondition ||
              exe.status().code() == absl::StatusCode::kUnimplemented)
      << exe.status();
  EXPECT_TRUE(absl::StartsWith(exe.status().message(), "Compile @predict: backend cuda: ")) << exe.status();
  EXPECT_EQ(exe.status().message().substr(std::string("Compile @predict: backend cuda: ").size()),
            CudaBackendAvailable().message());
}

TEST(CompileApi, ParseBackend) {
  EXPECT_EQ(*ParseBackend("cpu"), Backend::kCpu);
  EXPECT_EQ(*ParseBackend("cuda"), Backend::kCuda);
  EXPECT_EQ(BackendName(Backend::kCuda), "cuda");
  absl::StatusOr<Backend> bad = ParseBackend("tpu");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "backend must be cpu or cuda, got 'tpu'");
}

}  // namespace
}  // namespace kiln
