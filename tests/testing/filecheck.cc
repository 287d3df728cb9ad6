#include "tests/testing/filecheck.h"

#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "ir/status_macros.h"

namespace kiln::testing {
namespace {

enum class Kind { kCheck, kNext, kSame, kNot };

struct Directive {
  Kind kind;
  std::string pattern;
  int check_line;  // 1-based, in the checks text
};

absl::string_view KindName(Kind kind) {
  switch (kind) {
    case Kind::kCheck: return "CHECK";
    case Kind::kNext: return "CHECK-NEXT";
    case Kind::kSame: return "CHECK-SAME";
    case Kind::kNot: return "CHECK-NOT";
  }
  return "?";
}

std::string Where(const Directive& d) {
  return absl::StrCat("checks line ", d.check_line, ": ", KindName(d.kind), ": \"", d.pattern, "\"");
}

absl::StatusOr<std::vector<Directive>> ParseDirectives(absl::string_view checks) {
  std::vector<Directive> out;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(checks, '\n')) {
    ++line_number;
    const size_t at = line.find("CHECK");
    if (at == absl::string_view::npos) continue;
    absl::string_view rest = line.substr(at + 5);
    std::optional<Kind> kind;
    for (Kind k : {Kind::kCheck, Kind::kNext, Kind::kSame, Kind::kNot}) {
      absl::string_view suffix = KindName(k).substr(5);  // "", "-NEXT", ...
      if (absl::StartsWith(rest, absl::StrCat(suffix, ":"))) {
        kind = k;
        rest.remove_prefix(suffix.size() + 1);
        break;
      }
    }
    if (!kind) {
      return absl::InvalidArgumentError(
          absl::StrCat("checks line ", line_number, ": unknown directive in \"", line, "\""));
    }
    Directive d{*kind, std::string(absl::StripAsciiWhitespace(rest)), line_number};
    if (d.pattern.empty()) return absl::InvalidArgumentError(absl::StrCat(Where(d), " has an empty pattern"));
    if (out.empty() && (d.kind == Kind::kNext || d.kind == Kind::kSame)) {
      return absl::InvalidArgumentError(absl::StrCat(Where(d), " has no earlier match to follow"));
    }
    out.push_back(std::move(d));
  }
  if (out.empty()) return absl::InvalidArgumentError("no CHECK directives: a check that checks nothing");
  return out;
}

std::string EscapeRegex(absl::string_view text) {
  std::string out;
  for (char c : text) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

// Capture groups a user regex opens, so [[NAME:...]] after it gets the right group number.
int CountGroups(absl::string_view re) {
  int n = 0;
  for (size_t i = 0; i < re.size(); ++i) {
    if (re[i] == '\\') {
      ++i;
    } else if (re[i] == '(' && (i + 1 >= re.size() || re[i + 1] != '?')) {
      ++n;
    }
  }
  return n;
}

bool IsVariableName(absl::string_view name) {
  if (name.empty() || absl::ascii_isdigit(name[0])) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '_') return false;
  }
  return true;
}

// Where "}}" or "]]" closes a marker opened before `from`. In a run of three or more closing
// characters the last two close the marker, so "[[V:[a-z]]]" and "{{x{2}}}" read as meant.
size_t ClosingMarker(const std::string& p, size_t from, char close) {
  const std::string pair(2, close);
  size_t end = p.find(pair, from);
  if (end == std::string::npos) return end;
  while (end + 2 < p.size() && p[end + 2] == close) ++end;
  return end;
}

using Variables = std::map<std::string, std::string>;

struct CompiledPattern {
  std::regex regex;
  std::vector<std::pair<std::string, int>> definitions;  // variable -> capture group
};

