#include "passes/dce.h"

#include <gtest/gtest.h>

#include "ir/text_format.h"
#include "ir/verifier.h"
#include "runtime/differential_check.h"
#include "tests/testing/filecheck.h"

namespace kiln {
namespace {

// Parses `text`, runs dce, checks the module still verifies and means the same, and returns
// the printed result (or the failure as text, which no CHECK line will match).
std::string RunDce(absl::string_view text, bool expect_change = true) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(text);
  if (!m.ok()) return std::string(m.status().message());
  std::unique_ptr<Module> before = CloneModule(**m);
  absl::StatusOr<bool> changed = DcePass().Run(**m);
  EXPECT_TRUE(changed.ok()) << changed.status();
  EXPECT_EQ(changed.value_or(!expect_change), expect_change);
  EXPECT_TRUE(VerifyModule(**m).ok());
  absl::Status same = CheckMeaningPreserved(*before, **m);
  EXPECT_TRUE(same.ok()) << same;
  return PrintModule(**m);
}

TEST(Dce, RemovesWhatNoOutputNeedsAndKeepsParameters) {
  std::string out = RunDce(R"(module @m
func @main {
  %x = parameter() {index=0} : f32[4]
  %unused = parameter() {index=1} : f32[4]
  %a = exp(%x) : f32[4]
  %b = neg(%x) : f32[4]
  %c = mul(%b, %unused) : f32[4]
  return %a
})");
  EXPECT_TRUE(testing::FileCheck(out, R"(
    CHECK:      %x = parameter() {index=0}
    CHECK-NEXT: %unused = parameter() {index=1}
    CHECK-NEXT: %a = exp(%x)
    CHECK-NEXT: return %a
  )").ok()) << out;
}

TEST(Dce, KeepsEverythingAnOutputNeedsAndReportsNoChange) {
  std::string out = RunDce(R"(module @m
func @main {
  %x = parameter() {index=0} : f32[4]
  %a = exp(%x) : f32[4]
  %b = neg(%a) : f32[4]
  return %b, %a
})", /*expect_change=*/false);
  EXPECT_TRUE(testing::FileCheck(out, "CHECK: %a = exp\nCHECK-NEXT: %b = neg(%a)").ok()) << out;
}

TEST(Dce, WorksOnEveryFunction) {
  std::string out = RunDce(R"(module @m
func @f {
  %x = parameter() {index=0} : f32[2]
  %dead = abs(%x) : f32[2]
  return %x
}
func @g {
  %y = parameter() {index=0} : f32[2]
  %live = sqrt(%y) : f32[2]
  %dead2 = exp(%live) : f32[2]
  return %live
})");
  EXPECT_TRUE(testing::FileCheck(out, R"(
    CHECK: func @f
    CHECK-NOT: abs
    CHECK: func @g
    CHECK: %live = sqrt(%y)
    CHECK-NOT: exp
    CHECK: return %live
  )").ok()) << out;
}

}  // namespace
}  // namespace kiln
