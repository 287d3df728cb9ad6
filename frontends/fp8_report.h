// `kiln train --report`'s FP8 section: what the policy made of the step (passes/fp8_policy.h,
// passes/select_fp8_gemm.h) and what delayed scaling has done so far (the states).
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/host_tensor.h"
#include "passes/training_step.h"

namespace kiln {

// `step` the compiled step function; `decisions` select-fp8-gemm's (one line per candidate);
// `states` the current scaling states in layout order. Empty when the step has no FP8 policy.
std::string FormatFp8Report(const Function& step, const TrainingStepLayout& layout,
                            const std::vector<std::string>& decisions, const std::vector<HostTensor>& states);

}  // namespace kiln
