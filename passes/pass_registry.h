// Every pass kiln has, in one table: its name (what --disable-pass, --dump-after and
// `kiln check --passes` take), a one-line description (`kiln compile --help` prints the
// table) and a factory. A pass's name is defined once, as its class's kName; the table reads
// it, and tests/pass_registry_test.cc checks that every pass of kiln's pipelines is here.
//
// Adding a pass: write the class (deriving from FunctionPass if it rewrites functions one at a
// time), add its row to the table in pass_registry.cc, and add it to a pipeline in
// passes/default_pipeline.cc if it should run by default.
#pragma once

#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "passes/compile_options.h"
#include "passes/pass.h"

namespace kiln {

struct PassInfo {
  absl::string_view name;
  absl::string_view description;  // one line, what it does to the IR
  std::unique_ptr<Pass> (*make)(const CompileOptions& options);
  // The pass may change f32 rounding without changing the math (it reassociates f32 sums):
  // `kiln check` then compares with f32 values kept in double, where it is exact.
  bool reassociates_f32_sums = false;
};

// The table, sorted by name.
absl::Span<const PassInfo> RegisteredPasses();
// nullptr when no pass has that name.
const PassInfo* FindRegisteredPass(absl::string_view name);
// "canonicalize, cse, dce, ...": for error messages.
std::string RegisteredPassNames();
// One line per pass, "  <name padded>  <description>", for help texts.
std::string FormatPassTable();

}  // namespace kiln
