// The data-parallel gradient buckets (runtime/distributed/grad_buckets.h) on llama-tiny's
// training step as kiln train compiles it: every trainable gradient in exactly one bucket,
// in the order the backward produces them (last layer first), within the byte cap unless a
// tensor alone exceeds it, and each bucket ready after its last gradient.
#include "runtime/distributed/grad_buckets.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "frontends/llama.h"
#include "passes/training_compile.h"
#include "tests/testing/training_steps.h"

namespace kiln {
namespace {

using CompiledStep = testing::CompiledTrainingStep;

// llama-tiny's step at batch 2, 32 tokens, bf16 (testing::CompileLlamaTinyStepWithoutMergedGemms
// says why merge-sibling-gemms is off).
CompiledStep CompileLlamaTiny(double clip_norm = 1.0, int64_t accum = 1) {
  return testing::CompileLlamaTinyStepWithoutMergedGemms(2, 32, Precision::kBf16, clip_norm, accum);
}

std::vector<const GradientSlot*> Flatten(const GradBucketPlan& plan) {
  std::vector<const GradientSlot*> out;
  for (const GradBucket& b : plan.buckets) {
    for (const GradientSlot& g : b.gradients) out.push_back(&g);
  }
  return out;
}

// "model.layers.3.self_attn.q_proj.weight" -> 3; -1 for a parameter outside the layers.
int LayerOf(const std::string& name) {
  std::vector<std::string> parts = absl::StrSplit(name, '.');
  int layer = -1;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (parts[i] == "layers" && absl::SimpleAtoi(parts[i + 1], &layer)) return layer;
  }
  return -1;
}

void ExpectEveryGradientOnce(const GradBucketPlan& plan, const CompiledStep& c) {
  std::multiset<int64_t> indices;
  int64_t bytes = 0;
  for (const GradientSlot* g : Flatten(plan)) {
    indices.insert(g->param_index);
    bytes += g->bytes;
    EXPECT_EQ(g->bytes, c.step->parameters()[g->param_index]->type().num_bytes()) << g->param_name;
    EXPECT_EQ(g->param_name, c.step->parameters()[g->param_index]->name());
  }
  ASSERT_EQ(static_cast<int64_t>(indices.size()), c.layout.num_params);
  for (int64_t i = 0; i < c.layout.num_params; ++i) EXPECT_EQ(indices.count(i), 1u) << "parameter " << i;
  EXPECT_EQ(bytes, plan.total_bytes);
}

TEST(GradBuckets, EveryTrainableGradientIsInExactlyOneBucket) {
  CompiledStep c = CompileLlamaTiny();
  for (int64_t cap : {int64_t{1}, int64_t{4096}, int64_t{64} << 10, int64_t{25} << 20}) {
    absl::StatusOr<GradBucketPlan> plan = PlanGradBuckets(*c.step, c.layout, {.cap_bytes = cap});
    ASSERT_TRUE(plan.ok()) << plan.status();
    ExpectEveryGradientOnce(*plan, c);
  }
}

TEST(GradBuckets, FollowTheOrderTheBackwardProducesGradientsLastLayerFirst) {
  CompiledStep c = CompileLlamaTiny();
  absl::StatusOr<GradBucketPlan> plan = PlanGradBuckets(*c.step, c.layout, {.cap_bytes = 64 << 10});
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<const GradientSlot*> flat = Flatten(*plan);
  for (size_t i = 1; i < flat.size(); ++i) {
    EXPECT_LT(flat[i - 1]->position, flat[i]->position) << flat[i - 1]->param_name << " then " << flat[i]->param_name;
    EXPECT_EQ(c.step->nodes()[flat[i]->position].get(), flat[i]->gradient);
  }
  // Each layer's gradients all come before any of the layer below it.
  int max_layer = -1;
  for (const GradientSlot* g : flat) max_layer = std::max(max_layer, LayerOf(g->param_name));
  ASSERT_GE(max_layer, 1) << "llama-tiny has several layers";
  for (int layer = max_layer; layer > 0; --layer) {
    int64_t last_of_layer = -1, first_of_below = INT64_MAX;
    for (const GradientSlot* g : flat) {
      if (LayerOf(g->param_name) == layer) last_of_layer = std::max(last_of_layer, g->position);
      if (LayerOf(g->param_name) == layer - 1) first_of_below = std::min(first_of_below, g->position);
    }
    EXPECT_LT(last_of_layer, first_of_below) << "layer " << layer << " vs layer " << layer - 1;
  }
  EXPECT_NE(LayerOf(flat.front()->param_name), 0) << flat.front()->param_name;
}

TEST(GradBuckets, RespectTheCapAndFillEachBucketGreedily) {
  CompiledStep c = CompileLlamaTiny();
  const int64_t cap = 64 << 10;
  absl::StatusOr<GradBucketPlan> plan = PlanGradBuckets(*c.step, c.layout, {.cap_bytes = cap});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GT(plan->buckets.size(), 2u) << plan->Summary();
  for (size_t i = 0; i < plan->buckets.size(); ++i) {
    const GradBucket& b = plan->buckets[i];
    ASSERT_FALSE(b.gradients.empty());
    int64_t sum = 0;
    for (const GradientSlot& g : b.gradients) sum += g.bytes;
    EXPECT_EQ(sum, b.bytes);
    if (b.gradients.size() > 1) {
      EXPECT_LE(b.bytes, cap) << "bucket " << i;
    }
    // Greedy: the next gradient did not fit.
    if (i + 1 < plan->buckets.size()) {
      EXPECT_GT(b.bytes + plan->buckets[i + 1].gradients.front().bytes, cap);
    }
    // Ready after its last gradient, which comes after all the others.
    EXPECT_EQ(b.ready_after, b.gradients.back().gradient);
    EXPECT_EQ(b.ready_position, b.gradients.back().position);
    for (const GradientSlot& g : b.gradients) EXPECT_LE(g.position, b.ready_position);
    if (i > 0) {
      EXPECT_LT(plan->buckets[i - 1].ready_position, b.ready_position);
    }
  }
}

TEST(GradBuckets, ATensorLargerThanTheCapGetsABucketOfItsOwn) {
  CompiledStep c = CompileLlamaTiny();
  absl::StatusOr<GradBucketPlan> whole = PlanGradBuckets(*c.step, c.layout);
  ASSERT_TRUE(whole.ok()) << whole.status();
  const GradientSlot* largest = nullptr;
  for (const GradientSlot* g : Flatten(*whole)) {
    if (largest == nullptr || g->bytes > largest->bytes) largest = g;
  }
  ASSERT_NE(largest, nullptr);
  const int64_t cap = largest->bytes / 2;
  absl::StatusOr<GradBucketPlan> plan = PlanGradBuckets(*c.step, c.layout, {.cap_bytes = cap});
  ASSERT_TRUE(plan.ok()) << plan.status();
  int alone = 0;
  for (const GradBucket& b : plan->buckets) {
    for (const GradientSlot& g : b.gradients) {
      if (g.bytes > cap) {
        EXPECT_EQ(b.gradients.size(), 1u) << g.param_name << " (" << g.bytes << " bytes) shares a bucket";
        ++alone;
      }
    }
  }
  EXPECT_GE(alone, 1);
  // The default 25 MiB holds all of llama-tiny in one bucket, ready after the last gradient.
  ASSERT_EQ(whole->buckets.size(), 1u) << whole->Summary();
  EXPECT_TRUE(absl::StartsWith(whole->Summary(), "1 bucket (")) << whole->Summary();
}

// The buckets carry the gradients before clipping: the global norm must be taken over the
// all-reduced gradients. Without clipping, adamw_update reads them directly.
TEST(GradBuckets, CarryTheUnclippedGradients) {
  CompiledStep clipped = CompileLlamaTiny(1.0);
  absl::StatusOr<GradBucketPlan> plan = PlanGradBuckets(*clipped.step, clipped.layout);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const GradientSlot* g : Flatten(*plan)) {
    EXPECT_NE(g->gradient->scope(), "grad_clip") << g->param_name;
    bool read_by_clip = false;
    for (const Node* user : g->gradient->users()) read_by_clip |= user->scope() == "grad_clip";
    EXPECT_TRUE(read_by_clip) << g->param_name << "'s gradient %" << g->gradient->name();
  }

