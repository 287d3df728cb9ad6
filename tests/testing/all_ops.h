// A module that uses every op of ir/op_table.h at least once, for round-trip and
// serialization tests. AllOpsModuleCovers() tells whether it still does (a new op must be
// added here, and a test fails until it is).
#pragma once

#include <memory>

#include "ir/graph.h"

namespace kiln::testing {

std::unique_ptr<Module> BuildAllOpsModule();
// The opcodes BuildAllOpsModule() does not use (empty when it covers the table).
std::vector<Opcode> OpsMissingFromAllOpsModule();

}  // namespace kiln::testing
