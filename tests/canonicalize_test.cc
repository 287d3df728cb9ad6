#include "passes/canonicalize.h"

#include <gtest/gtest.h>

#include "ir/text_format.h"
#include "ir/verifier.h"
#include "runtime/differential_check.h"
#include "tests/testing/filecheck.h"
#include "tests/testing/pass_test.h"

namespace kiln {
namespace {

// A one-function module body through canonicalize (tests/testing/pass_test.h).
std::string Canon(absl::string_view body, bool expect_change = true, bool check_meaning = true) {
  CanonicalizePass pass;
  return testing::RunPassOnText(pass, absl::StrCat("module @m\nfunc @main {\n", body, "}\n"), expect_change,
                                check_meaning);
}

#define EXPECT_CHECKS(out, checks) EXPECT_TRUE(testing::FileCheck(out, checks).ok()) << testing::FileCheck(out, checks)

TEST(Canonicalize, HeaderExample) {
  std::string out = Canon(R"(
  %x = parameter() {index=0} : f32[2,3]
  %one = constant() {value=1.0} : f32[]
  %ones = broadcast(%one) {dims=[]} : f32[2,3]
  %y = mul(%x, %ones) : f32[2,3]
  %t = transpose(%y) {perm=[1,0]} : f32[3,2]
  %u = transpose(%t) {perm=[1,0]} : f32[2,3]
  %two = constant() {value=2.0} : f32[]
  %four = add(%two, %two) : f32[]
  return %u, %four
)");
  EXPECT_CHECKS(out, R"(
    CHECK:      %x = parameter() {index=0} : f32[2,3]
    CHECK-NEXT: %one = constant() {value=1.0} : f32[]
    CHECK-NEXT: %ones = constant() {value=1.0} : f32[2,3]
    CHECK-NEXT: %t = transpose(%x) {perm=[1,0]} : f32[3,2]
    CHECK-NEXT: %two = constant() {value=2.0} : f32[]
    CHECK-NEXT: %four = constant() {value=4.0} : f32[]
    CHECK-NEXT: return %x, %four
  )");
}

TEST(Canonicalize, MultiplyingByExactlyOneIsRemoved) {
  std::string out = Canon(R"(
  %x = parameter() {index=0} : f32[2,3]
  %p = parameter() {index=1} : f32[]
  %one = constant() {value=1.0} : f32[]
  %ones = broadcast(%one) {dims=[]} : f32[2,3]
  %dense_ones = constant() {values=[1.0,1.0,1.0]} : f32[3]
  %dense_b = broadcast(%dense_ones) {dims=[1]} : f32[2,3]
  %almost = constant() {value=1.0000001} : f32[2,3]
  %pb = broadcast(%p) {dims=[]} : f32[2,3]
  %a = mul(%x, %ones) : f32[2,3]
  %b = mul(%dense_b, %a) : f32[2,3]
  %c = div(%b, %ones) : f32[2,3]
  %d = div(%ones, %c) : f32[2,3]
  %e = mul(%d, %almost) : f32[2,3]
  %f = mul(%e, %pb) : f32[2,3]
  return %c, %f
)");
  EXPECT_CHECKS(out, R"(
    CHECK-NOT: %a =
    CHECK-NOT: %b =
    CHECK-NOT: %c =
    CHECK: %d = div(%ones, %x)
    CHECK-NEXT: %e = mul(%d, %almost)
    CHECK-NEXT: %f = mul(%e, %pb)
    CHECK-NEXT: return %x, %f
  )");
}

// Only the zero that is an identity goes: -0.0 for add, +0.0 for sub (0 for integers).
TEST(Canonicalize, AddingZeroKeepsTheSignOfZero) {
  std::string out = Canon(R"(
  %x = parameter() {index=0} : f32[4]
  %i = parameter() {index=1} : i32[4]
  %pz = constant() {value=0.0} : f32[4]
  %nz = constant() {value=-0.0} : f32[4]
  %iz = constant() {value=0} : i32[4]
  %a = add(%x, %nz) : f32[4]
  %b = add(%nz, %a) : f32[4]
  %c = sub(%b, %pz) : f32[4]
  %keep_add = add(%c, %pz) : f32[4]
  %keep_sub = sub(%keep_add, %nz) : f32[4]
  %j = add(%i, %iz) : i32[4]
  %k = sub(%j, %iz) : i32[4]
  return %keep_sub, %k
)");
  EXPECT_CHECKS(out, R"(
    CHECK: %keep_add = add(%x, %pz)
    CHECK-NEXT: %keep_sub = sub(%keep_add, %nz)
    CHECK-NEXT: return %keep_sub, %i
  )");
}

TEST(Canonicalize, ConvertChainsGoOnlyWhenTheMiddleTypeLosesNothing) {
  std::string out = Canon(R"(
  %x = parameter() {index=0} : f32[4]
  %h = parameter() {index=1} : bf16[4]
  %s = parameter() {index=2} : f16[4]
  %same = convert(%x) : f32[4]
  %narrow = convert(%same) : bf16[4]
  %rounded = convert(%narrow) : f32[4]
  %wide = convert(%h) : f32[4]
  %back = convert(%wide) : bf16[4]
  %w2 = convert(%s) : f32[4]
  %cross = convert(%w2) : bf16[4]
  return %rounded, %back, %cross
)");
  EXPECT_CHECKS(out, R"(
    CHECK:      %narrow = convert(%x) : bf16[4]
    CHECK-NEXT: %rounded = convert(%narrow) : f32[4]
    CHECK:      %cross = convert(%s) : bf16[4]
    CHECK-NEXT: return %rounded, %h, %cross
  )");
}

TEST(Canonicalize, ReshapeAndTransposeChainsCompose) {
  std::string out = Canon(R"(
  %x = parameter() {index=0} : f32[2,3,4]
  %r1 = reshape(%x) : f32[6,4]
  %r2 = reshape(%r1) : f32[24]
  %r3 = reshape(%r2) : f32[2,3,4]
  %t1 = transpose(%r3) {perm=[1,2,0]} : f32[3,4,2]
  %t2 = transpose(%t1) {perm=[0,2,1]} : f32[3,2,4]
  %id = transpose(%t2) {perm=[0,1,2]} : f32[3,2,4]
  return %r2, %id
)");
  EXPECT_CHECKS(out, R"(
    CHECK:      %r2 = reshape(%x) : f32[24]
    CHECK:      %t2 = transpose(%x) {perm=[1,0,2]} : f32[3,2,4]
    CHECK-NEXT: return %r2, %t2
  )");
}

TEST(Canonicalize, BroadcastChainsBecomeOneBroadcast) {
  std::string out = Canon(R"(
  %s = parameter() {index=0} : f32[]
  %v = parameter() {index=1} : f32[3]
  %x = parameter() {index=2} : f32[2,3]
  %b1 = broadcast(%s) {dims=[]} : f32[3]
  %b2 = broadcast(%b1) {dims=[1]} : f32[2,3]
  %c1 = broadcast(%v) {dims=[0]} : f32[3,1]
  %c2 = broadcast(%c1) {dims=[1,2]} : f32[2,3,5]
  %same = broadcast(%x) {dims=[0,1]} : f32[2,3]
  return %b2, %c2, %same
)");
  EXPECT_CHECKS(out, R"(
    CHECK:      %b2 = broadcast(%s) {dims=[]} : f32[2,3]
    CHECK:      %c2 = broadcast(%v) {dims=[1]} : f32[2,3,5]
    CHECK-NEXT: return %b2, %c2, %x
  )");
}

TEST(Canonicalize, FoldsSmallConstantsWithTheReferenceKernels) {
  std::string out = Canon(R"(
  %a = constant() {values=[1.0,2.0,3.0]} : f32[3]
  %b = constant() {value=0.5} : f32[3]
  %s = mul(%a, %b) : f32[3]
  %e = exp(%s) : f32[3]
  %eb = convert(%e) : bf16[3]
  %n = reduce_sum(%s) {dims=[0]} : f32[]
  %i = iota() {dim=0} : i32[3]
  %big1 = constant() {value=1.0} : f32[]
  %big = broadcast(%big1) {dims=[]} : f32[2048]
  %bigneg = neg(%big) : f32[2048]
  return %eb, %n, %i, %bigneg
)");
  EXPECT_CHECKS(out, R"(
    CHECK:      %s = constant() {values=[0.5,1.0,1.5]} : f32[3]
    CHECK-NEXT: %e = constant()
    CHECK-NEXT: %eb = constant() {values=[1.6484375,2.71875,4.46875]} : bf16[3]
    CHECK-NEXT: %n = constant() {value=3.0} : f32[]
    CHECK-NEXT: %i = iota()
    CHECK:      %bigneg = neg(%big) : f32[2048]
  )");
}

TEST(Canonicalize, LeavesFoldsThatWouldFailToTheProgram) {
  std::string out = Canon(R"(
  %a = constant() {value=7} : i32[2]
  %z = constant() {value=0} : i32[2]
  %q = div(%a, %z) : i32[2]
  return %q
)", /*expect_change=*/false, /*check_meaning=*/false);
  EXPECT_CHECKS(out, "CHECK: %q = div(%a, %z)");
}

TEST(Canonicalize, FullSlicesAndSingleConcatenationsAreTheirOperand) {
  std::string out = Canon(R"(
  %x = parameter() {index=0} : f32[2,3]
  %full = slice(%x) {limit=[2,3], start=[0,0], stride=[1,1]} : f32[2,3]
  %part = slice(%full) {limit=[2,3], start=[0,1], stride=[1,1]} : f32[2,2]
  %one = concatenate(%part) {dim=1} : f32[2,2]
  return %one
)");
  EXPECT_CHECKS(out, R"(
    CHECK: %part = slice(%x)
    CHECK-NEXT: return %part
  )");
}

TEST(Canonicalize, ReportsNoChangeOnCanonicalInput) {
  Canon(R"(
  %x = parameter() {index=0} : f32[4]
  %e = exp(%x) : f32[4]
  return %e
)", /*expect_change=*/false);
}

}  // namespace
}  // namespace kiln