  CompiledStep unclipped = CompileLlamaTiny(0.0);
  plan = PlanGradBuckets(*unclipped.step, unclipped.layout);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const GradientSlot* g : Flatten(*plan)) {
    bool read_by_adamw = false;
    for (const Node* user : g->gradient->users()) read_by_adamw |= user->opcode() == Opcode::kAdamWUpdate;
    EXPECT_TRUE(read_by_adamw) << g->param_name;
  }

  // With two micro-batches, the bucketed gradient is the accumulated one.
  CompiledStep accum = CompileLlamaTiny(1.0, 2);
  plan = PlanGradBuckets(*accum.step, accum.layout);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectEveryGradientOnce(*plan, accum);
}

TEST(GradBuckets, RejectsABadCapAndAStepWithoutItsUpdates) {
  CompiledStep c = CompileLlamaTiny();
  absl::StatusOr<GradBucketPlan> plan = PlanGradBuckets(*c.step, c.layout, {.cap_bytes = 0});
  ASSERT_FALSE(plan.ok());
  EXPECT_TRUE(absl::StrContains(plan.status().message(), "cap_bytes must be >= 1")) << plan.status();
  TrainingStepLayout more = c.layout;
  more.num_params += 1;
  plan = PlanGradBuckets(*c.step, more);
  ASSERT_FALSE(plan.ok());
  EXPECT_TRUE(absl::StrContains(plan.status().message(), "adamw_update parameter groups for")) << plan.status();
}

}  // namespace
}  // namespace kiln
