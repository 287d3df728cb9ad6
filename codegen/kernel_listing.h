// The kernels of a compile, for reading (`kiln compile --kernels-dir DIR`): each distinct
// kernel body's CUDA C++ in a file of its own, DIR/<symbol>.cu, headed by the nodes that launch
// it, their launch geometry, what ptxas gave it (registers, local frame, static shared
// memory: codegen/cubin_info.h) and how many of its blocks an SM holds (codegen/occupancy.h); and DIR/kernels.txt, one line per kernel body and geometry in
// the order the nodes list them, with how many nodes do (every node's kernels, as `kiln
// compile`'s "N listed" counts them: a copy the memory plan makes a no-op is listed, not
// launched). The files #include kernel templates by their kernels/ path in the source tree.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "codegen/compile_function.h"
#include "passes/target.h"

namespace kiln {

// Writes the listing (creating `dir`) and returns kernels.txt's text. `target.arch` names the target
// in the headers; its compute capability decides how many blocks an SM holds (codegen/occupancy.h).
absl::StatusOr<std::string> WriteKernelListing(const KernelCompileReport& report, const std::string& dir,
                                               const Target& target);

}  // namespace kiln
