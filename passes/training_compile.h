// The compile of a training step, one sequence for every command that makes one (`kiln
// train`, `kiln compile --training`, `kiln check --training`), so they all compile the step
// that training runs:
//
//   1. the forward pipeline on @forward (passes/default_pipeline.h): passes whose ops bring
//      their own VJP (select-flash-attention) run before autodiff sees the forward;
//   2. BuildTrainingStep(@forward, step options) adds @train_step: k micro-batches, autodiff,
//      clipping, AdamW (passes/training_step.h);
//   3. the main pipeline on the module: the default pipeline, or the passes `kiln check
//      --passes` names.
//
// It is one compile: both pipelines run through one PassRunner, so the dumps are numbered in
// the order things ran (000-input, 001-after-select-flash-attention, 002-after-dce,
// 003-after-build-training-step, 004-after-canonicalize, ...), and a disabled pass name
// reaches whichever pipeline has it (only a name that neither has is an error).
//
// Usage:
//   ASSIGN_OR_RETURN(TrainingCompile compile, TrainingCompile::Create(step_options, options));
//   RETURN_IF_ERROR(compile.BuildStep(module));        // stages 1 and 2
//   RETURN_IF_ERROR(compile.RunMainPipeline(module));  // stage 3
//   Function* step = compile.step();
#pragma once

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "ir/graph.h"
#include "passes/compile_options.h"
#include "passes/pipeline.h"
#include "passes/training_step.h"

namespace kiln {

class TrainingCompile {
 public:
  // With the default pipeline as the main one. Fails before any work on a disabled pass name
  // that neither pipeline has, or a dump regex or folder that cannot be used.
  static absl::StatusOr<TrainingCompile> Create(const TrainingStepOptions& step_options,
                                                const CompileOptions& options);
  static absl::StatusOr<TrainingCompile> Create(const TrainingStepOptions& step_options,
                                                const CompileOptions& options, Pipeline main_pipeline);

  // Stages 1 and 2: runs the forward pipeline on `module` (which must have @forward, output
  // 0 the loss) and adds the step. Call once.
  absl::Status BuildStep(Module& module);
  // Stage 3, after BuildStep.
  absl::Status RunMainPipeline(Module& module);
  // All three.
  absl::Status Run(Module& module);

  // After BuildStep: the step function (in `module`) and its parameter layout.
  Function* step() const { return step_; }
  const TrainingStepLayout& layout() const { return layout_; }
  // After each stage: what its pipeline did.
  const PipelineReport& forward_report() const { return forward_report_; }
  const PipelineReport& main_report() const { return main_report_; }
  const Pipeline& forward_pipeline() const { return forward_pipeline_; }
  const Pipeline& main_pipeline() const { return main_pipeline_; }

 private:
  TrainingCompile(TrainingStepOptions step_options, Pipeline forward_pipeline, Pipeline main_pipeline,
                  std::unique_ptr<PassRunner> runner);

  TrainingStepOptions step_options_;
  Pipeline forward_pipeline_;
  Pipeline main_pipeline_;
  std::unique_ptr<PassRunner> runner_;
  Function* step_ = nullptr;
  TrainingStepLayout layout_;
  PipelineReport forward_report_;
  PipelineReport main_report_;
};

}  // namespace kiln
