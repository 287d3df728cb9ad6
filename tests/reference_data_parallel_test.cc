// Data-parallel training on the reference backend (runtime/distributed/reference_data_parallel.h):
// two ranks, each on its half of the global batch (SampleRankBatch), all-reducing the gradient
// buckets, take the step one rank takes on the whole batch; one rank is EvaluateFunction; a
// failing rank is named and the others do not wait for it.
#include "runtime/distributed/reference_data_parallel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <memory>
#include <thread>

#include "frontends/llama.h"
#include "frontends/trainer.h"
#include "frontends/weight_init.h"
#include "ir/numerics.h"
#include "ir/text_format.h"
#include "passes/training_compile.h"
#include "tests/testing/training_steps.h"
#include "runtime/training/dataset.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGlobalBatch = 4;
constexpr int64_t kSeqLen = 32;

using CompiledStep = testing::CompiledTrainingStep;

// llama-tiny's step as kiln train compiles it (the default pipeline, without
// merge-sibling-gemms: testing::CompileLlamaTinyStepWithoutMergedGemms says why), for `batch`
// rows per rank. fp32, so that the only difference between the runs is the order of the sums
// over the batch (the weight gradients, the loss): with bf16 GEMM operands the gradients would
// still agree, but the test's tolerance would have to cover bf16 rounding of values that are
// not summed in another order only by accident.
CompiledStep Compile(int64_t batch, double clip_norm) {
  return testing::CompileLlamaTinyStepWithoutMergedGemms(batch, kSeqLen, Precision::kFp32, clip_norm);
}

// The step's arguments for rank `rank` of `world`: llama-tiny's initial weights, a mid-run
// AdamW state (t = 10, m = 0 and v > 0, so that the update is a smooth function of the gradient
// rather than the first step's near-sign(g)), and the rank's rows of the global batch.
std::vector<HostTensor> RankArgs(const CompiledStep& c, int64_t rank, int64_t world) {
  const std::vector<Node*> params = c.step->parameters();
  std::vector<HostTensor> args(params.size());
  std::vector<HostTensor> weights = InitLlamaWeights(*PresetConfig("llama-tiny"), 3);
  for (int64_t i = 0; i < c.layout.num_params; ++i) {
    const TensorType& type = weights[i].type();
    args[c.layout.first_param() + i] = weights[i];
    args[c.layout.first_m() + i] = HostTensor(type);
    HostTensor v = HostTensor::Random(type, 100 + i, 1e-7, 1e-6);
    RoundValuesToDType(v.mutable_values().data(), v.num_elements(), type.dtype);
    args[c.layout.first_v() + i] = std::move(v);
  }
  args[c.layout.t_index()] = HostTensor::FromValues({DType::kF32, {}}, {10.0});
  absl::StatusOr<TokenBatch> batch =
      SampleRankBatch(TokenDataset::Default(), /*seed=*/5, /*step=*/0, kGlobalBatch, kSeqLen, rank, world);
  EXPECT_TRUE(batch.ok()) << batch.status();
  absl::StatusOr<std::pair<HostTensor, HostTensor>> tensors = BatchTensors(*c.step, c.layout, {*batch});
  EXPECT_TRUE(tensors.ok()) << tensors.status();
  args[c.layout.first_batch_input()] = tensors->first;
  args[c.layout.first_batch_input() + 1] = tensors->second;
  args[c.layout.lr_index()] = HostTensor::FromValues({DType::kF32, {}}, {1e-2});
  return args;
}

std::vector<std::vector<HostTensor>> AllRankArgs(const CompiledStep& c, int64_t world) {
  std::vector<std::vector<HostTensor>> out;
  for (int64_t r = 0; r < world; ++r) out.push_back(RankArgs(c, r, world));
  return out;
}

// max |a - b| over a tensor, relative to max |a|: rounding errors of a sum scale with its
// terms, not with one element's result, so a per-element relative bound would trip on
// elements that cancel to nearly zero.
double MaxRelativeDiff(const HostTensor& a, const HostTensor& b) {
  double diff = 0, scale = 0;
  for (int64_t j = 0; j < a.num_elements(); ++j) {
    diff = std::max(diff, std::fabs(a[j] - b[j]));
    scale = std::max(scale, std::fabs(a[j]));
  }
  return scale == 0 ? diff : diff / scale;
}

