// Pipeline: runs passes in order, and is where debugging lives (after XLA's
// HloPassPipeline). Around every pass it
//   - skips it if CompileOptions::disabled_passes names it (shown as disabled in the report),
//     or if it is off by default (Pass::off_by_default) and enabled_passes does not name it
//     (shown as off);
//   - times it and counts nodes before and after;
//   - verifies the module if the pass reported a change: "after cse: <verifier error>";
//   - with check_change_reporting, compares a hash of the printed module before and after
//     and fails with "cse changed the module but reported no change";
//   - dumps the printed module to <dump_dir>/NNN-after-<pass>.kir when the name matches
//     dump_regex (plus 000-input.kir), each file readable by `kiln verify`.
// FixpointPass reruns a group until a round changes nothing; its members go through the
// same checks, one report row per member per round.
//
// A compile may run several pipelines with work in between (the training step: the forward
// pipeline, then BuildTrainingStep, then the default pipeline; passes/training_compile.h).
// They share one PassRunner, so the dumps of the whole compile are numbered once, in the order
// the passes ran, and a disabled pass name is checked against every pipeline of the compile
// (CheckDisabledPasses): it is an error only when none of them has the pass.
//
// Usage:
//   Pipeline p("simplify");
//   p.Add(std::make_unique<CsePass>()).Add(std::make_unique<DcePass>());
//   ASSIGN_OR_RETURN(PipelineReport report, p.Run(module, options));
//   std::cout << report.ToString();
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "passes/compile_options.h"
#include "passes/pass.h"

namespace kiln {

struct PassRecord {
  enum class Outcome { kChanged, kUnchanged, kDisabled, kOff };
  std::string name;
  Outcome outcome = Outcome::kUnchanged;
  int depth = 0;  // 0 for a top-level pass, 1 for a member of a group, ...
  int round = 0;  // which round of its fixpoint group (from 1); 0 outside a group
  double wall_ms = 0;
  int64_t nodes_before = 0;  // over all functions; equal to nodes_after when disabled or off
  int64_t nodes_after = 0;
};

// "changed", "unchanged", "disabled", "off" (an off-by-default pass not enabled)
absl::string_view OutcomeName(PassRecord::Outcome outcome);

struct PipelineReport {
  std::string pipeline;
  // In execution order; a group's row comes before its members' rows.
  std::vector<PassRecord> passes;
  // Things worth knowing that are not errors, e.g. a fixpoint group stopped at its cap.
  std::vector<std::string> notes;
  double total_ms = 0;

  // A table, one row per record, members indented under their group:
  //   pass                     round  result      ms     nodes
  //   simplify                        changed     1.21   40 -> 22
  //     canonicalize           1      changed     0.50   40 -> 31
  std::string ToString() const;
};

// Ok when `pattern` compiles as CompileOptions::dump_regex (std::regex ECMAScript); else
// why not, in kiln's words ("a '(' is not closed"), not the C++ library's.
absl::Status CheckDumpRegex(const std::string& pattern);

// The state of one compile's run of passes: the dump numbering, the compiled dump regex, the
// report of the pipeline being run. Pipeline::Run(module, options) makes one for itself; a
// compile of several pipelines makes one and runs each through it. Grouping passes get it to
// run their members with the same checks (see Pass::RunWith).
class PassRunner {
 public:
  // Fails on a dump_regex that is not a regular expression (whether or not dumping is on, so
  // a typo is caught before any work) or a dump_dir that cannot be created.
  static absl::StatusOr<std::unique_ptr<PassRunner>> Create(const CompileOptions& options);

  const CompileOptions& options() const { return options_; }
  PipelineReport& report() { return report_; }

  // Runs `pass` on `module` with the checks listed at the top of this file. `round` is the
  // fixpoint round when called by a group (0 otherwise).
  absl::StatusOr<bool> RunPass(Pass& pass, Module& module, int round = 0);

  // Writes 000-input.kir when dumping is on.
  absl::Status DumpInput(const Module& module);
  // For a step of a compile that is not a pass (building the training step): takes the next
  // number and, when dumping is on, writes NNN-after-<step>.kir whatever dump_regex says, so
  // the dumps show what the next pipeline starts from.
  absl::Status DumpAfterStep(const Module& module, absl::string_view step);

 private:
  explicit PassRunner(const CompileOptions& options);
  absl::Status Dump(const Module& module, absl::string_view label);

  const CompileOptions options_;
  absl::flat_hash_set<std::string> disabled_;
  absl::flat_hash_set<std::string> enabled_;
  std::optional<std::regex> dump_regex_;
  PipelineReport report_;
  int depth_ = 0;
  int steps_finished_ = 0;  // passes and other steps of the compile: numbers the dump files
};

// Reruns `members` in order until a whole round changes nothing, at most
// CompileOptions::fixpoint_max_rounds rounds. Reports a change if any round changed.
class FixpointPass : public Pass {
 public:
  FixpointPass(std::string name, std::vector<std::unique_ptr<Pass>> members);

  absl::string_view name() const override { return name_; }
  // Runs with default CompileOptions (verification on, no dumps).
  absl::StatusOr<bool> Run(Module& module) override;
  std::vector<Pass*> members() const override;
  absl::StatusOr<bool> RunWith(PassRunner& runner, Module& module) override;

 private:
  std::string name_;
  std::vector<std::unique_ptr<Pass>> members_;
};

class Pipeline {
 public:
  explicit Pipeline(std::string name = "pipeline") : name_(std::move(name)) {}
  Pipeline(Pipeline&&) = default;
  Pipeline& operator=(Pipeline&&) = default;

  const std::string& name() const { return name_; }
  Pipeline& Add(std::unique_ptr<Pass> pass);

  // The pass names, each once, in order of first appearance; members of groups included
  // (after their group). These are what disabled_passes may name.
  std::vector<std::string> PassNames() const;
  // The first pass of that name, members of groups included; null if none. For reading what
  // a pass kept of its last run (fuse-loops' decisions, say).
  const Pass* FindPass(absl::string_view name) const;
  // The passes in order, groups with their members: "simplify(canonicalize, cse, dce), dce,
  // fuse-loops". For help texts, so they say what the code runs.
  std::string Describe() const;

  // A compile of this pipeline alone: checks options.disabled_passes against it, dumps the
  // input and runs every pass on `module` (see the top of this file). The first error stops
  // the run; with verify_each the input is verified before the first pass ("input: ...").
  absl::StatusOr<PipelineReport> Run(Module& module, const CompileOptions& options) const;
  // The same as one part of a longer compile, through its runner (the caller has checked the
  // disabled names against all of the compile's pipelines and dumped the input).
  absl::StatusOr<PipelineReport> Run(Module& module, PassRunner& runner) const;

 private:
  std::string name_;
  std::vector<std::unique_ptr<Pass>> passes_;
};

// Fails when options.disabled_passes (or enabled_passes) names a pass that none of `pipelines`
// has: "cannot disable unknown pass 'x'; pipeline forward has: ...; pipeline default has: ...";
// or when enabled_passes names one that is on anyway.
absl::Status CheckDisabledPasses(const CompileOptions& options, const std::vector<const Pipeline*>& pipelines);

// Nodes over every function of `module`.
int64_t CountNodes(const Module& module);

}  // namespace kiln
