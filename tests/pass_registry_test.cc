// The pass registry (passes/pass_registry.h): one row per pass, and every pass the pipelines
// run has one, so `kiln compile --help`, --disable-pass and `kiln check --passes` know it.
#include "passes/pass_registry.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "passes/default_pipeline.h"

namespace kiln {
namespace {

TEST(PassRegistry, EachRowMakesThePassItNames) {
  std::set<std::string> seen;
  std::string previous;
  for (const PassInfo& info : RegisteredPasses()) {
    EXPECT_TRUE(seen.insert(std::string(info.name)).second) << "twice: " << info.name;
    EXPECT_LT(previous, info.name) << "the table is sorted by name";
    previous = std::string(info.name);
    std::unique_ptr<Pass> pass = info.make(CompileOptions{});
    ASSERT_NE(pass, nullptr) << info.name;
    EXPECT_EQ(pass->name(), info.name);
    EXPECT_FALSE(info.description.empty()) << info.name;
    EXPECT_FALSE(absl::StrContains(info.description, "\n")) << info.name << ": one line";
    EXPECT_LE(info.name.size() + info.description.size(), 100u) << info.name << ": fits a help line";
    EXPECT_EQ(FindRegisteredPass(info.name), &info);
    // Every pass is exact in f32 but the one whose merged GEMM chains round their sums once,
    // fuse-residual-norm, whose fused layer_norm backward never rounds the decomposition's
    // intermediates, and chunk-lm-head, whose weight gradient sums its chunks' partial sums.
    EXPECT_EQ(info.reassociates_f32_sums, info.name == "merge-sibling-gemms" || info.name == "fuse-residual-norm" ||
                                              info.name == "chunk-lm-head")
        << info.name;
  }
  EXPECT_EQ(FindRegisteredPass("no-such-pass"), nullptr);
}

// A pass added to a pipeline and forgotten in the table fails here.
TEST(PassRegistry, HoldsEveryPassOfKilnsPipelines) {
  const CompileOptions options;
  std::vector<Pipeline> pipelines;
  pipelines.push_back(BuildDefaultPipeline(options));
  pipelines.push_back(BuildForwardPipeline(options));
  for (const Pipeline& pipeline : pipelines) {
    const std::vector<std::string> names = pipeline.PassNames();
    ASSERT_FALSE(names.empty());
    for (const std::string& name : names) {
      EXPECT_NE(FindRegisteredPass(name), nullptr)
          << name << " runs in pipeline " << pipeline.name() << " but is not in passes/pass_registry.cc";
    }
  }
}

TEST(PassRegistry, PipelinesFromNamesUseTheTable) {
  absl::StatusOr<Pipeline> p = BuildPipelineFromNames({"simplify", "fuse-loops"}, CompileOptions{});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->Describe(), "simplify(canonicalize, cse, dce), fuse-loops");
  absl::StatusOr<Pipeline> bad = BuildPipelineFromNames({"cse", "bogus"}, CompileOptions{});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "unknown pass 'bogus' (known: default, " + RegisteredPassNames() + ")");
  EXPECT_EQ(RegisteredPassNames(),
            "canonicalize, chunk-lm-head, cse, dce, elide-grad-zeroing, expand-rope, fuse-cache-write, "
            "fuse-fp8-scale-update, fuse-gemv-glu, fuse-loops, fuse-norm-between-gemvs, fuse-residual-norm, gemm-bias-epilogue, "
            "group-optimizer-updates, lower-gemm, merge-cache-write-siblings, "
            "merge-sibling-gemms, narrow-activations-bf16, rematerialize, "
            "select-flash-attention, select-fp8-gemm, simplify");
}

TEST(PassRegistry, TheHelpTableListsEveryPassWithItsDescription) {
  const std::string table = FormatPassTable();
  for (const PassInfo& info : RegisteredPasses()) {
    EXPECT_TRUE(absl::StrContains(table, std::string(info.name) + "  ")) << table;
    EXPECT_TRUE(absl::StrContains(table, info.description)) << table;
  }
}

}  // namespace
}  // namespace kiln
