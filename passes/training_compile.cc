#include "passes/training_compile.h"

#include "absl/strings/str_cat.h"
#include "ir/status_macros.h"
#include "passes/default_pipeline.h"

namespace kiln {

TrainingCompile::TrainingCompile(TrainingStepOptions step_options, Pipeline forward_pipeline, Pipeline main_pipeline,
                                 std::unique_ptr<PassRunner> runner)
    : step_options_(std::move(step_options)),
      forward_pipeline_(std::move(forward_pipeline)),
      main_pipeline_(std::move(main_pipeline)),
      runner_(std::move(runner)) {}

absl::StatusOr<TrainingCompile> TrainingCompile::Create(const TrainingStepOptions& step_options,
                                                        const CompileOptions& options) {
  return Create(step_options, options, BuildDefaultPipeline(options));
}

absl::StatusOr<TrainingCompile> TrainingCompile::Create(const TrainingStepOptions& step_options,
                                                        const CompileOptions& options, Pipeline main_pipeline) {
  Pipeline forward_pipeline = BuildForwardPipeline(options);
  RETURN_IF_ERROR(CheckDisabledPasses(options, {&forward_pipeline, &main_pipeline}));
  ASSIGN_OR_RETURN(std::unique_ptr<PassRunner> runner, PassRunner::Create(options));
  TrainingStepOptions step = step_options;
  // The precision policy decides the step's GEMM operands: under fp8 the step is built with
  // the FP8 policy (passes/fp8_policy.h), which select-fp8-gemm then implements.
  if (options.precision == Precision::kFp8) {
    step.fp8 = options.fp8;
    RETURN_IF_ERROR(Fp8Policy::Create(options.fp8).status());  // bad options fail before any work
  } else {
    step.fp8.reset();
  }
  return TrainingCompile(std::move(step), std::move(forward_pipeline), std::move(main_pipeline), std::move(runner));
}

absl::Status TrainingCompile::BuildStep(Module& module) {
  if (step_ != nullptr) return absl::FailedPreconditionError("the training step is built already");
  if (module.FindFunction("forward") == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("module @", module.name(), " has no @forward: a training step needs a forward function whose "
                     "output 0 is the loss"));
  }
  RETURN_IF_ERROR(runner_->DumpInput(module));
  ASSIGN_OR_RETURN(forward_report_, forward_pipeline_.Run(module, *runner_));
  // Looked up again: the forward pipeline may have rewritten it.
  const Function* forward = module.FindFunction("forward");
  ASSIGN_OR_RETURN(step_, BuildTrainingStep(module, *forward, step_options_, &layout_));
  return runner_->DumpAfterStep(module, "build-training-step");
}

absl::Status TrainingCompile::RunMainPipeline(Module& module) {
  if (step_ == nullptr) return absl::FailedPreconditionError("RunMainPipeline before BuildStep");
  ASSIGN_OR_RETURN(main_report_, main_pipeline_.Run(module, *runner_));
  return absl::OkStatus();
}

absl::Status TrainingCompile::Run(Module& module) {
  RETURN_IF_ERROR(BuildStep(module));
  return RunMainPipeline(module);
}

}  // namespace kiln
