#include "passes/dce.h"

#include <gtest/gtest.h>

#include "ir/text_format.h"
#include "ir/verifier.h"
#include "runtime/differential_check.h"
#include "tests/testing/filecheck.h"
#include "tests/testing/pass_test.h"

namespace kiln {
namespace {

std::string RunDce(absl::string_view text, bool expect_change = true) {
  DcePass pass;
  return testing::RunPassOnText(pass, text, expect_change);
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