// Two ranks against one on the global batch. Tolerances: fp32 results of sums of 128 (one
// rank) vs 2 x 64 (two ranks) terms in double, each rounded to f32 (2^-24 = 6e-8 relative)
// once more on the two-rank path (the rank's sum, then the mean), so a few 1e-7 of a
// tensor's largest value; 1e-5 leaves room for that to pass through the norm, the clip and
// AdamW while still failing for any gradient that is not the global batch's (a rank's own
// half differs by O(1) relative). m' = 0.9 m + 0.1 c g with m = 0 is the clipped gradient
// itself, so comparing it checks the all-reduced gradients directly.
void ExpectSameStep(const CompiledStep& c, const std::vector<HostTensor>& one, const std::vector<HostTensor>& two,
                    double* max_param, double* max_moment) {
  ASSERT_EQ(one.size(), two.size());
  EXPECT_LT(MaxRelativeDiff(one[0], two[0]), 1e-5) << "loss " << one[0][0] << " vs " << two[0][0];
  *max_param = *max_moment = 0;
  for (int64_t i = 0; i < c.layout.num_params; ++i) {
    const std::string& name = c.step->parameters()[i]->name();
    const double p = MaxRelativeDiff(one[1 + c.layout.first_param() + i], two[1 + c.layout.first_param() + i]);
    const double m = MaxRelativeDiff(one[1 + c.layout.first_m() + i], two[1 + c.layout.first_m() + i]);
    const double v = MaxRelativeDiff(one[1 + c.layout.first_v() + i], two[1 + c.layout.first_v() + i]);
    EXPECT_LT(p, 1e-6) << "new %" << name;
    EXPECT_LT(m, 1e-5) << "new m of %" << name;
    EXPECT_LT(v, 1e-5) << "new v of %" << name;
    *max_param = std::max(*max_param, p);
    *max_moment = std::max(*max_moment, m);
  }
  EXPECT_EQ(one[1 + c.layout.t_index()].values(), two[1 + c.layout.t_index()].values());
}

void ExpectRanksIdentical(const std::vector<std::vector<HostTensor>>& ranks) {
  for (size_t r = 1; r < ranks.size(); ++r) {
    for (size_t i = 0; i < ranks[0].size(); ++i) {
      EXPECT_EQ(ranks[r][i].values(), ranks[0][i].values()) << "rank " << r << " output " << i;
    }
  }
}

TEST(ReferenceDataParallel, TwoRanksOnTheHalvesTakeTheGlobalBatchStep) {
  CompiledStep global = Compile(kGlobalBatch, /*clip_norm=*/1.0);
  CompiledStep half = Compile(kGlobalBatch / 2, /*clip_norm=*/1.0);
  absl::StatusOr<std::vector<std::vector<HostTensor>>> one =
      RunReferenceDataParallelStep(*global.step, global.layout, AllRankArgs(global, 1));
  ASSERT_TRUE(one.ok()) << one.status();
  absl::StatusOr<std::vector<std::vector<HostTensor>>> two =
      RunReferenceDataParallelStep(*half.step, half.layout, AllRankArgs(half, 2));
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_EQ(two->size(), 2u);
  ExpectRanksIdentical(*two);
  double max_param = 0, max_moment = 0;
  ExpectSameStep(half, (*one)[0], (*two)[0], &max_param, &max_moment);
  std::printf("2 ranks vs 1, 1 bucket, clip 1: loss %.9g vs %.9g, max relative diff params' %.3g, m' %.3g\n",
              (*one)[0][0][0], (*two)[0][0][0], max_param, max_moment);
  // The halves' own steps differ from the global one: the all-reduce is what made them agree.
  absl::StatusOr<std::vector<HostTensor>> rank0_alone = EvaluateFunction(*half.step, RankArgs(half, 0, 2));
  ASSERT_TRUE(rank0_alone.ok()) << rank0_alone.status();
  EXPECT_GT(MaxRelativeDiff((*one)[0][1 + half.layout.first_m()], (*rank0_alone)[1 + half.layout.first_m()]), 1e-2);
}

