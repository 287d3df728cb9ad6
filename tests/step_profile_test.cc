// The trace and the time table built from per-launch timings (runtime/step_profile.h).
#include "runtime/step_profile.h"

#include <gtest/gtest.h>

#include "tests/testing/filecheck.h"

namespace kiln {
namespace {

std::vector<StepTiming> ThreeLaunches() {
  return {{.name = "k_rms", .group = "rms_norm", .node = "%n1", .scope = "layers.0", .start_us = 0, .duration_us = 10,
           .exposed_us = 10},
          {.name = "gemm 1x64x64x64", .group = "gemm", .node = "%mm", .scope = "layers.0", .start_us = 10,
           .duration_us = 30, .exposed_us = 30},
          {.name = "k_rms_2", .group = "rms_norm", .node = "%n2", .scope = "", .start_us = 40, .duration_us = 15,
           .exposed_us = 15}};
}

// A graph's launches as CUPTI sees them: the second starts (its blocks resident, waiting)
// before the first ends, the third runs wholly under the second.
std::vector<StepTiming> OverlappingLaunches() {
  return {{.name = "k_a", .group = "gemv", .start_us = 0, .duration_us = 10, .exposed_us = 10, .in_graph = true},
          {.name = "k_b", .group = "rms_norm", .start_us = 8, .duration_us = 6, .exposed_us = 4, .in_graph = true},
          {.name = "k_c", .group = "gemv", .start_us = 9, .duration_us = 2, .exposed_us = 0, .in_graph = true}};
}

TEST(StepProfileTest, GroupsAreSummedAndSortedByTime) {
  const std::vector<TimeGroup> groups = GroupTimes(ThreeLaunches());
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].group, "gemm");
  EXPECT_EQ(groups[0].launches, 1);
  EXPECT_DOUBLE_EQ(groups[0].total_us, 30);
  EXPECT_EQ(groups[1].group, "rms_norm");
  EXPECT_EQ(groups[1].launches, 2);
  EXPECT_DOUBLE_EQ(groups[1].total_us, 25);
}

TEST(StepProfileTest, TableShowsSharesAndTotal) {
  const std::string table = FormatGroupTable(ThreeLaunches(), 10);
  EXPECT_TRUE(testing::FileCheck(table, R"(
CHECK: group
CHECK: gemm{{ +}}1{{ +}}0.030{{ +}}54.5%
CHECK: rms_norm{{ +}}2{{ +}}0.025{{ +}}45.5%
CHECK: total{{ +}}3{{ +}}0.055
)").ok()) << table;
  // Only the top rows when asked for fewer.
  EXPECT_EQ(FormatGroupTable(ThreeLaunches(), 1).find("rms_norm"), std::string::npos);
}

TEST(StepProfileTest, SlowestLaunchesComeFirstWithNodeScopeAndLaunch) {
  const std::string table = FormatSlowestLaunches(ThreeLaunches(), 2);
  EXPECT_TRUE(testing::FileCheck(table, R"(
CHECK: exposed us{{ +}}span us{{ +}}group{{ +}}node{{ +}}scope{{ +}}launch
CHECK-NEXT: 30.0{{ +}}30.0{{ +}}gemm{{ +}}%mm{{ +}}layers.0{{ +}}gemm 1x64x64x64
CHECK-NEXT: 15.0{{ +}}15.0{{ +}}rms_norm{{ +}}%n2{{ +}}-{{ +}}k_rms_2
CHECK-NOT: n1
)").ok()) << table;
}

// attention_grad lowers to a dq and a dk/dv kernel, both of its node: the launch column tells
// them apart.
TEST(StepProfileTest, SlowestLaunchesTellANodesKernelsApart) {
  const std::vector<StepTiming> timings = {
      {.name = "k_184_dq", .group = "attention_grad", .node = "%184", .scope = "layers.0.attn", .duration_us = 210,
       .exposed_us = 210},
      {.name = "k_184_dkdv", .group = "attention_grad", .node = "%184", .scope = "layers.0.attn", .duration_us = 300,
       .exposed_us = 300}};
  const std::string table = FormatSlowestLaunches(timings, 2);
  EXPECT_TRUE(testing::FileCheck(table, R"(
CHECK: 300.0{{ +}}300.0{{ +}}attention_grad{{ +}}%184{{ +}}layers.0.attn{{ +}}k_184_dkdv
CHECK-NEXT: 210.0{{ +}}210.0{{ +}}attention_grad{{ +}}%184{{ +}}layers.0.attn{{ +}}k_184_dq
)").ok()) << table;
}

TEST(StepProfileTest, ChromeTraceHasOneCompleteEventPerLaunchAndEscapes) {
  std::vector<StepTiming> timings = ThreeLaunches();
  timings[0].name = "quote\" backslash\\ newline\n";
  const std::string json = ChromeTraceJson(timings, "run");
  EXPECT_TRUE(testing::FileCheck(json, R"(
CHECK: "traceEvents"
CHECK: "process_name"
CHECK: "name": "quote\" backslash\\ newline\n", "cat": "rms_norm", "ph": "X"{{.*}}"ts": 0.000, "dur": 10.000
CHECK: "name": "gemm 1x64x64x64"{{.*}}"ts": 10.000, "dur": 30.000{{.*}}"node": "%mm", "scope": "layers.0"
CHECK: "ts": 40.000, "dur": 15.000
)").ok()) << json;
  size_t events = 0;
  for (size_t at = json.find("\"ph\": \"X\""); at != std::string::npos; at = json.find("\"ph\": \"X\"", at + 1)) ++events;
  EXPECT_EQ(events, 3u);
}

// In a graph the group table adds exposed time (what each launch added to the run's end), so
// the total is the run's GPU time, not the sum of overlapping spans.
TEST(StepProfileTest, GraphTimingsGroupByExposedTime) {
  const std::vector<TimeGroup> groups = GroupTimes(OverlappingLaunches());
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].group, "gemv");
  EXPECT_DOUBLE_EQ(groups[0].total_us, 10);
  EXPECT_DOUBLE_EQ(groups[1].total_us, 4);
  const std::string table = FormatGroupTable(OverlappingLaunches(), 10);
  EXPECT_TRUE(testing::FileCheck(table, "CHECK: total{{ +}}3{{ +}}0.014").ok()) << table;
  EXPECT_EQ(TimingMethod(OverlappingLaunches()), "in the CUDA graph (CUPTI)");
  EXPECT_EQ(TimingMethod(ThreeLaunches()), "launched one by one with CUDA events");
}

// Overlapping spans go on tracks of their own, so a trace viewer draws them side by side.
TEST(StepProfileTest, ChromeTraceGivesOverlappingLaunchesTheirOwnTracks) {
  const std::string json = ChromeTraceJson(OverlappingLaunches(), "run");
  EXPECT_TRUE(testing::FileCheck(json, R"(
CHECK: "name": "k_a"{{.*}}"tid": 0, "ts": 0.000
CHECK: "name": "k_b"{{.*}}"tid": 1, "ts": 8.000{{.*}}"exposed_us": 4.000
CHECK: "name": "k_c"{{.*}}"tid": 2, "ts": 9.000
)").ok()) << json;
  // Launched one by one, nothing overlaps: one track.
  EXPECT_EQ(ChromeTraceJson(ThreeLaunches(), "run").find("\"tid\": 1"), std::string::npos);
}

}  // namespace
}  // namespace kiln
