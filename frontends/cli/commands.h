// The `kiln` subcommands. Each is a spec (usage, flags, help) and a function that returns
// a Status; main() turns a failed Status into "kiln <command>: <message>" and exit code 1.
#pragma once

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "frontends/cli/args.h"

namespace kiln::cli {

struct Command {
  CommandSpec spec;
  std::function<absl::Status(const ParsedArgs&)> run;
};

// Each command's file defines one of these.
Command ModelsCommand();
Command DumpCommand();
Command VerifyCommand();
Command TrainCommand();
Command EvalCommand();
Command CompileCommand();
Command CheckCommand();
Command ExportInputsCommand();
Command GenerateCommand();
Command VersionCommand();

}  // namespace kiln::cli
