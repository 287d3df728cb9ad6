// The pipeline `kiln compile` runs: one readable list of named steps (see
// BuildDefaultPipeline). Later passes (fusion, memory plan, ...) are added there as steps.
#pragma once

#include "absl/status/statusor.h"
#include "ir/graph.h"
#include "passes/compile_options.h"
#include "passes/pipeline.h"

namespace kiln {

Pipeline BuildDefaultPipeline(const CompileOptions& options);

// BuildDefaultPipeline(options).Run(module, options).
absl::StatusOr<PipelineReport> RunDefaultPipeline(Module& module, const CompileOptions& options);

}  // namespace kiln
