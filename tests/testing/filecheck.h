// A small FileCheck (after LLVM's) for tests written in IR text: the printed result of a
// pass is checked against directives, so a test states what matters and nothing else.
//
//   CHECK: <pattern>       matches on this line (after the previous match) or a later one
//   CHECK-NEXT: <pattern>  matches on the line right after the previous match's line
//   CHECK-SAME: <pattern>  matches on the previous match's line, after the match
//   CHECK-NOT: <pattern>   does not occur between the previous match and the next one (or
//                          the end of the input)
//
// A pattern is literal text, except:
//   {{regex}}         a regular expression (std::regex, ECMAScript)
//   [[NAME:regex]]    matches regex and binds NAME to the matched text
//   [[NAME]]          the text NAME was bound to (earlier in this or a previous pattern)
// Runs of whitespace match runs of whitespace; leading and trailing whitespace is ignored.
// Directives may sit after a comment marker: "// CHECK: %y = neg(%x)" works.
//
//   EXPECT_TRUE(FileCheck(PrintModule(*m), R"(
//     CHECK: [[X:%[a-z0-9]+]] = parameter()
//     CHECK-NOT: exp(
//     CHECK: return [[X]]
//   )").ok());
//
// A failure names the directive, its pattern, the input line being looked at, and prints
// the whole input with line numbers.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kiln::testing {

absl::Status FileCheck(absl::string_view input, absl::string_view checks);

}  // namespace kiln::testing
