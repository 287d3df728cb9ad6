// kiln: build, inspect, compile, check, train and evaluate transformer models.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "frontends/cli/commands.h"

namespace {

std::vector<kiln::cli::Command> AllCommands() {
  return {kiln::cli::ModelsCommand(), kiln::cli::DumpCommand(), kiln::cli::VerifyCommand(),
          kiln::cli::TrainCommand(), kiln::cli::EvalCommand(),
          kiln::cli::CompileCommand(), kiln::cli::CheckCommand(), kiln::cli::ExportInputsCommand()};
}

void PrintTopLevelHelp(const std::vector<kiln::cli::Command>& commands) {
  std::printf("usage: kiln <command> [options]\n\ncommands:\n");
  for (const auto& c : commands) std::printf("  %-13s %s\n", c.spec.name.c_str(), c.spec.summary.c_str());
  std::printf("\n'kiln <command> --help' describes a command.\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<kiln::cli::Command> commands = AllCommands();
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      std::string(argv[1]) == "help") {
    PrintTopLevelHelp(commands);
    return argc < 2 ? 2 : 0;
  }
  std::string name = argv[1];
  for (const auto& c : commands) {
    if (c.spec.name != name) continue;
    std::vector<std::string> args(argv + 2, argv + argc);
    absl::StatusOr<kiln::cli::ParsedArgs> parsed = kiln::cli::ParseArgs(c.spec, args);
    if (!parsed.ok()) {
      std::fprintf(stderr, "kiln %s: %s\n", name.c_str(), std::string(parsed.status().message()).c_str());
      return 2;
    }
    if (parsed->help()) {
      std::fputs(kiln::cli::HelpText(c.spec).c_str(), stdout);
      return 0;
    }
    absl::Status st = c.run(*parsed);
    if (!st.ok()) {
      std::fprintf(stderr, "kiln %s: %s\n", name.c_str(), std::string(st.message()).c_str());
      return 1;
    }
    return 0;
  }
  std::fprintf(stderr, "kiln: unknown command '%s' (see 'kiln --help')\n", name.c_str());
  return 2;
}
