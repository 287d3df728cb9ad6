// runtime/memory_estimate.h: what a run will hold, estimated before it allocates (issue 11:
// sizes that ended in std::bad_alloc or the OOM killer).
#include "runtime/memory_estimate.h"

#include <gtest/gtest.h>

#include "frontends/llama.h"
#include "frontends/model_config.h"
#include "ir/text_format.h"
#include "passes/training_step.h"

namespace kiln {
namespace {

// x: 1000 f32, y = neg(x) (1000), z = exp(y) (1000), w = add(z, x): at w, x, z and w are live
// (y was freed after z), plus the caller's copy of x.
TEST(MemoryEstimate, FollowsTheReferenceBackendsLiveness) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(
      "module @m\n\nfunc @main {\n  %x = parameter() {index=0} : f32[1000]\n  %y = neg(%x) : f32[1000]\n"
      "  %z = exp(%y) : f32[1000]\n  %w = add(%z, %x) : f32[1000]\n  return %w\n}\n");
  ASSERT_TRUE(m.ok()) << m.status();
  const Function& f = *(*m)->FindFunction("main");
  // Caller's x, then x, y, z at z (y is freed after z), then x, z, w at w: peak 4 x 1000 doubles.
  EXPECT_EQ(ReferencePeakBytes(f), 4 * 1000 * 8);
  EXPECT_EQ(DevicePeakBytes(f), 3 * 1000 * 4);
}

TEST(MemoryEstimate, LargeSizesAreCountedExactlyAndSumsSaturate) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(
      "module @m\n\nfunc @main {\n  %x = parameter() {index=0} : f32[1048576,1048576]\n"
      "  %y = neg(%x) : f32[1048576,1048576]\n  %z = neg(%y) : f32[1048576,1048576]\n  return %z\n}\n");
  ASSERT_TRUE(m.ok()) << m.status();
  // 2^40 doubles each: the caller's x, then y and z (x is freed after y): 3 x 8 TiB.
  EXPECT_EQ(ReferencePeakBytes(*(*m)->FindFunction("main")), 3 * (int64_t{1} << 43));
  EXPECT_EQ(SaturatingSum({INT64_MAX, 5}), INT64_MAX);
  EXPECT_EQ(FormatBytes(INT64_MAX), "more than 8 EiB");
  EXPECT_EQ(FormatBytes(3 * (int64_t{1} << 30) / 2), "1.5 GiB");
  EXPECT_EQ(FormatBytes(100), "100 bytes");
}

TEST(MemoryEstimate, RefusalsGiveTheFigureAndTheLimit) {
  absl::StatusOr<HostMemory> memory = AvailableHostMemory();
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_GT(memory->available_bytes, 0);
  absl::Status refused = CheckFitsHostMemory(INT64_MAX, "kiln test", "everything");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("kiln test needs about more than 8 EiB of host memory (everything), but "),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.message().find(memory->source), std::string::npos) << refused;
  EXPECT_TRUE(CheckFitsHostMemory(1024, "kiln test", "a little").ok());
}

// llama-M's training step runs on one H200 (arena 33.7 GB, bench/RESULTS.md's shapes): the
// device estimate, taken before the pipeline, must not refuse it.
TEST(MemoryEstimate, TheDeviceEstimateDoesNotRefuseWhatRuns) {
  absl::StatusOr<ModelConfig> config = PresetConfig("llama-M");
  ASSERT_TRUE(config.ok());
  absl::StatusOr<std::unique_ptr<Module>> module = BuildLlamaModule(*config, {});
  ASSERT_TRUE(module.ok()) << module.status();
  TrainingStepLayout layout;
  ASSERT_TRUE(BuildTrainingStep(**module, *(*module)->FindFunction("forward"), {}, &layout).ok());
  const int64_t device = DevicePeakBytes(*(*module)->FindFunction("train_step"));
  EXPECT_GT(device, int64_t{10} << 30);
  EXPECT_LT(device, int64_t{139} << 30) << FormatBytes(device);
  // On the CPU the same step needs more than this 24 GiB machine has: the OOM kill.
  EXPECT_GT(ReferencePeakBytes(*(*module)->FindFunction("train_step")), int64_t{24} << 30);
}

}  // namespace
}  // namespace kiln
