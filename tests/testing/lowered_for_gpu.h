// For GPU tests that build a function by hand: the backend lowering every compile applies
// before codegen (lower-gemm), on a copy, since codegen (CompileForGpu) takes lowered IR.
#pragma once

#include <memory>

#include "ir/graph.h"

namespace kiln::testing {

// A module holding a copy of `f` (same name, ids, names and scopes) with every dot_general
// lowered to a gemm; its function is functions()[0]. Aborts on a malformed `f` (a test bug).
std::unique_ptr<Module> LoweredForGpu(const Function& f);

}  // namespace kiln::testing
