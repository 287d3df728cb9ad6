// Runs a command line for CLI tests and captures its exit status and output.
#pragma once

#include <string>

namespace kiln::testing {

struct CommandResult {
  int exit_code = -1;    // -1 when killed by a signal
  int signal = 0;        // the signal that ended it, or 0
  std::string output;    // stdout and stderr, interleaved
};

// Runs `command` through /bin/sh.
CommandResult RunCommand(const std::string& command);

// The path of the kiln binary under test, quoted for the shell. Inline: KILN_BINARY is
// defined per test target (tests/CMakeLists.txt).
#ifdef KILN_BINARY
inline std::string Kiln() { return std::string("'") + KILN_BINARY + "'"; }
#endif

}  // namespace kiln::testing
