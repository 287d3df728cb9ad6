// kiln: build, inspect, compile, check, train and evaluate transformer models.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "frontends/cli/commands.h"

namespace {

std::vector<kiln::cli::Command> AllCommands() {
  return {kiln::cli::ModelsCommand(), kiln::cli::DumpCommand(), kiln::cli::VerifyCommand(),
          kiln::cli::TrainCommand(), kiln::cli::EvalCommand(),
          kiln::cli::CompileCommand(), kiln::cli::CheckCommand(), kiln::cli::ExportInputsCommand(),
          kiln::cli::GenerateCommand(), kiln::cli::VersionCommand()};
}

void PrintTopLevelHelp(const std::vector<kiln::cli::Command>& commands) {
  std::printf("usage: kiln <command> [options]\n\ncommands:\n");
  for (const auto& c : commands) std::printf("  %-13s %s\n", c.spec.name.c_str(), c.spec.summary.c_str());
  std::printf("\n'kiln <command> --help' describes a command.\n");
}

// Output that never reached stdout (`kiln models > /dev/full`, a closed pipe) is a failure:
// printf's errors only show when the buffer is flushed, so flush and look.
bool FlushStdout(const std::string& command) {
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return true;
  const int err = errno;
  std::fprintf(stderr, "kiln %s: cannot write to standard output: %s\n", command.c_str(),
               err != 0 ? std::strerror(err) : "write error");
  return false;
}

// Library code returns Status; an allocation that fails anyway (a size no estimate caught)
// ends here as a message instead of std::terminate.
absl::Status RunCatchingAllocationFailures(const kiln::cli::Command& command, const kiln::cli::ParsedArgs& args) {
  try {
    return command.run(args);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        "out of memory: an allocation failed (the sizes asked for do not fit this machine; try a smaller "
        "--batch, --seq or model)");
  } catch (const std::length_error& e) {
    return absl::ResourceExhaustedError(absl::StrCat("a size is too large to allocate (", e.what(), ")"));
  }
}

// Messages quote what they reject; a hostile input (an op with 100k operands) must not make
// one a megabyte long.
std::string Shortened(absl::string_view message) {
  constexpr size_t kMaxShown = 2000;
  if (message.size() <= kMaxShown) return std::string(message);
  return absl::StrCat(message.substr(0, kMaxShown), "... (", message.size() - kMaxShown, " more characters)");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<kiln::cli::Command> commands = AllCommands();
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      std::string(argv[1]) == "help") {
    PrintTopLevelHelp(commands);
    if (!FlushStdout("--help")) return 1;
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
      return FlushStdout(name) ? 0 : 1;
    }
    absl::Status st = RunCatchingAllocationFailures(c, *parsed);
    if (!st.ok()) {
      FlushStdout(name);  // what was printed before the error still goes out first
      std::fprintf(stderr, "kiln %s: %s\n", name.c_str(), Shortened(st.message()).c_str());
      return 1;
    }
    return FlushStdout(name) ? 0 : 1;
  }
  std::fprintf(stderr, "kiln: unknown command '%s' (see 'kiln --help')\n", name.c_str());
  return 2;
}
