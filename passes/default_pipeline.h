// The pipeline `kiln compile` runs: one readable list of named steps (see
// BuildDefaultPipeline). Later passes (fusion, memory plan, ...) are added there as steps.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ir/graph.h"
#include "passes/compile_options.h"
#include "passes/pipeline.h"

namespace kiln {

Pipeline BuildDefaultPipeline(const CompileOptions& options);

// The passes that can be named on their own (`kiln check --passes cse,dce`), in the
// order they are listed here.
std::vector<std::string> SinglePassNames();
// A pipeline of exactly the named passes, in the given order; "default" stands for the
// default pipeline. An unknown name is an error listing the known ones.
absl::StatusOr<Pipeline> BuildPipelineFromNames(const std::vector<std::string>& names,
                                                const CompileOptions& options);

// BuildDefaultPipeline(options).Run(module, options).
absl::StatusOr<PipelineReport> RunDefaultPipeline(Module& module, const CompileOptions& options);

// What runs on a model's forward function before autodiff appends the backward: passes
// whose replacement ops bring their own VJP (select-flash-attention), then dce.
Pipeline BuildForwardPipeline(const CompileOptions& options);
absl::StatusOr<PipelineReport> RunForwardPipeline(Module& module, const CompileOptions& options);

}  // namespace kiln
