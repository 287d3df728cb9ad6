// The code generator's answers to passes/backend_capabilities.h: which shapes its kernels
// take on which target. Whoever builds CompileOptions for a compile that will run on these
// kernels (the CLI, the trainers, tests) passes &CodegenCapabilities().
#pragma once

#include "passes/backend_capabilities.h"

namespace kiln {

const BackendCapabilities& CodegenCapabilities();

}  // namespace kiln
