#include "passes/cse.h"

#include <gtest/gtest.h>

#include "ir/text_format.h"
#include "ir/verifier.h"
#include "runtime/differential_check.h"
#include "tests/testing/filecheck.h"
#include "tests/testing/pass_test.h"

namespace kiln {
namespace {

std::string RunCse(absl::string_view text, bool expect_change = true) {
  CsePass pass;
  return testing::RunPassOnText(pass, text, expect_change);
}

TEST(Cse, MergesDuplicatesIntoTheFirstAndCollapsesChains) {
  std::string out = RunCse(R"(module @m
func @main {
  %x = parameter() {index=0} : f32[4]
  %a = exp(%x) : f32[4]
  %b = exp(%x) : f32[4]
  %na = neg(%a) : f32[4] @layers.0
  %nb = neg(%b) : f32[4] @layers.1
  %s = add(%na, %nb) : f32[4]
  return %s, %nb
})");
  EXPECT_TRUE(testing::FileCheck(out, R"(
    CHECK:      %a = exp(%x)
    CHECK-NEXT: %na = neg(%a) : f32[4] @layers.0
    CHECK-NEXT: %s = add(%na, %na)
    CHECK-NEXT: return %s, %na
  )").ok()) << out;
}

TEST(Cse, MergesCommutedOperandsOnlyForCommutativeOps) {
  std::string out = RunCse(R"(module @m
func @main {
  %x = parameter() {index=0} : f32[4]
  %y = parameter() {index=1} : f32[4]
  %a1 = add(%x, %y) : f32[4]
  %a2 = add(%y, %x) : f32[4]
  %s1 = sub(%x, %y) : f32[4]
  %s2 = sub(%y, %x) : f32[4]
  %c1 = compare(%x, %y) {direction=lt} : pred[4]
  %c2 = compare(%y, %x) {direction=lt} : pred[4]
  %e1 = compare(%x, %y) {direction=eq} : pred[4]
  %e2 = compare(%y, %x) {direction=eq} : pred[4]
  return %a1, %a2, %s1, %s2, %c1, %c2, %e1, %e2
})");
  EXPECT_TRUE(testing::FileCheck(out, R"(
    CHECK-NOT: %a2 =
    CHECK: %s1 = sub(%x, %y)
    CHECK-NEXT: %s2 = sub(%y, %x)
    CHECK-NEXT: %c1 = compare
    CHECK-NEXT: %c2 = compare
    CHECK-NOT: %e2 =
    CHECK: return %a1, %a1, %s1, %s2, %c1, %c2, %e1, %e1
  )").ok()) << out;
}

TEST(Cse, NeverMergesParametersOrValuesThatDiffer) {
  std::string out = RunCse(R"(module @m
func @main {
  %x = parameter() {index=0} : f32[2,3]
  %y = parameter() {index=1} : f32[2,3]
  %r0 = reduce_sum(%x) {dims=[0]} : f32[3]
  %r1 = reduce_sum(%x) {dims=[1]} : f32[2]
  %h = convert(%x) : f16[2,3]
  %b = convert(%x) : bf16[2,3]
  %pz = constant() {value=0.0} : f32[]
  %nz = constant() {value=-0.0} : f32[]
  return %x, %y, %r0, %r1, %h, %b, %pz, %nz
})", /*expect_change=*/false);
  EXPECT_TRUE(testing::FileCheck(out, R"(
    CHECK: %x = parameter()
    CHECK-NEXT: %y = parameter()
    CHECK-NEXT: %r0 =
    CHECK-NEXT: %r1 =
    CHECK-NEXT: %h =
    CHECK-NEXT: %b =
    CHECK-NEXT: %pz =
    CHECK-NEXT: %nz =
  )").ok()) << out;
}

TEST(Cse, IsDeterministic) {
  constexpr absl::string_view kText = R"(module @m
func @main {
  %x = parameter() {index=0} : f32[4]
  %c1 = constant() {value=2.0} : f32[4]
  %c2 = constant() {value=2.0} : f32[4]
  %m1 = mul(%x, %c1) : f32[4]
  %m2 = mul(%c2, %x) : f32[4]
  %t = tanh(%m2) : f32[4]
  return %m1, %t
})";
  const std::string first = RunCse(kText);
  EXPECT_EQ(first, RunCse(kText));
  EXPECT_TRUE(testing::FileCheck(first, R"(
    CHECK: %c1 = constant()
    CHECK-NEXT: %m1 = mul(%x, %c1)
    CHECK-NEXT: %t = tanh(%m1)
  )").ok()) << first;
}

}  // namespace
}  // namespace kiln
