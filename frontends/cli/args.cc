#include "frontends/cli/args.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kiln::cli {

std::string ParsedArgs::Get(absl::string_view flag, absl::string_view fallback) const {
  auto it = values_.find(std::string(flag));
  return it == values_.end() ? std::string(fallback) : it->second;
}

absl::StatusOr<int64_t> ParsedArgs::GetInt(absl::string_view flag, int64_t fallback) const {
  if (!Has(flag)) return fallback;
  int64_t v = 0;
  if (!absl::SimpleAtoi(Get(flag), &v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " expects an integer, got '", Get(flag), "'"));
  }
  return v;
}

absl::StatusOr<double> ParsedArgs::GetDouble(absl::string_view flag, double fallback) const {
  if (!Has(flag)) return fallback;
  double v = 0;
  if (!absl::SimpleAtod(Get(flag), &v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " expects a number, got '", Get(flag), "'"));
  }
  return v;
}

namespace {
const FlagSpec* FindFlag(const CommandSpec& spec, absl::string_view name) {
  for (const FlagSpec& f : spec.flags) {
    if (f.name == name) return &f;
  }
  return nullptr;
}
const FlagSpec* FindShortFlag(const CommandSpec& spec, char c) {
  for (const FlagSpec& f : spec.flags) {
    if (f.short_name == c) return &f;
  }
  return nullptr;
}
}  // namespace

absl::StatusOr<ParsedArgs> ParseArgs(const CommandSpec& spec, const std::vector<std::string>& args) {
  ParsedArgs out;
  const std::string see_help = absl::StrCat(" (see 'kiln ", spec.name, " --help')");
  bool only_positionals = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (only_positionals || a.size() < 2 || a[0] != '-' ) {
      out.positionals_.push_back(a);
      continue;
    }
    if (a == "--") {
      only_positionals = true;
      continue;
    }
    if (a == "--help" || a == "-h") {
      out.help_ = true;
      return out;
    }
    const FlagSpec* flag = nullptr;
    std::string value;
    bool has_inline_value = false;
    if (a[1] == '-') {
      std::string body = a.substr(2);
      size_t eq = body.find('=');
      if (eq != std::string::npos) {
        value = body.substr(eq + 1);
        body = body.substr(0, eq);
        has_inline_value = true;
      }
      flag = FindFlag(spec, body);
      if (!flag) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", body, see_help));
    } else {
      if (a.size() != 2) return absl::InvalidArgumentError(absl::StrCat("unknown flag ", a, see_help));
      flag = FindShortFlag(spec, a[1]);
      if (!flag) return absl::InvalidArgumentError(absl::StrCat("unknown flag ", a, see_help));
    }
    if (flag->value_name.empty()) {
      if (has_inline_value) {
        return absl::InvalidArgumentError(absl::StrCat("--", flag->name, " takes no value", see_help));
      }
      out.values_[flag->name] = "true";
      continue;
    }
    if (!has_inline_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", flag->name, " needs a value (", flag->value_name, ")", see_help));
      }
      value = args[++i];
    }
    out.values_[flag->name] = value;
  }
  int n = static_cast<int>(out.positionals_.size());
  if (n < spec.min_positionals) {
    return absl::InvalidArgumentError(absl::StrCat("missing argument: usage: kiln ", spec.name, " ", spec.usage));
  }
  if (n > spec.max_positionals) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", out.positionals_[spec.max_positionals],
                                                   "': usage: kiln ", spec.name, " ", spec.usage));
  }
  return out;
}

std::string HelpText(const CommandSpec& spec) {
  std::string out = absl::StrCat("usage: kiln ", spec.name, " ", spec.usage, "\n\n", spec.summary, "\n");
  if (!spec.details.empty()) absl::StrAppend(&out, "\n", spec.details, "\n");
  absl::StrAppend(&out, "\noptions:\n");
  for (const FlagSpec& f : spec.flags) {
    std::string left = f.short_name ? absl::StrCat("-", std::string(1, f.short_name), ", --", f.name)
                                    : absl::StrCat("    --", f.name);
    if (!f.value_name.empty()) absl::StrAppend(&left, " ", f.value_name);
    if (left.size() < 28) left.resize(28, ' ');
    absl::StrAppend(&out, "  ", left, " ", f.help);
    if (!f.default_value.empty()) absl::StrAppend(&out, " (default: ", f.default_value, ")");
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out, "  -h, --help                   this help\n");
  return out;
}

}  // namespace kiln::cli
