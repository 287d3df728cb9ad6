// rematerialize (passes/rematerialize.h): a value saved for a late use is recomputed by a
// loop fusion that reads its inputs; RunPassOnText checks that every rewrite keeps the
// function's meaning on random inputs.
#include "passes/rematerialize.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "frontends/llama.h"
#include "frontends/model_config.h"
#include "ir/graph.h"
#include "ir/text_format.h"
#include "passes/default_pipeline.h"
#include "passes/training_step.h"
#include "runtime/differential_check.h"
#include "tests/testing/filecheck.h"
#include "tests/testing/pass_test.h"

namespace kiln {
namespace {

// A SwiGLU-like step: %h is used once early (%y) and once late (%late, after a chain of
// `filler` nodes); %dg reads every input of %h. `late_first` puts %late before %dg (as
// autodiff orders the weight gradient before the activation's VJP), else after it.
std::string Step(int filler, bool late_first, absl::string_view sibling_operands = "%g, %d, %u") {
  std::string chain;
  std::string last = "%y";
  for (int i = 0; i < filler; ++i) {
    absl::StrAppend(&chain, "  %f", i, " = neg(", last, ") : f32[8,16]\n");
    last = absl::StrCat("%f", i);
  }
  const std::string late = "  %late = reduce_sum(%h) {dims=[0]} : f32[16]\n";
  std::string sibling = absl::StrCat("  %dg = fusion(", sibling_operands, R"() {kind=loop} : f32[8,16] {
    %g = parameter() {index=0} : f32[8,16]
    %d = parameter() {index=1} : f32[8,16]
    %u = parameter() {index=2} : f32[8,16]
    %s = sigmoid(%g) : f32[8,16]
    %du = mul(%d, %s) : f32[8,16]
    %dg = mul(%du, %u) : f32[8,16]
    return %dg
  }
)");
  return absl::StrCat(R"(module @m
func @main {
  %g = parameter() {index=0} : f32[8,16]
  %u = parameter() {index=1} : f32[8,16]
  %d = parameter() {index=2} : f32[8,16]
  %h = fusion(%g, %u) {kind=loop} : f32[8,16] {
    %g = parameter() {index=0} : f32[8,16]
    %u = parameter() {index=1} : f32[8,16]
    %s = sigmoid(%g) : f32[8,16]
    %h = mul(%s, %u) : f32[8,16]
    return %h
  }
  %y = exp(%h) : f32[8,16]
)",
                      chain, late_first ? late + sibling : sibling + late, "  return ", last, ", %late, %dg\n}\n");
}

std::string RunRemat(absl::string_view text, bool expect_change) {
  RematerializePass pass(/*min_bytes=*/0, /*min_gap=*/4);
  return testing::RunPassOnText(pass, text, expect_change);
}

TEST(Rematerialize, TheLateUseReadsACopyComputedByTheSiblingMovedUpToIt) {
  const std::string out = RunRemat(Step(6, /*late_first=*/true), true);
  EXPECT_TRUE(testing::FileCheck(out, R"(
CHECK: %h = fusion(%g, %u) {kind=loop}
CHECK: %y = exp(%h)
CHECK: %dg, %h.remat = fusion(%g, %d, %u) {kind=loop} : (f32[8,16], f32[8,16])
CHECK: %du = mul(%d, %s)
CHECK: %h.remat = mul(%s.remat, %u)
CHECK: return %dg, %h.remat
CHECK: %late = reduce_sum(%h.remat)
CHECK: return %f5, %late, %dg
)").ok()) << out;
}

TEST(Rematerialize, ASiblingBeforeTheLateUseStaysWhereItIs) {
  const std::string out = RunRemat(Step(6, /*late_first=*/false), true);
  EXPECT_TRUE(testing::FileCheck(out, R"(
CHECK: %f5 = neg
CHECK: %dg, %h.remat = fusion(%g, %d, %u)
CHECK: %late = reduce_sum(%h.remat)
)").ok()) << out;
}

TEST(Rematerialize, AnOnlyUseMovesTheWholeComputation) {
  // %h read only late: the forward's copy goes, the sibling computes it.
  std::string text = Step(6, true);
  text = absl::StrReplaceAll(text, {{"  %y = exp(%h) : f32[8,16]\n", "  %y = exp(%g) : f32[8,16]\n"}});
  const std::string out = RunRemat(text, true);
  EXPECT_TRUE(testing::FileCheck(out, R"(
CHECK-NOT: %h = fusion
CHECK: %dg, %h.remat = fusion(%g, %d, %u)
CHECK: %late = reduce_sum(%h.remat)
)").ok()) << out;
}

TEST(Rematerialize, WithoutASiblingACopyOfItsOwnGoesJustBeforeTheLateUse) {
  // %dg reads only %g and %d: no sibling. %u is read by %tail after %late, so both of %h's
  // inputs are held until %late anyway: a copy of %h's kernel goes right before it.
  std::string text = Step(6, true, "%g, %d, %d");
  text = absl::StrReplaceAll(text, {{"  return %f5, %late, %dg\n", "  %tail = neg(%u) : f32[8,16]\n  return %f5, %late, %dg, %tail\n"}});
  RematerializePass pass(/*min_bytes=*/0, /*min_gap=*/4, /*min_alone_bytes=*/0);
  const std::string out = testing::RunPassOnText(pass, text, true);
  EXPECT_TRUE(testing::FileCheck(out, R"(
CHECK: %h = fusion(%g, %u) {kind=loop}
CHECK: %y = exp(%h)
CHECK: %f5 = neg
CHECK: %h.remat = fusion(%g, %u) {kind=loop} : f32[8,16]
CHECK-NEXT: %g = parameter
CHECK: %late = reduce_sum(%h.remat)
)").ok()) << out;
  // Above min_alone_bytes (16 MiB by default) only.
  RematerializePass small(/*min_bytes=*/0, /*min_gap=*/4);
  testing::RunPassOnText(small, text, false);
}

TEST(Rematerialize, LeavesShortLivedValuesAndSiblingsMissingAnInput) {
  RunRemat(Step(2, true), false);  // the late use is 3 nodes after the early one: under min_gap
  // A sibling that does not read %u would have to read it anew.
  std::string no_u = Step(6, true, "%g, %d, %d");
  RunRemat(no_u, false);
  // Above the default thresholds (1 MiB, 16 nodes), nothing in this small graph qualifies.
  RematerializePass defaults;
  testing::RunPassOnText(defaults, Step(6, true), false);
}

TEST(Rematerialize, ASiblingThatNeedsTheLateUsesResultCannotMoveAboveIt) {
  // %dg reads %late2 (computed from %late): it cannot move above %late.
  std::string text = Step(6, true);
  text = absl::StrReplaceAll(text, {{"  %dg = fusion(%g, %d, %u)", "  %late2 = broadcast(%late) {dims=[1]} : f32[8,16]\n  %dg = fusion(%g, %late2, %u)"},
                                    {"return %f5, %late, %dg", "return %f5, %late, %dg"}});
  RunRemat(text, false);
}

// llama-tiny's training step after the default pipeline: each layer's silu(gate) * up, saved
// for the down projection's weight gradient, is recomputed (by a kernel of its own: after
// merge-sibling-gemms the SwiGLU VJP's kernel writes the gate/up gradient, twice h's width),
// with the thresholds lowered to the tiny model's sizes, and the step means the same.
TEST(Rematerialize, LlamaTinyStepRecomputesEachLayersSwiGluProduct) {
  ModelConfig config = *PresetConfig("llama-tiny");
  std::unique_ptr<Module> m = *BuildLlamaModule(config, {.batch = 2, .seq_len = 16, .precision = Precision::kBf16});
  TrainingStepLayout layout;
  ASSERT_TRUE(BuildTrainingStep(*m, *m->FindFunction("forward"), {}, &layout).ok());
  m->RemoveFunction("forward");
  ASSERT_TRUE(RunDefaultPipeline(*m, {}).ok());
  std::unique_ptr<Module> before = CloneModule(*m);
  RematerializePass pass(/*min_bytes=*/0, RematerializePass::kMinGap, /*min_alone_bytes=*/0);
  absl::StatusOr<bool> changed = pass.Run(*m);
  ASSERT_TRUE(changed.ok()) << changed.status();
  // The default pipeline ran it already at the real thresholds, where llama-tiny's
  // activations (a few KiB) are too small to take; at 0 bytes it takes every layer's.
  EXPECT_TRUE(*changed);
  // At 0 bytes the weights' bf16 copies are recomputed too; h is the MLP's one activation
  // ([batch, seq, hidden]) among them.
  int activations = 0;
  for (const auto& n : m->functions()[0]->nodes()) {
    activations += absl::EndsWith(n->name(), ".remat") && absl::EndsWith(n->scope(), ".mlp") &&
                   !n->has_multiple_results() && n->type().dims.size() == 3;
  }
  EXPECT_EQ(activations, config.n_layers);
  DifferentialCheckOptions check;
  for (int64_t i = 0; i < layout.num_params; ++i) check.ranges[layout.first_v() + i] = {0.0, 1e-2};
  check.ranges[layout.t_index()] = {1.0, 100.0};
  check.ranges[layout.lr_index()] = {1e-4, 1e-2};
  absl::Status same = CheckMeaningPreserved(*before, *m, check);
  EXPECT_TRUE(same.ok()) << same;
}

}  // namespace
}  // namespace kiln
