// A small command-line parser for kiln's subcommands: `--flag value`, `--flag=value`,
// boolean `--flag`, short aliases (`-o`), positionals, and generated --help text.
// Errors say which flag and why, and point at --help.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln::cli {

struct FlagSpec {
  std::string name;        // without dashes: "format"
  std::string value_name;  // "FORMAT"; empty for a boolean flag
  std::string help;
  std::string default_value;  // shown in --help; empty: none
  char short_name = 0;        // 'o' for -o
};

struct CommandSpec {
  std::string name;       // "dump"
  std::string usage;      // "MODEL_OR_FILE [options]"
  std::string summary;    // one line, for `kiln --help`
  std::string details;    // paragraphs after the usage line
  int min_positionals = 0;
  int max_positionals = 0;
  std::vector<FlagSpec> flags;
};

class ParsedArgs {
 public:
  const std::vector<std::string>& positionals() const { return positionals_; }
  bool Has(absl::string_view flag) const { return values_.count(std::string(flag)) > 0; }
  // The flag's value, or `fallback` when not given.
  std::string Get(absl::string_view flag, absl::string_view fallback = "") const;
  // Parses the flag's value as an integer or number; the error names the flag.
  absl::StatusOr<int64_t> GetInt(absl::string_view flag, int64_t fallback) const;
  absl::StatusOr<double> GetDouble(absl::string_view flag, double fallback) const;
  bool help() const { return help_; }

 private:
  friend absl::StatusOr<ParsedArgs> ParseArgs(const CommandSpec&, const std::vector<std::string>&);
  std::vector<std::string> positionals_;
  std::map<std::string, std::string> values_;
  bool help_ = false;
};

absl::StatusOr<ParsedArgs> ParseArgs(const CommandSpec& spec, const std::vector<std::string>& args);
std::string HelpText(const CommandSpec& spec);

}  // namespace kiln::cli