absl::StatusOr<CompiledPattern> Compile(const Directive& d, const Variables& vars) {
  const std::string& p = d.pattern;
  std::string re;
  int groups = 0;
  CompiledPattern out;
  std::map<std::string, int> local;  // variables defined earlier in this pattern
  for (size_t i = 0; i < p.size();) {
    if (p.compare(i, 2, "{{") == 0) {
      const size_t end = ClosingMarker(p, i + 2, '}');
      if (end == std::string::npos) return absl::InvalidArgumentError(absl::StrCat(Where(d), ": unclosed {{"));
      const std::string inner = p.substr(i + 2, end - i - 2);
      absl::StrAppend(&re, "(?:", inner, ")");
      groups += CountGroups(inner);
      i = end + 2;
    } else if (p.compare(i, 2, "[[") == 0) {
      const size_t end = ClosingMarker(p, i + 2, ']');
      if (end == std::string::npos) return absl::InvalidArgumentError(absl::StrCat(Where(d), ": unclosed [["));
      const std::string inner = p.substr(i + 2, end - i - 2);
      const size_t colon = inner.find(':');
      const std::string name = inner.substr(0, colon);
      if (!IsVariableName(name)) {
        return absl::InvalidArgumentError(absl::StrCat(Where(d), ": bad variable name '", name, "'"));
      }
      if (colon != std::string::npos) {
        const std::string sub = inner.substr(colon + 1);
        absl::StrAppend(&re, "(", sub, ")");
        local[name] = ++groups;
        out.definitions.push_back({name, groups});
        groups += CountGroups(sub);
      } else if (auto it = local.find(name); it != local.end()) {
        absl::StrAppend(&re, "(?:\\", it->second, ")");
      } else if (auto it = vars.find(name); it != vars.end()) {
        absl::StrAppend(&re, EscapeRegex(it->second));
      } else {
        return absl::InvalidArgumentError(absl::StrCat(Where(d), ": variable [[", name, "]] is not defined"));
      }
      i = end + 2;
    } else if (absl::ascii_isspace(p[i])) {
      while (i < p.size() && absl::ascii_isspace(p[i])) ++i;
      re += "\\s+";
    } else {
      re += EscapeRegex(absl::string_view(&p[i], 1));
      ++i;
    }
  }
  try {
    out.regex = std::regex(re, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(Where(d), ": bad regular expression: ", e.what()));
  }
  return out;
}

std::string NumberedInput(const std::vector<std::string>& lines) {
  std::string out = "input:\n";
  for (size_t i = 0; i < lines.size(); ++i) absl::StrAppendFormat(&out, "%4d | %s\n", i + 1, lines[i]);
  return out;
}

// A position in the input: a line and a column in it.
struct Position {
  size_t line = 0;
  size_t col = 0;
};

}  // namespace

absl::Status FileCheck(absl::string_view input, absl::string_view checks) {
  ASSIGN_OR_RETURN(std::vector<Directive> directives, ParseDirectives(checks));
  const std::vector<std::string> lines = absl::StrSplit(input, '\n');
  auto fail = [&](const std::string& what) {
    return absl::NotFoundError(absl::StrCat(what, "\n", NumberedInput(lines)));
  };
  auto quoted_line = [&](size_t line) {
    return line < lines.size() ? absl::StrCat("input line ", line + 1, ": \"", lines[line], "\"")
                               : std::string("the end of the input");
  };

  Variables vars;
  Position pos;  // just after the previous match
  std::vector<const Directive*> pending_nots;

  // Fails if a pending CHECK-NOT pattern occurs in [pos, until).
  auto check_nots = [&](Position until) -> absl::Status {
    for (const Directive* d : pending_nots) {
      ASSIGN_OR_RETURN(CompiledPattern c, Compile(*d, vars));
      for (size_t l = pos.line; l <= until.line && l < lines.size(); ++l) {
        const size_t begin = l == pos.line ? pos.col : 0;
        const size_t end = l == until.line ? until.col : lines[l].size();
        if (begin > end) continue;
        const std::string segment = lines[l].substr(begin, end - begin);
        if (std::regex_search(segment, c.regex)) {
          return fail(absl::StrCat(Where(*d), ": forbidden pattern found at ", quoted_line(l)));
        }
      }
    }
    pending_nots.clear();
    return absl::OkStatus();
  };

  for (const Directive& d : directives) {
    if (d.kind == Kind::kNot) {
      pending_nots.push_back(&d);
      continue;
    }
    ASSIGN_OR_RETURN(CompiledPattern c, Compile(d, vars));
    size_t first = pos.line, last = lines.size() - 1;
    if (d.kind == Kind::kNext) first = last = pos.line + 1;
    if (d.kind == Kind::kSame) last = pos.line;
    std::optional<Position> match_start;
    std::smatch m;
    size_t begin = 0;
    for (size_t l = first; l <= last && l < lines.size(); ++l) {
      begin = (l == pos.line && d.kind != Kind::kNext) ? pos.col : 0;
      if (std::regex_search(lines[l].cbegin() + begin, lines[l].cend(), m, c.regex)) {
        match_start = Position{l, begin + static_cast<size_t>(m.position(0))};
        break;
      }
    }
    if (!match_start) {
      return fail(absl::StrCat(Where(d), ": expected pattern not found, looking at ",
                               quoted_line(d.kind == Kind::kNext ? pos.line + 1 : pos.line)));
    }
    RETURN_IF_ERROR(check_nots(*match_start));
    for (const auto& [name, group] : c.definitions) vars[name] = m[group].str();
    pos = Position{match_start->line, match_start->col + static_cast<size_t>(m.length(0))};
  }
  return check_nots(Position{lines.size() - 1, lines.back().size()});
}

}  // namespace kiln::testing
