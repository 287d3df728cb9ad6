// The pass interface (XLA's HloPassInterface shape): a pass has a short kebab-case name and
// rewrites a module in place, saying whether it changed anything. Pipelines (passes/pipeline.h)
// run passes in order and add verification, dumps, timing and change-reporting checks around
// each one, so a pass itself only rewrites. Most passes rewrite one function at a time and
// derive from FunctionPass, which does the loop over the module. Every pass kiln has is
// listed, with a description and a factory, in passes/pass_registry.h.
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

  // A pass that a pipeline holds but runs only when CompileOptions::enabled_passes names it
  // (`--enable-pass`): one whose kernels have not yet been measured on a GPU, kept where the
  // pipeline would run it so that an A/B is one flag.
  virtual bool off_by_default() const { return false; }

  // How a pipeline runs this pass. A grouping pass overrides it to run each member through
  // `runner`, so every member is verified, dumped, timed and can be disabled like a top-level
  // pass; a plain pass is simply Run.
  virtual absl::StatusOr<bool> RunWith(PassRunner& runner, Module& module) { return Run(module); }
};

// A pass that rewrites each function on its own, knowing nothing of the others: it says what
// to do with one function, and Run visits them all in module order. The module changed if
// any function did; the first error stops the run and names the function ("@train_step: ...";
// the pipeline adds the pass's name in front).
class FunctionPass : public Pass {
 public:
  absl::StatusOr<bool> Run(Module& module) final;
  // Rewrites `function` alone; returns whether it changed.
  virtual absl::StatusOr<bool> RunOnFunction(Function& function) = 0;

 protected:
  // Called once per Run, before the first function: a pass that keeps what it decided for the
  // caller to read (select-flash-attention's decisions) starts afresh here.
  virtual void StartRun() {}
};

}  // namespace kiln
