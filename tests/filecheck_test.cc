// The matcher that pass tests rely on: it must pass what matches and, above all, fail what
// does not, with a message that shows where it was looking.
#include "tests/testing/filecheck.h"

#include <gtest/gtest.h>

namespace kiln::testing {
namespace {

constexpr absl::string_view kInput = R"(func @main {
  %x = parameter() {index=0} : f32[4]
  %a = exp(%x) : f32[4]
  %b = neg(%a) : f32[4]
  return %b
})";

bool Passes(absl::string_view checks) { return FileCheck(kInput, checks).ok(); }

std::string FailureOf(absl::string_view checks) {
  absl::Status s = FileCheck(kInput, checks);
  EXPECT_FALSE(s.ok()) << "expected a failure for:\n" << checks;
  return std::string(s.message());
}

TEST(FileCheck, ChecksMatchInOrder) {
  EXPECT_TRUE(Passes("CHECK: parameter()\nCHECK: exp(%x)\nCHECK: return %b"));
  EXPECT_FALSE(Passes("CHECK: exp(%x)\nCHECK: parameter()"));  // out of order
  EXPECT_FALSE(Passes("CHECK: sqrt("));
}

TEST(FileCheck, CheckNextNeedsTheVeryNextLine) {
  EXPECT_TRUE(Passes("CHECK: %a = exp\nCHECK-NEXT: %b = neg"));
  std::string message = FailureOf("CHECK: parameter()\nCHECK-NEXT: %b = neg");
  EXPECT_NE(message.find("CHECK-NEXT: \"%b = neg\""), std::string::npos) << message;
  EXPECT_NE(message.find("looking at input line 3: \"  %a = exp(%x) : f32[4]\""), std::string::npos) << message;
  EXPECT_NE(message.find("   5 |   return %b"), std::string::npos) << message;  // the input, numbered
}

TEST(FileCheck, CheckSameStaysOnTheLineAfterTheMatch) {
  EXPECT_TRUE(Passes("CHECK: %a = exp\nCHECK-SAME: : f32[4]"));
  EXPECT_FALSE(Passes("CHECK: %a = exp\nCHECK-SAME: neg"));
  EXPECT_FALSE(Passes("CHECK: exp(%x)\nCHECK-SAME: %a"));  // %a is before the match
}

TEST(FileCheck, CheckNotCoversTheGapBetweenMatches) {
  EXPECT_TRUE(Passes("CHECK: parameter\nCHECK-NOT: neg\nCHECK: exp"));
  EXPECT_TRUE(Passes("CHECK: neg\nCHECK-NOT: exp"));
  std::string message = FailureOf("CHECK: parameter\nCHECK-NOT: exp\nCHECK: neg");
  EXPECT_NE(message.find("forbidden pattern found at input line 3"), std::string::npos) << message;
  EXPECT_FALSE(Passes("CHECK: exp\nCHECK-NOT: return"));  // runs to the end of the input
  EXPECT_FALSE(Passes("CHECK-NOT: parameter\nCHECK: exp"));  // and from the start
}

TEST(FileCheck, VariablesCaptureAndMustMatchAgain) {
  EXPECT_TRUE(Passes("CHECK: [[V:%[a-z]+]] = exp\nCHECK: neg([[V]])"));
  EXPECT_FALSE(Passes("CHECK: [[V:%[a-z]+]] = parameter\nCHECK: neg([[V]])"));  // %x, not %a
  EXPECT_TRUE(Passes("CHECK: %b = neg([[V:%[a-z]+]]) : f32[4]\nCHECK-NOT: [[V]]"));
  // Groups inside {{...}} and [[...:...]] do not shift later variables.
  EXPECT_TRUE(Passes("CHECK: %a = {{(exp|neg)}}([[Y:(%)[a-z]]]) : [[T:f32.[0-9].]]\nCHECK: neg(%a) : [[T]]"));
  EXPECT_FALSE(Passes("CHECK: %a = {{(exp|neg)}}([[Y:(%)[a-z]]]) : [[T:f32.[0-9].]]\nCHECK: neg([[Y]])"));
}

TEST(FileCheck, WhitespaceRunsMatchWhitespaceRuns) {
  EXPECT_TRUE(Passes("CHECK:   %a   =   exp(%x)   "));
  EXPECT_FALSE(Passes("CHECK: %a=exp"));
}

TEST(FileCheck, RejectsChecksThatCheckNothingOrAreMalformed) {
  EXPECT_NE(FailureOf("no directives here").find("no CHECK directives"), std::string::npos);
  EXPECT_NE(FailureOf("CHECK: [[UNDEFINED]]").find("not defined"), std::string::npos);
  EXPECT_NE(FailureOf("CHECK-NEXT: %a").find("no earlier match"), std::string::npos);
  EXPECT_NE(FailureOf("CHECK-NXT: %a").find("unknown directive"), std::string::npos);
  EXPECT_NE(FailureOf("CHECK: {{(}}").find("bad regular expression"), std::string::npos);
}

TEST(FileCheck, DirectivesMayFollowCommentMarkers) {
  EXPECT_TRUE(Passes("// CHECK: exp(%x)\n// CHECK-NEXT: neg(%a)"));
  EXPECT_FALSE(Passes("// CHECK: exp(%x)\n// CHECK-NEXT: exp(%a)"));
}

}  // namespace
}  // namespace kiln::testing