// Several buckets, each all-reduced at its own point of the backward, without clipping (so
// AdamW reads the all-reduced gradients directly and a gradient off by a factor would show):
// the same step as one rank on the global batch, and bit for bit the same as one bucket (the
// mean of each element does not depend on how the gradients are grouped).
TEST(ReferenceDataParallel, SeveralBucketsGiveTheSameStep) {
  CompiledStep global = Compile(kGlobalBatch, /*clip_norm=*/0.0);
  CompiledStep half = Compile(kGlobalBatch / 2, /*clip_norm=*/0.0);
  DataParallelOptions small;
  small.buckets.cap_bytes = 64 << 10;
  absl::StatusOr<GradBucketPlan> plan = PlanGradBuckets(*half.step, half.layout, small.buckets);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GT(plan->buckets.size(), 2u) << plan->Summary();
  absl::StatusOr<std::vector<std::vector<HostTensor>>> one =
      RunReferenceDataParallelStep(*global.step, global.layout, AllRankArgs(global, 1), small);
  ASSERT_TRUE(one.ok()) << one.status();
  absl::StatusOr<std::vector<std::vector<HostTensor>>> two =
      RunReferenceDataParallelStep(*half.step, half.layout, AllRankArgs(half, 2), small);
  ASSERT_TRUE(two.ok()) << two.status();
  ExpectRanksIdentical(*two);
  double max_param = 0, max_moment = 0;
  ExpectSameStep(half, (*one)[0], (*two)[0], &max_param, &max_moment);
  std::printf("2 ranks vs 1, %s, no clip: max relative diff params' %.3g, m' %.3g\n", plan->Summary().c_str(),
              max_param, max_moment);
  absl::StatusOr<std::vector<std::vector<HostTensor>>> one_bucket =
      RunReferenceDataParallelStep(*half.step, half.layout, AllRankArgs(half, 2));
  ASSERT_TRUE(one_bucket.ok()) << one_bucket.status();
  for (size_t i = 0; i < (*two)[0].size(); ++i) {
    EXPECT_EQ((*two)[0][i].values(), (*one_bucket)[0][i].values()) << "output " << i;
  }
}

// Rank `rank` of `world`'s arguments of step `step`, continuing from the training state in
// `outputs` (a step's outputs: the loss, then each argument's new value).
std::vector<HostTensor> ContinueArgs(const CompiledStep& c, const std::vector<HostTensor>& outputs, int64_t step,
                                     int64_t rank, int64_t world) {
  std::vector<HostTensor> args = RankArgs(c, rank, world);
  for (int64_t i = 0; i < c.layout.num_params; ++i) {
    for (int64_t at : {c.layout.first_param() + i, c.layout.first_m() + i, c.layout.first_v() + i}) {
      args[at] = outputs[1 + at];
    }
  }
  args[c.layout.t_index()] = outputs[1 + c.layout.t_index()];
  absl::StatusOr<TokenBatch> batch =
      SampleRankBatch(TokenDataset::Default(), /*seed=*/5, step, kGlobalBatch, kSeqLen, rank, world);
  EXPECT_TRUE(batch.ok()) << batch.status();
  absl::StatusOr<std::pair<HostTensor, HostTensor>> tensors = BatchTensors(*c.step, c.layout, {*batch});
  EXPECT_TRUE(tensors.ok()) << tensors.status();
  args[c.layout.first_batch_input()] = tensors->first;
  args[c.layout.first_batch_input() + 1] = tensors->second;
  return args;
}

