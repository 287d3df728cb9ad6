// ZeRO-1's shard layout (runtime/distributed/zero1_shards.h): every element of every bucket's
// gradients is owned by exactly one rank, at the flat offset the bucket's reduce-scatter
// hands it, the slices equal (the last padded), a tensor that straddles a boundary cut in two,
// and the AdamW state a rank keeps about 1/N of the whole. On llama-tiny's real bucket plan,
// and on a small hand-made one whose cuts are known.
#include "runtime/distributed/zero1_shards.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "absl/strings/match.h"
#include "ir/builder.h"
#include "tests/testing/training_steps.h"

namespace kiln {
namespace {

// Every element of each gradient once, contiguous in flat order, inside its rank's slice.
void ExpectAPartition(const GradBucketPlan& plan, const Zero1Plan& z) {
  ASSERT_EQ(z.buckets.size(), plan.buckets.size());
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    const BucketShards& s = z.buckets[b];
    EXPECT_EQ(s.padded % z.world_size, 0);
    EXPECT_GE(s.padded, s.elements);
    EXPECT_LT(s.padded - s.elements, z.world_size);
    EXPECT_EQ(s.shard * z.world_size, s.padded);
    std::map<int64_t, int64_t> covered;  // param -> elements seen, in order
    int64_t flat = 0;
    for (int r = 0; r < z.world_size; ++r) {
      for (const ShardSegment& seg : s.by_rank[r]) {
        EXPECT_EQ(seg.flat_offset, flat) << "bucket " << b << " rank " << r;
        EXPECT_GE(seg.flat_offset, r * s.shard);
        EXPECT_LE(seg.flat_offset + seg.count, (r + 1) * s.shard);
        EXPECT_EQ(seg.tensor_offset, covered[seg.param_index]) << "param " << seg.param_index;
        EXPECT_GT(seg.count, 0);
        covered[seg.param_index] += seg.count;
        flat += seg.count;
      }
    }
    EXPECT_EQ(flat, s.elements);
    for (const GradientSlot& g : plan.buckets[b].gradients) {
      EXPECT_EQ(covered[g.param_index], g.gradient->type().num_elements()) << g.param_name;
    }
  }
}

TEST(Zero1Shards, LlamaTinysBucketsSplitEvenlyOverTheRanks) {
  testing::CompiledTrainingStep c = testing::CompileLlamaTinyStepWithoutMergedGemms(2, 32, Precision::kBf16, 1.0);
  absl::StatusOr<GradBucketPlan> plan = PlanGradBuckets(*c.step, c.layout, {.cap_bytes = 64 << 10});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GT(plan->buckets.size(), 2u);
  int64_t total = 0;
  for (const GradBucket& b : plan->buckets) {
    for (const GradientSlot& g : b.gradients) total += g.gradient->type().num_elements();
  }
  for (int world : {1, 2, 3, 8}) {
    absl::StatusOr<Zero1Plan> z = PlanZero1Shards(*plan, world);
    ASSERT_TRUE(z.ok()) << z.status();
    ExpectAPartition(*plan, *z);
    int64_t sum = 0;
    for (int r = 0; r < world; ++r) {
      sum += z->StateElements(r);
      // A rank's state is its slices: at most one padding element short of 1/N a bucket.
      EXPECT_LE(z->StateElements(r), total / world + static_cast<int64_t>(plan->buckets.size())) << world;
    }
    EXPECT_EQ(sum, total) << world;
    EXPECT_TRUE(absl::StrContains(z->Summary(), absl::StrCat(world, " ranks: at most "))) << z->Summary();
  }
}

TEST(Zero1Shards, ATensorAcrossASliceBoundaryIsCutThere) {
  // Gradients of 5, 3 and 2 elements in one bucket over 3 ranks: 10 elements padded to 12,
  // slices of 4. Rank 0: a[0,4); rank 1: a[4,5) b[0,3); rank 2: c[0,2) and two of padding.
  Module m("m");
  Builder builder(m.AddFunction("f"));
  Node* a = *builder.Parameter("a", {DType::kF32, {5}});
  Node* b = *builder.Parameter("b", {DType::kF32, {3}});
  Node* c = *builder.Parameter("c", {DType::kF32, {2}});
  GradBucketPlan plan;
  plan.buckets.push_back({.gradients = {{.param_index = 0, .param_name = "a", .gradient = a, .bytes = 20},
                                        {.param_index = 1, .param_name = "b", .gradient = b, .bytes = 12},
                                        {.param_index = 2, .param_name = "c", .gradient = c, .bytes = 8}},
                          .bytes = 40});
  absl::StatusOr<Zero1Plan> z = PlanZero1Shards(plan, 3);
  ASSERT_TRUE(z.ok()) << z.status();
  ExpectAPartition(plan, *z);
  const BucketShards& s = z->buckets[0];
  EXPECT_EQ(s.padded, 12);
  EXPECT_EQ(s.shard, 4);
  ASSERT_EQ(s.by_rank[0].size(), 1u);
  EXPECT_EQ(s.by_rank[0][0].count, 4);
  ASSERT_EQ(s.by_rank[1].size(), 2u);
  EXPECT_EQ(s.by_rank[1][0].param_index, 0);
  EXPECT_EQ(s.by_rank[1][0].tensor_offset, 4);
  EXPECT_EQ(s.by_rank[1][0].count, 1);
  EXPECT_EQ(s.by_rank[1][1].param_index, 1);
  EXPECT_EQ(s.by_rank[1][1].count, 3);
  ASSERT_EQ(s.by_rank[2].size(), 1u);
  EXPECT_EQ(s.by_rank[2][0].param_index, 2);
  EXPECT_EQ(s.by_rank[2][0].flat_offset, 8);
  EXPECT_EQ(z->StateElements(2), 2);
  EXPECT_FALSE(PlanZero1Shards(plan, 0).ok());
}

}  // namespace
}  // namespace kiln
