#include "passes/default_pipeline.h"

#include <memory>
#include <vector>

#include "passes/canonicalize.h"
#include "passes/cse.h"
#include "passes/dce.h"

namespace kiln {
namespace {

template <typename... P>
std::vector<std::unique_ptr<Pass>> Passes(std::unique_ptr<P>... passes) {
  std::vector<std::unique_ptr<Pass>> out;
  (out.push_back(std::move(passes)), ...);
  return out;
}

}  // namespace

// `options` is unused until a step depends on it (the precision policy for narrowing, the
// target for fusion); the signature is the one those steps will need.
Pipeline BuildDefaultPipeline(const CompileOptions& options) {
  Pipeline p("default");
  // Simplify until nothing changes: folding and identities expose duplicates, merging
  // duplicates exposes new identities, and dce keeps each round's graph small.
  p.Add(std::make_unique<FixpointPass>(
      "simplify", Passes(std::make_unique<CanonicalizePass>(), std::make_unique<CsePass>(),
                         std::make_unique<DcePass>())));
  // Whatever the last round left unused.
  p.Add(std::make_unique<DcePass>());
  return p;
}

absl::StatusOr<PipelineReport> RunDefaultPipeline(Module& module, const CompileOptions& options) {
  return BuildDefaultPipeline(options).Run(module, options);
}

}  // namespace kiln
