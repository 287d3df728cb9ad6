#include "tests/testing/training_steps.h"

#include <gtest/gtest.h>

#include "frontends/llama.h"
#include "passes/training_compile.h"

namespace kiln::testing {

CompiledTrainingStep CompileLlamaTinyStepWithoutMergedGemms(int64_t batch, int64_t seq_len, Precision precision,
                                                            double clip_norm, int64_t accum) {
  CompiledTrainingStep c;
  c.module = *BuildLlamaModule(*PresetConfig("llama-tiny"), {.batch = batch, .seq_len = seq_len, .precision = precision});
  TrainingStepOptions step_options;
  step_options.adamw.clip_norm = clip_norm;
  step_options.accum_steps = accum;
  CompileOptions options;
  options.disabled_passes = {"merge-sibling-gemms"};
  absl::StatusOr<TrainingCompile> compile = TrainingCompile::Create(step_options, options);
  EXPECT_TRUE(compile.ok()) << compile.status();
  if (!compile.ok()) return c;
  absl::Status run = compile->Run(*c.module);
  EXPECT_TRUE(run.ok()) << run;
  c.step = compile->step();
  c.layout = compile->layout();
  return c;
}

}  // namespace kiln::testing