// Resuming on another GPU count (issue 17): the state a data-parallel step leaves (parameters,
// AdamW moments, t) is every rank's alike and names no rank, so a run checkpointed after two
// steps on 2 ranks continues on 4 ranks, or on 1, with the third step the 2-rank run takes.
TEST(ReferenceDataParallel, AStateFromTwoRanksContinuesOnFourOrOne) {
  CompiledStep quarter = Compile(kGlobalBatch / 4, /*clip_norm=*/1.0);
  CompiledStep half = Compile(kGlobalBatch / 2, /*clip_norm=*/1.0);
  CompiledStep global = Compile(kGlobalBatch, /*clip_norm=*/1.0);
  absl::StatusOr<std::vector<std::vector<HostTensor>>> state =
      RunReferenceDataParallelStep(*half.step, half.layout, AllRankArgs(half, 2));
  ASSERT_TRUE(state.ok()) << state.status();
  std::vector<std::vector<HostTensor>> second;
  for (int64_t r = 0; r < 2; ++r) second.push_back(ContinueArgs(half, (*state)[0], 1, r, 2));
  state = RunReferenceDataParallelStep(*half.step, half.layout, second);
  ASSERT_TRUE(state.ok()) << state.status();
  const std::vector<HostTensor> checkpoint = (*state)[0];  // after two steps on 2 ranks
  auto third = [&](const CompiledStep& c, int64_t world) {
    std::vector<std::vector<HostTensor>> args;
    for (int64_t r = 0; r < world; ++r) args.push_back(ContinueArgs(c, checkpoint, 2, r, world));
    absl::StatusOr<std::vector<std::vector<HostTensor>>> out = RunReferenceDataParallelStep(*c.step, c.layout, args);
    EXPECT_TRUE(out.ok()) << out.status();
    if (out.ok()) ExpectRanksIdentical(*out);
    return out.ok() ? (*out)[0] : std::vector<HostTensor>{};
  };
  const std::vector<HostTensor> on_two = third(half, 2), on_four = third(quarter, 4), on_one = third(global, 1);
  ASSERT_FALSE(on_two.empty() || on_four.empty() || on_one.empty());
  double max_param = 0, max_moment = 0;
  ExpectSameStep(half, on_two, on_four, &max_param, &max_moment);
  std::printf("step 3 from a 2-rank state, on 4 ranks vs 2: max relative diff params' %.3g, m' %.3g\n", max_param,
              max_moment);
  ExpectSameStep(half, on_two, on_one, &max_param, &max_moment);
  std::printf("step 3 from a 2-rank state, on 1 rank vs 2: max relative diff params' %.3g, m' %.3g\n", max_param,
              max_moment);
  EXPECT_EQ(on_four[1 + half.layout.t_index()][0], 13.0);  // t was 10 before the first of the three steps
}

// One rank all-reduces with nobody: the mean of one value is that value, so the step is
// EvaluateFunction's bit for bit, whatever the buckets.
TEST(ReferenceDataParallel, OneRankIsEvaluateFunction) {
  CompiledStep c = Compile(kGlobalBatch, /*clip_norm=*/1.0);
  const std::vector<HostTensor> args = RankArgs(c, 0, 1);
  absl::StatusOr<std::vector<HostTensor>> plain = EvaluateFunction(*c.step, args);
  ASSERT_TRUE(plain.ok()) << plain.status();
  for (int64_t cap : {int64_t{1}, int64_t{64} << 10, int64_t{25} << 20}) {
    DataParallelOptions options;
    options.buckets.cap_bytes = cap;
    absl::StatusOr<std::vector<std::vector<HostTensor>>> dp =
        RunReferenceDataParallelStep(*c.step, c.layout, {args}, options);
    ASSERT_TRUE(dp.ok()) << dp.status();
    ASSERT_EQ(dp->size(), 1u);
    ASSERT_EQ((*dp)[0].size(), plain->size());
    for (size_t i = 0; i < plain->size(); ++i) {
      EXPECT_EQ((*dp)[0][i].values(), (*plain)[i].values()) << "cap " << cap << " output " << i;
    }
  }
}

// Runs the step on another thread and gives up after a minute, so a rendezvous that hangs
// fails the test instead of blocking ctest. Everything the thread uses is its own.
absl::StatusOr<std::vector<std::vector<HostTensor>>> RunWithTimeout(std::shared_ptr<CompiledStep> c,
                                                                    std::vector<std::vector<HostTensor>> args) {
  auto done = std::make_shared<std::promise<absl::StatusOr<std::vector<std::vector<HostTensor>>>>>();
  auto result = done->get_future();
  std::thread([c, args = std::move(args), done] {
    done->set_value(RunReferenceDataParallelStep(*c->step, c->layout, args));
  }).detach();
  if (result.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    return absl::DeadlineExceededError("the data-parallel step hung");
  }
  return result.get();
}

