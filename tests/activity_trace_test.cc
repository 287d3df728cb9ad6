// Attributing a graph replay's traced activities to the program's steps
// (runtime/cuda/activity_trace.h's MatchActivitiesToSteps): no GPU needed, the activities are
// plain data. The GPU side (CUPTI's trace of a real graph) runs in gpu_training_test's
// CudaGraphReplayMatchesEagerLaunches and in `kiln generate --report`.
#include <gtest/gtest.h>

#include <filesystem>

#if KILN_WITH_CUDA
#include "runtime/cuda/activity_trace.h"
#endif

namespace kiln {
namespace {

#if KILN_WITH_CUDA

using Kind = TracedActivity::Kind;

TracedActivity Kernel(const std::string& name, uint64_t start) { return {Kind::kKernel, name, start, start + 5}; }
TracedActivity Copy(uint64_t start) { return {Kind::kMemcpy, "", start, start + 2}; }

TEST(ActivityTraceTest, NamedKernelsMatchInOrderAndGemmsTakeWhatLiesBetween) {
  // norm, a cuBLASLt GEMM (two kernels: the product and its split-K reduction), rope, two
  // GEMMs back to back (one kernel each), a copy, an elided copy.
  const std::vector<TracedActivity> activities = {
      Kernel("k_norm", 0), Kernel("sm90_xmma_gemm", 10), Kernel("splitKreduce", 20), Kernel("k_rope", 30),
      Kernel("sm90_xmma_gemm", 40), Kernel("sm90_xmma_gemm", 50), Copy(60)};
  const std::vector<TracedStep> steps = {{.kernel = "k_norm"}, {}, {.kernel = "k_rope"}, {}, {}, {},
                                         {.launches_work = false}};
  absl::StatusOr<std::vector<std::vector<int>>> matched = MatchActivitiesToSteps(activities, steps);
  ASSERT_TRUE(matched.ok()) << matched.status();
  const std::vector<std::vector<int>> expected = {{0}, {1, 2}, {3}, {4}, {5}, {6}, {}};
  EXPECT_EQ(*matched, expected);
}

TEST(ActivityTraceTest, AKernelOfTheSameNameLaterIsNotTakenEarly) {
  // The same cubin launched twice (two layers' norms): each step takes the next one.
  const std::vector<TracedActivity> activities = {Kernel("k_norm", 0), Kernel("gemm", 10), Kernel("k_norm", 20)};
  const std::vector<TracedStep> steps = {{.kernel = "k_norm"}, {}, {.kernel = "k_norm"}};
  absl::StatusOr<std::vector<std::vector<int>>> matched = MatchActivitiesToSteps(activities, steps);
  ASSERT_TRUE(matched.ok()) << matched.status();
  const std::vector<std::vector<int>> expected = {{0}, {1}, {2}};
  EXPECT_EQ(*matched, expected);
}

TEST(ActivityTraceTest, AMissingKernelIsAnErrorNamingTheStep) {
  const std::vector<TracedActivity> activities = {Kernel("k_norm", 0), Kernel("k_rope", 10)};
  const std::vector<TracedStep> steps = {{.kernel = "k_rope"}, {.kernel = "k_norm"}};
  absl::StatusOr<std::vector<std::vector<int>>> matched = MatchActivitiesToSteps(activities, steps);
  ASSERT_FALSE(matched.ok());
  EXPECT_NE(matched.status().message().find("step 1's kernel k_norm"), std::string::npos) << matched.status();
}

TEST(ActivityTraceTest, ActivitiesNoStepClaimsAreLeftOut) {
  // Something before the first step's kernel with no unnamed step to take it (another
  // stream's work): not given to any step.
  const std::vector<TracedActivity> activities = {Kernel("other", 0), Kernel("k_norm", 10)};
  const std::vector<TracedStep> steps = {{.kernel = "k_norm"}};
  absl::StatusOr<std::vector<std::vector<int>>> matched = MatchActivitiesToSteps(activities, steps);
  ASSERT_TRUE(matched.ok()) << matched.status();
  const std::vector<std::vector<int>> expected = {{1}};
  EXPECT_EQ(*matched, expected);
}

// Where the toolkit's libcupti is installed (CI's CUDA toolkit has it), the tracer finds it
// and every entry point it uses: any failure left is CUPTI's own (no driver here), never a
// missing library or symbol.
TEST(ActivityTraceTest, TheToolkitsCuptiLoadsWithEveryEntryPoint) {
  if (!std::filesystem::exists("/usr/local/cuda/lib64/libcupti.so.13")) {
    GTEST_SKIP() << "no /usr/local/cuda/lib64/libcupti.so.13 on this machine";
  }
  absl::StatusOr<ActivityTracer*> tracer = ActivityTracer::Get();
  if (!tracer.ok()) {
    EXPECT_NE(tracer.status().code(), absl::StatusCode::kNotFound) << tracer.status();
    EXPECT_NE(tracer.status().message().find("cuptiActivityRegisterCallbacks"), std::string::npos) << tracer.status();
  }
}

#endif  // KILN_WITH_CUDA

}  // namespace
}  // namespace kiln
