// The training compile sequence (passes/training_compile.h) that kiln train, kiln compile
// --training and kiln check --training share: it compiles the step the stages compile one by
// one, with the step options given; disabled names reach either pipeline; and the dumps of
// the whole compile carry one numbering, in the order things ran.
#include "passes/training_compile.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "frontends/llama.h"
#include "ir/text_format.h"
#include "passes/default_pipeline.h"
#include "tests/testing/models.h"

namespace kiln {
namespace {

// Small llama with flash-attention shapes, so the forward pipeline changes the forward.
std::unique_ptr<Module> FlashTiny() {
  ModelConfig c = testing::FlashTinyConfig();
  absl::StatusOr<std::unique_ptr<Module>> m =
      BuildLlamaModule(c, {.batch = 1, .seq_len = c.seq_len, .precision = Precision::kBf16});
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

TrainingStepOptions AccumTwo() {
  TrainingStepOptions o;
  o.accum_steps = 2;
  o.adamw.weight_decay = 0.05;
  o.adamw.clip_norm = 0.5;
  return o;
}

TEST(TrainingCompile, CompilesTheStepTheStagesCompileWithTheGivenStepOptions) {
  const CompileOptions options;
  std::unique_ptr<Module> by_hand = FlashTiny();
  ASSERT_TRUE(RunForwardPipeline(*by_hand, options).ok());
  ASSERT_TRUE(BuildTrainingStep(*by_hand, *by_hand->FindFunction("forward"), AccumTwo()).ok());
  ASSERT_TRUE(RunDefaultPipeline(*by_hand, options).ok());

  std::unique_ptr<Module> m = FlashTiny();
  absl::StatusOr<TrainingCompile> compile = TrainingCompile::Create(AccumTwo(), options);
  ASSERT_TRUE(compile.ok()) << compile.status();
  ASSERT_TRUE(compile->Run(*m).ok());
  EXPECT_EQ(PrintModule(*m), PrintModule(*by_hand));
  ASSERT_EQ(compile->step(), m->FindFunction("train_step"));
  // Two micro-batches: the batch inputs gain a leading dim of 2.
  const TrainingStepLayout& layout = compile->layout();
  EXPECT_EQ(compile->step()->parameters()[layout.first_batch_input()]->type().dims.front(), 2);
  EXPECT_EQ(compile->forward_report().pipeline, "forward");
  EXPECT_EQ(compile->main_report().pipeline, "default");
}

TEST(TrainingCompile, ADisabledPassReachesWhicheverPipelineHasIt) {
  CompileOptions options;
  options.disabled_passes = {"cse", "select-flash-attention"};
  absl::StatusOr<TrainingCompile> compile = TrainingCompile::Create({}, options);
  ASSERT_TRUE(compile.ok()) << compile.status();
  std::unique_ptr<Module> m = FlashTiny();
  ASSERT_TRUE(compile->Run(*m).ok());
  auto outcome = [](const PipelineReport& report, absl::string_view name) {
    for (const PassRecord& r : report.passes) {
      if (r.name == name) return r.outcome;
    }
    ADD_FAILURE() << name << " not in pipeline " << report.pipeline;
    return PassRecord::Outcome::kChanged;
  };
  EXPECT_EQ(outcome(compile->forward_report(), "select-flash-attention"), PassRecord::Outcome::kDisabled);
  EXPECT_EQ(outcome(compile->main_report(), "cse"), PassRecord::Outcome::kDisabled);
  int attention = 0;
  for (const auto& n : m->FindFunction("forward")->nodes()) attention += n->opcode() == Opcode::kAttention;
  EXPECT_EQ(attention, 0);

  options.disabled_passes = {"cse", "nope"};
  absl::StatusOr<TrainingCompile> bad = TrainingCompile::Create({}, options);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "cannot disable unknown pass 'nope'; pipeline forward has: select-flash-attention, dce; pipeline default "
            "has: simplify, canonicalize, cse, dce, lower-gemm, gemm-bias-epilogue, elide-grad-zeroing, narrow-activations-bf16, select-fp8-gemm, "
            "fuse-fp8-scale-update, fuse-residual-norm, merge-sibling-gemms, chunk-lm-head, expand-rope, fuse-loops, "
            "fuse-cache-write, merge-cache-write-siblings, fuse-gemv-glu, fuse-norm-between-gemvs, rematerialize, "
            "group-optimizer-updates");
}

TEST(TrainingCompile, DumpsAreNumberedOnceInTheOrderThingsRan) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("kiln_training_compile_test_", ::getpid());
  std::filesystem::remove_all(dir);
  CompileOptions options;
  options.dump_dir = dir.string();
  absl::StatusOr<TrainingCompile> compile = TrainingCompile::Create({}, options);
  ASSERT_TRUE(compile.ok()) << compile.status();
  std::unique_ptr<Module> m = FlashTiny();
  ASSERT_TRUE(compile->Run(*m).ok());

  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) files.push_back(entry.path().filename());
  std::sort(files.begin(), files.end());
  // The input, one file per pass that ran (members of simplify included, each round; a pass
  // that is off by default writes none), and the step in between; every number once,
  // counting up from 000.
  size_t passes_run = 0;
  for (const PipelineReport* report : {&compile->forward_report(), &compile->main_report()}) {
    for (const PassRecord& r : report->passes) passes_run += r.outcome != PassRecord::Outcome::kOff;
  }
  ASSERT_EQ(files.size(), 1 + passes_run + 1);
  for (size_t i = 0; i < files.size(); ++i) EXPECT_EQ(files[i].substr(0, 4), absl::StrFormat("%03d-", i));
  EXPECT_EQ(files[0], "000-input.kir");
  EXPECT_EQ(files[1], "001-after-select-flash-attention.kir");
  EXPECT_EQ(files[2], "002-after-dce.kir");
  EXPECT_EQ(files[3], "003-after-build-training-step.kir");
  EXPECT_EQ(files[4], "004-after-canonicalize.kir");
  EXPECT_EQ(files.back(), absl::StrFormat("%03d-after-group-optimizer-updates.kir", files.size() - 1));
  std::filesystem::remove_all(dir);
}

TEST(TrainingCompile, StagesRunInOrder) {
  absl::StatusOr<TrainingCompile> compile = TrainingCompile::Create({}, CompileOptions{});
  ASSERT_TRUE(compile.ok());
  std::unique_ptr<Module> m = FlashTiny();
  EXPECT_EQ(compile->RunMainPipeline(*m).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(compile->BuildStep(*m).ok());
  EXPECT_EQ(compile->BuildStep(*m).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(compile->RunMainPipeline(*m).ok());

  Module empty("empty");
  absl::StatusOr<TrainingCompile> other = TrainingCompile::Create({}, CompileOptions{});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->BuildStep(empty).message(),
            "module @empty has no @forward: a training step needs a forward function whose output 0 is the loss");
}

}  // namespace
}  // namespace kiln
