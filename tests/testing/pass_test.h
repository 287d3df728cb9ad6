// The shape of every pass test (DESIGN.md principle 2): parse IR text, run one pass, check
// that it reported a change as expected, that the module still verifies and (unless told
// otherwise) means exactly the same on random inputs, and return the printed result for
// FileCheck patterns. A parse failure comes back as its message, which no CHECK matches.
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "absl/strings/string_view.h"
#include "ir/text_format.h"
#include "ir/verifier.h"
#include "passes/pass.h"
#include "runtime/differential_check.h"

namespace kiln::testing {

inline std::string RunPassOnText(Pass& pass, absl::string_view text, bool expect_change = true,
                                 bool check_meaning = true) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(text);
  if (!m.ok()) return std::string(m.status().message());
  std::unique_ptr<Module> before = CloneModule(**m);
  absl::StatusOr<bool> changed = pass.Run(**m);
  EXPECT_TRUE(changed.ok()) << pass.name() << ": " << changed.status();
  EXPECT_EQ(changed.value_or(!expect_change), expect_change) << pass.name();
  absl::Status verified = VerifyModule(**m);
  EXPECT_TRUE(verified.ok()) << pass.name() << ": " << verified;
  if (check_meaning) {
    absl::Status same = CheckMeaningPreserved(*before, **m);
    EXPECT_TRUE(same.ok()) << pass.name() << ": " << same;
  }
  return PrintModule(**m);
}

}  // namespace kiln::testing