TEST(ReferenceDataParallel, AFailingRankIsNamedAndTheOthersDoNotWaitForIt) {
  auto c = std::make_shared<CompiledStep>(Compile(kGlobalBatch / 2, /*clip_norm=*/1.0));
  // Before any node: rank 1's tokens of the wrong shape.
  std::vector<std::vector<HostTensor>> args = AllRankArgs(*c, 2);
  args[1][c->layout.first_batch_input()] = HostTensor({DType::kI32, {1, 3, kSeqLen}});
  absl::StatusOr<std::vector<std::vector<HostTensor>>> r = RunWithTimeout(c, args);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("data-parallel rank 1 of 2: argument"));
  // In the middle of the step, while rank 0 waits at the first bucket: a token id past the
  // vocabulary fails rank 1's embedding gather.
  args = AllRankArgs(*c, 2);
  args[1][c->layout.first_batch_input()].mutable_values()[5] = 1e6;
  r = RunWithTimeout(c, args);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("data-parallel rank 1 of 2: function"));
}

TEST(ReferenceDataParallel, RejectsBadRanks) {
  CompiledStep c = Compile(kGlobalBatch / 2, /*clip_norm=*/1.0);
  absl::StatusOr<std::vector<std::vector<HostTensor>>> r = RunReferenceDataParallelStep(*c.step, c.layout, {});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("needs at least one rank's arguments, got none"));

  std::vector<std::vector<HostTensor>> args = AllRankArgs(c, 2);
  args[1].pop_back();
  r = RunReferenceDataParallelStep(*c.step, c.layout, args);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("data-parallel rank 1 of 2: @train_step takes"));

  args = AllRankArgs(c, 2);
  args[1][c.layout.first_m()].mutable_values()[0] = 1;
  r = RunReferenceDataParallelStep(*c.step, c.layout, args);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("data-parallel rank 1 of 2: argument " +
                                              std::to_string(c.layout.first_m()) + " (%"));
  EXPECT_THAT(r.status().message(), HasSubstr("differs from rank 0's"));
}

// A gradient read before its bucket is complete would be read before the all-reduce: %early
// reads %g1 while the bucket {g1, g2} waits for %g2.
TEST(ReferenceDataParallel, AGradientReadBeforeItsBucketIsReadyIsRejected) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(R"(module @m
func @step {
  %x = parameter() {index=0} : f32[2]
  %g1 = mul(%x, %x) : f32[2]
  %early = neg(%g1) : f32[2]
  %g2 = add(%early, %x) : f32[2]
  %u = add(%g1, %g2) : f32[2]
  return %u
}
)");
  ASSERT_TRUE(m.ok()) << m.status();
  const Function& f = *(*m)->functions()[0];
  const Node* g1 = f.nodes()[1].get();
  const Node* g2 = f.nodes()[3].get();
  GradBucketPlan plan;
  plan.buckets.push_back({.gradients = {{0, "a", g1, 1, 8}, {1, "b", g2, 3, 8}},
                          .bytes = 16, .ready_after = g2, .ready_position = 3});
  absl::Status check = CheckGradientsReadAfterAllReduce(f, plan);
  ASSERT_FALSE(check.ok());
  EXPECT_EQ(check.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(check.message(), HasSubstr("%early (neg, node 2 of @step) reads %g1, the gradient of %a (node 1), "
                                         "before its all-reduce: gradient bucket 0 can be all-reduced only after "
                                         "%g2 (node 3)"));
  // Each gradient in a bucket of its own: %g1's is ready at once, and %early comes after it.
  // %g2's users come after it too.
  GradBucketPlan separate;
  separate.buckets.push_back({.gradients = {{0, "a", g1, 1, 8}}, .bytes = 8, .ready_after = g1, .ready_position = 1});
  separate.buckets.push_back({.gradients = {{1, "b", g2, 3, 8}}, .bytes = 8, .ready_after = g2, .ready_position = 3});
  EXPECT_TRUE(CheckGradientsReadAfterAllReduce(f, separate).ok());
  // The same gradient for two parameters would be averaged twice.
  GradBucketPlan twice;
  twice.buckets.push_back({.gradients = {{0, "a", g2, 3, 8}, {1, "b", g2, 3, 8}},
                           .bytes = 16, .ready_after = g2, .ready_position = 3});
  check = CheckGradientsReadAfterAllReduce(f, twice);
  ASSERT_FALSE(check.ok());
  EXPECT_THAT(check.message(), HasSubstr("is the gradient of both %a and %b"));
}

}  // namespace
}  // namespace kiln
