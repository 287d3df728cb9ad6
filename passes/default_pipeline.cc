#include "passes/default_pipeline.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "passes/canonicalize.h"
#include "passes/cse.h"
#include "passes/dce.h"
#include "passes/fusion.h"
#include "passes/select_flash_attention.h"

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
  // Last: it only marks kernel groups, which no pass above would keep track of.
  p.Add(std::make_unique<FusionPass>());
  return p;
}

namespace {
// One factory per pass that can run alone; the default pipeline's steps are built from the
// same classes.
std::unique_ptr<Pass> MakeSinglePass(absl::string_view name, const CompileOptions& options) {
  if (name == "canonicalize") return std::make_unique<CanonicalizePass>();
  if (name == "cse") return std::make_unique<CsePass>();
  if (name == "dce") return std::make_unique<DcePass>();
  if (name == "fuse-loops") return std::make_unique<FusionPass>();
  if (name == "select-flash-attention") {
    return std::make_unique<SelectFlashAttentionPass>(options.capabilities, options.target.value_or(Target{}));
  }
  return nullptr;
}
}  // namespace

std::vector<std::string> SinglePassNames() {
  return {"canonicalize", "cse", "dce", "fuse-loops", "select-flash-attention"};
}

absl::StatusOr<Pipeline> BuildPipelineFromNames(const std::vector<std::string>& names,
                                                const CompileOptions& options) {
  if (names.size() == 1 && names[0] == "default") return BuildDefaultPipeline(options);
  Pipeline p(absl::StrJoin(names, ","));
  for (const std::string& name : names) {
    std::unique_ptr<Pass> pass = MakeSinglePass(name, options);
    if (!pass) {
      return absl::InvalidArgumentError(absl::StrCat("unknown pass '", name, "' (known: default, ",
                                                     absl::StrJoin(SinglePassNames(), ", "), ")"));
    }
    p.Add(std::move(pass));
  }
  return p;
}

absl::StatusOr<PipelineReport> RunDefaultPipeline(Module& module, const CompileOptions& options) {
  return BuildDefaultPipeline(options).Run(module, options);
}

Pipeline BuildForwardPipeline(const CompileOptions& options) {
  Pipeline p("forward");
  p.Add(std::make_unique<SelectFlashAttentionPass>(options.capabilities, options.target.value_or(Target{})));
  p.Add(std::make_unique<DcePass>());  // the decomposed attention it replaced
  return p;
}

absl::StatusOr<PipelineReport> RunForwardPipeline(Module& module, const CompileOptions& options) {
  return BuildForwardPipeline(options).Run(module, options);
}

}  // namespace kiln
