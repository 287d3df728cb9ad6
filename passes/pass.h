// The pass interface (XLA's HloPassInterface shape): a pass has a short kebab-case name and
// rewrites a module in place, saying whether it changed anything. Pipelines (passes/pipeline.h)
// run passes in order and add verification, dumps, timing and change-reporting checks around
// each one, so a pass itself only rewrites.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"

namespace kiln {

class PassRunner;  // passes/pipeline.h

class Pass {
 public:
  virtual ~Pass() = default;

  // Kebab-case, unique within a pipeline: "cse", "canonicalize", "fuse-residual-norm".
  virtual absl::string_view name() const = 0;

  // Rewrites `module`; returns whether it changed (the pipeline verifies only then, and in
  // tests checks the answer against the printed module). An error leaves the module in an
  // unspecified but verifiable-or-reported state.
  virtual absl::StatusOr<bool> Run(Module& module) = 0;

  // The passes this one is made of, for a pass that groups others (FixpointPass); empty for
  // a plain pass. Disabling by name reaches them.
  virtual std::vector<Pass*> members() const { return {}; }

  // How a pipeline runs this pass. A grouping pass overrides it to run each member through
  // `runner`, so every member is verified, dumped, timed and can be disabled like a top-level
  // pass; a plain pass is simply Run.
  virtual absl::StatusOr<bool> RunWith(PassRunner& runner, Module& module) { return Run(module); }
};

}  // namespace kiln
