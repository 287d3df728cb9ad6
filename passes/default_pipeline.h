// The pipelines kiln runs: each one readable list of named steps. Their passes are listed,
// with a description, in passes/pass_registry.h.
//
//   forward   on a model's forward function before autodiff appends the backward: passes
//             whose replacement ops bring their own VJP (select-flash-attention), then dce;
//   default   what `kiln compile` runs, on any module and on the training step:
//             simplify(canonicalize, cse, dce), dce, lower-gemm, gemm-bias-epilogue,
//             elide-grad-zeroing, narrow-activations-bf16, select-fp8-gemm,
//             fuse-fp8-scale-update, fuse-residual-norm, merge-sibling-gemms, chunk-lm-head, expand-rope, fuse-loops,
//             rematerialize, group-optimizer-updates.
//
// A training step is compiled by passes/training_compile.h: the forward pipeline, the step,
// then the default pipeline.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"
#include "passes/compile_options.h"
#include "passes/pipeline.h"

namespace kiln {

Pipeline BuildDefaultPipeline(const CompileOptions& options);

// The default pipeline's first step: canonicalize, cse and dce rerun until a round changes
// nothing (a FixpointPass).
inline constexpr absl::string_view kSimplifyPassName = "simplify";
std::unique_ptr<Pass> BuildSimplifyPass(const CompileOptions& options);

// A pipeline of exactly the named passes (passes/pass_registry.h), in the given order;
// "default" alone stands for the default pipeline. An unknown name is an error listing the
// known ones.
absl::StatusOr<Pipeline> BuildPipelineFromNames(const std::vector<std::string>& names,
                                                const CompileOptions& options);

// BuildDefaultPipeline(options).Run(module, options).
absl::StatusOr<PipelineReport> RunDefaultPipeline(Module& module, const CompileOptions& options);

Pipeline BuildForwardPipeline(const CompileOptions& options);
absl::StatusOr<PipelineReport> RunForwardPipeline(Module& module, const CompileOptions& options);

}  // namespace kiln
