// fuse-residual-norm (passes/fuse_residual_norm.h): add + norm become one node writing the
// sum and the (narrow) norm; the residual gradient's add folds into the norm's input
// gradient, and so does the norm's weight gradient. IR text in, FileCheck on the print, meaning checked on the reference backend
// bit for bit (tests/testing/pass_test.h); then llama-tiny's and gpt2-tiny's training steps
// through the default pipeline, with and without the pass.
#include "passes/fuse_residual_norm.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "codegen/capabilities.h"
#include "codegen/lower_node.h"
#include "frontends/gpt2.h"
#include "frontends/llama.h"
#include "ir/reference_backend.h"
#include "ir/text_format.h"
#include "passes/training_compile.h"
#include "runtime/differential_check.h"
#include "tests/testing/filecheck.h"
#include "tests/testing/pass_test.h"

namespace kiln {
namespace {

std::string Fuse(absl::string_view body, bool expect_change = true) {
  FuseResidualNormPass pass;
  return testing::RunPassOnText(pass, absl::StrCat("module @m\nfunc @main {\n", body, "}\n"), expect_change);
}

#define EXPECT_CHECKS(out, checks) EXPECT_TRUE(testing::FileCheck(out, checks).ok()) << testing::FileCheck(out, checks)

constexpr absl::string_view kParams = R"(
  %h = parameter() {index=0} : f32[8,64]
  %branch = parameter() {index=1} : f32[8,64]
  %w = parameter() {index=2} : f32[64]
)";

TEST(FuseResidualNorm, ForwardHeaderExample) {
  std::string out = Fuse(absl::StrCat(kParams, R"(
  %h2 = add(%h, %branch) : f32[8,64]
  %y = rms_norm(%h2, %w) {eps=1e-05} : f32[8,64]
  %yb = convert(%y) : bf16[8,64]
  return %h2, %yb
)"));
  EXPECT_CHECKS(out, R"(
    CHECK:      %h2, %y = add_rms_norm(%h, %branch, %w) {eps=1e-05, out_dtype=bf16} : (f32[8,64], bf16[8,64])
    CHECK-NEXT: return %h2, %y
    CHECK-NOT:  convert
  )");
}

TEST(FuseResidualNorm, BackwardHeaderExample) {
  std::string out = Fuse(R"(
  %x = parameter() {index=0} : f32[8,64]
  %w = parameter() {index=1} : f32[64]
  %dy = parameter() {index=2} : f32[8,64]
  %dres = parameter() {index=3} : f32[8,64]
  %gi = rms_norm_grad_input(%x, %w, %dy) {eps=1e-05} : f32[8,64]
  %dx = add(%dres, %gi) : f32[8,64]
  %dxb = convert(%dx) : bf16[8,64]
  return %dx, %dxb
)");
  EXPECT_CHECKS(out, R"(
    CHECK:      %dx, %dxb = add_rms_norm_grad_input(%dres, %x, %w, %dy) {copy_dtype=bf16, eps=1e-05} : (f32[8,64], bf16[8,64])
    CHECK-NEXT: return %dx, %dxb
    CHECK-NOT:  rms_norm_grad_input(
  )");
}

// The gradient first in the add, no converts: one result, no copy; the sum's other reader
// (another add) reads dx.
TEST(FuseResidualNorm, BackwardWithoutCopy) {
  std::string out = Fuse(R"(
  %x = parameter() {index=0} : f32[8,64]
  %w = parameter() {index=1} : f32[64]
  %dy = parameter() {index=2} : f32[8,64]
  %dres = parameter() {index=3} : f32[8,64]
  %gi = rms_norm_grad_input(%x, %w, %dy) {eps=1e-05} : f32[8,64]
  %dx = add(%gi, %dres) : f32[8,64]
  %more = add(%dx, %x) : f32[8,64]
  return %more
)");
  EXPECT_CHECKS(out, R"(
    CHECK:      %dx = add_rms_norm_grad_input(%dres, %x, %w, %dy) {eps=1e-05} : f32[8,64]
    CHECK-NEXT: %more = add(%dx, %x) : f32[8,64]
  )");
}

// The sum is the residual stream: its other readers (the next layer's add, and a function
// output) read the fused node's first result; y keeps f32 when one of its uses is not a
// convert, and the converts stay.
TEST(FuseResidualNorm, SumKeepsItsOtherUses) {
  std::string out = Fuse(absl::StrCat(kParams, R"(
  %h2 = add(%h, %branch) : f32[8,64]
  %y = rms_norm(%h2, %w) {eps=1e-05} : f32[8,64]
  %yb = convert(%y) : bf16[8,64]
  %n = neg(%y) : f32[8,64]
  %h3 = add(%h2, %n) : f32[8,64]
  return %h3, %yb, %h2
)"));
  EXPECT_CHECKS(out, R"(
    CHECK:      %h2, %y = add_rms_norm(%h, %branch, %w) {eps=1e-05} : (f32[8,64], f32[8,64])
    CHECK-NEXT: %yb = convert(%y) : bf16[8,64]
    CHECK-NEXT: %n = neg(%y) : f32[8,64]
    CHECK-NEXT: %h3 = add(%h2, %n) : f32[8,64]
    CHECK-NEXT: return %h3, %yb, %h2
  )");
}

TEST(FuseResidualNorm, LayerNorm) {
  std::string out = Fuse(absl::StrCat(kParams, R"(
  %b = parameter() {index=3} : f32[64]
  %h2 = add(%h, %branch) : f32[8,64]
  %y = layer_norm(%h2, %w, %b) {eps=1e-05} : f32[8,64]
  %yb = convert(%y) : bf16[8,64]
  return %h2, %yb
)"));
  EXPECT_CHECKS(out, R"(
    CHECK:      %h2, %y = add_layer_norm(%h, %branch, %w, %b) {eps=1e-05, out_dtype=bf16} : (f32[8,64], bf16[8,64])
    CHECK-NEXT: return %h2, %y
  )");
}

constexpr absl::string_view kGradParams = R"(
  %x = parameter() {index=0} : f32[8,64]
  %w = parameter() {index=1} : f32[64]
  %dy = parameter() {index=2} : f32[8,64]
  %dres = parameter() {index=3} : f32[8,64]
)";

// The final norm's backward (no residual add): the weight gradient becomes the input
// gradient's second result, one kernel reading x and dy once for both.
TEST(FuseResidualNorm, WeightGradHeaderExample) {
  std::string out = Fuse(R"(
  %x = parameter() {index=0} : f32[8,64]
  %w = parameter() {index=1} : f32[64]
  %dy = parameter() {index=2} : f32[8,64]
  %gi = rms_norm_grad_input(%x, %w, %dy) {eps=1e-05} : f32[8,64]
  %gw = rms_norm_grad_weight(%x, %w, %dy) {eps=1e-05} : f32[64]
  return %gi, %gw
)");
  EXPECT_CHECKS(out, R"(
    CHECK:      %gi, %gw = rms_norm_grad_input(%x, %w, %dy) {eps=1e-05, weight_grad=1} : (f32[8,64], f32[64])
    CHECK-NEXT: return %gi, %gw
    CHECK-NOT:  rms_norm_grad_weight
  )");
}

// A layer's norm: the residual add folds in first (with the copy), then the weight gradient
// joins as the last result; the merged node goes where the weight gradient was.
TEST(FuseResidualNorm, WeightGradJoinsTheResidualForm) {
  std::string out = Fuse(absl::StrCat(kGradParams, R"(
  %gi = rms_norm_grad_input(%x, %w, %dy) {eps=1e-05} : f32[8,64]
  %gw = rms_norm_grad_weight(%x, %w, %dy) {eps=1e-05} : f32[64]
  %dx = add(%dres, %gi) : f32[8,64]
  %dxb = convert(%dx) : bf16[8,64]
  %gw2 = neg(%gw) : f32[64]
  return %dx, %dxb, %gw2
)"));
  EXPECT_CHECKS(out, R"(
    CHECK:      %dx, %dxb, %gw = add_rms_norm_grad_input(%dres, %x, %w, %dy) {copy_dtype=bf16, eps=1e-05, weight_grad=1} : (f32[8,64], bf16[8,64], f32[64])
    CHECK-NEXT: %gw2 = neg(%gw) : f32[64]
    CHECK-NEXT: return %dx, %dxb, %gw2
    CHECK-NOT:  rms_norm_grad_weight
  )");
}

// GPT-2's layer_norm backward: both gradients of the centered input c (passes/vjp_rules.cc),
// the bias gradient a reduce_sum of dy that stays its own kernel.
TEST(FuseResidualNorm, WeightGradOfTheCenteredLayerNormInput) {
  std::string out = Fuse(absl::StrCat(kGradParams, R"(
  %s = reduce_sum(%x) {dims=[1]} : f32[8]
  %k = constant() {value=0.015625} : f32[8]
  %mean = mul(%s, %k) : f32[8]
  %mb = broadcast(%mean) {dims=[0]} : f32[8,64]
  %c = sub(%x, %mb) : f32[8,64]
  %dc = rms_norm_grad_input(%c, %w, %dy) {eps=1e-05} : f32[8,64]
  %dw = rms_norm_grad_weight(%c, %w, %dy) {eps=1e-05} : f32[64]
  %db = reduce_sum(%dy) {dims=[0]} : f32[64]
  return %dc, %dw, %db
)"));
  EXPECT_CHECKS(out, R"(
    CHECK:      %c = sub(%x, %mb) : f32[8,64]
    CHECK-NEXT: %dc, %dw = rms_norm_grad_input(%c, %w, %dy) {eps=1e-05, weight_grad=1} : (f32[8,64], f32[64])
    CHECK-NEXT: %db = reduce_sum(%dy) {dims=[0]} : f32[64]
  )");
}

// The layer_norm backward is fused, not rewritten exactly: the fused op computes the
// decomposition's value without rounding its intermediates to f32. Checked as `kiln check`
// does for such a pass: f32 values kept in double on both sides at 1e-9, and in f32 at 1e-4.
std::string FuseLayerNormBackward(absl::string_view body, bool expect_change = true) {
  const std::string text = absl::StrCat("module @m\nfunc @main {\n", body, "}\n");
  FuseResidualNormPass pass;
  const std::string out = testing::RunPassOnText(pass, text, expect_change, /*check_meaning=*/false);
  absl::StatusOr<std::unique_ptr<Module>> before = ParseModule(text), after = ParseModule(out);
  EXPECT_TRUE(before.ok() && after.ok()) << out;
  if (!before.ok() || !after.ok()) return out;
  DifferentialCheckOptions same_sums{.abs_tolerance = 1e-9, .rel_tolerance = 1e-9};
  same_sums.reference.f32_as_f64 = true;
  absl::Status same = CheckMeaningPreserved(**before, **after, same_sums);
  EXPECT_TRUE(same.ok()) << same;
  absl::Status f32 = CheckMeaningPreserved(**before, **after, {.abs_tolerance = 1e-4});
  EXPECT_TRUE(f32.ok()) << f32;
  return out;
}

// GPT-2's layer_norm backward as LayerNormVjp builds it (the centered x through both rms_norm
// gradients, dx centered again, db a reduce_sum of dy), the residual gradient added and
// converted for the next GEMMs: one add_layer_norm_grad_input with the copy, dw and db. It
// goes where the first of the values it replaces was (dw); nothing of the decomposition is
// left.
constexpr absl::string_view kLayerNormBackward = R"(
  %k = constant() {value=0.015625} : f32[8,64]
  %s = reduce_sum(%x) {dims=[1]} : f32[8]
  %sb = broadcast(%s) {dims=[0]} : f32[8,64]
  %mean = mul(%sb, %k) : f32[8,64]
  %c = sub(%x, %mean) : f32[8,64]
  %dc = rms_norm_grad_input(%c, %w, %dy) {eps=1e-05} : f32[8,64]
  %s2 = reduce_sum(%dc) {dims=[1]} : f32[8]
  %s2b = broadcast(%s2) {dims=[0]} : f32[8,64]
  %mean2 = mul(%s2b, %k) : f32[8,64]
  %dxc = sub(%dc, %mean2) : f32[8,64]
  %gw = rms_norm_grad_weight(%c, %w, %dy) {eps=1e-05} : f32[64]
  %db = reduce_sum(%dy) {dims=[0]} : f32[64]
)";

TEST(FuseResidualNorm, LayerNormBackward) {
  std::string out = FuseLayerNormBackward(absl::StrCat(kGradParams, kLayerNormBackward, R"(
  %dx = add(%dres, %dxc) : f32[8,64]
  %dxb = convert(%dx) : bf16[8,64]
  return %dx, %dxb, %gw, %db
)"));
  EXPECT_CHECKS(out, R"(
    CHECK:      %k = constant()
    CHECK-NEXT: %dx, %dxb, %gw, %db = add_layer_norm_grad_input(%dres, %x, %w, %dy) {copy_dtype=bf16, eps=1e-05, weight_grad=1} : (f32[8,64], bf16[8,64], f32[64], f32[64])
    CHECK-NEXT: return %dx, %dxb, %gw, %db
    CHECK-NOT:  rms_norm_grad
  )");
  EXPECT_EQ(out.find("reduce_sum"), std::string::npos) << out;
}

// The final norm's (ln_f: no residual add), its dx read by another value: the plain op with
// dw and db; and with neither gradient of the weights asked for, dx alone.
TEST(FuseResidualNorm, LayerNormBackwardWithoutTheResidualAdd) {
  std::string out = FuseLayerNormBackward(absl::StrCat(kGradParams, kLayerNormBackward, R"(
  %more = neg(%dxc) : f32[8,64]
  return %more, %gw, %db
)"));
  EXPECT_CHECKS(out, R"(
    CHECK:      %dxc, %gw, %db = layer_norm_grad_input(%x, %w, %dy) {eps=1e-05, weight_grad=1} : (f32[8,64], f32[64], f32[64])
    CHECK-NEXT: %more = neg(%dxc) : f32[8,64]
  )");
  const std::string without_weights = absl::StrReplaceAll(
      kLayerNormBackward, {{"  %gw = rms_norm_grad_weight(%c, %w, %dy) {eps=1e-05} : f32[64]\n", ""},
                           {"  %db = reduce_sum(%dy) {dims=[0]} : f32[64]\n", ""}});
  out = FuseLayerNormBackward(absl::StrCat(kGradParams, without_weights, R"(
  return %dxc
)"));
  EXPECT_CHECKS(out, R"(
    CHECK:      %dxc = layer_norm_grad_input(%x, %w, %dy) {eps=1e-05} : f32[8,64]
    CHECK-NEXT: return %dxc
  )");
}

// Near misses, left to the rms_norm rewrites (the weight gradient still merges): the mean
// taken with another scale, the centered x read by another node too, dx centered by the row
// mean of another value, and the row sum over another dim.
TEST(FuseResidualNorm, LayerNormBackwardOnlyOfTheDecomposition) {
  const std::string tail = R"(
  %dx = add(%dres, %dxc) : f32[8,64]
  return %dx, %gw, %db
)";
  const std::string wrong_scale = absl::StrCat(kGradParams, absl::StrReplaceAll(kLayerNormBackward, {{"0.015625", "0.03125"}}), tail);
  const std::string c_read_twice = absl::StrCat(kGradParams, kLayerNormBackward, R"(
  %cc = neg(%c) : f32[8,64]
  %dx = add(%dres, %dxc) : f32[8,64]
  return %dx, %gw, %db, %cc
)");
  const std::string other_mean = absl::StrCat(
      kGradParams, absl::StrReplaceAll(kLayerNormBackward, {{"%s2 = reduce_sum(%dc)", "%s2 = reduce_sum(%dres)"}}), tail);
  const std::string other_dims = absl::StrCat(R"(
  %x = parameter() {index=0} : f32[8,8]
  %w = parameter() {index=1} : f32[8]
  %dy = parameter() {index=2} : f32[8,8]
  %dres = parameter() {index=3} : f32[8,8]
  %k = constant() {value=0.125} : f32[8,8]
  %s = reduce_sum(%x) {dims=[0]} : f32[8]
  %sb = broadcast(%s) {dims=[1]} : f32[8,8]
  %mean = mul(%sb, %k) : f32[8,8]
  %c = sub(%x, %mean) : f32[8,8]
  %dc = rms_norm_grad_input(%c, %w, %dy) {eps=1e-05} : f32[8,8]
  %s2 = reduce_sum(%dc) {dims=[1]} : f32[8]
  %s2b = broadcast(%s2) {dims=[0]} : f32[8,8]
  %mean2 = mul(%s2b, %k) : f32[8,8]
  %dxc = sub(%dc, %mean2) : f32[8,8]
  %gw = rms_norm_grad_weight(%c, %w, %dy) {eps=1e-05} : f32[8]
  %db = reduce_sum(%dy) {dims=[0]} : f32[8]
  %dx = add(%dres, %dxc) : f32[8,8]
  return %dx, %gw, %db
)");
  for (const std::string& body : {wrong_scale, c_read_twice, other_mean, other_dims}) {
    std::string out = Fuse(body);
    EXPECT_EQ(out.find("layer_norm_grad_input"), std::string::npos) << body << out;
    EXPECT_NE(out.find("weight_grad=1"), std::string::npos) << body << out;
  }
}

// Left alone: another eps, another dy, another x, and a weight gradient that the residual
// gradient itself depends on (the merged node would read its own result).
TEST(FuseResidualNorm, WeightGradOnlyOfTheSameNorm) {
  for (const std::string& body : {
           absl::StrCat(kGradParams, R"(
  %gi = rms_norm_grad_input(%x, %w, %dy) {eps=1e-05} : f32[8,64]
  %gw = rms_norm_grad_weight(%x, %w, %dy) {eps=1e-06} : f32[64]
  return %gi, %gw
)"),
           absl::StrCat(kGradParams, R"(
  %gi = rms_norm_grad_input(%x, %w, %dy) {eps=1e-05} : f32[8,64]
  %gw = rms_norm_grad_weight(%x, %w, %dres) {eps=1e-05} : f32[64]
  return %gi, %gw
)"),
           absl::StrCat(kGradParams, R"(
  %gi = rms_norm_grad_input(%x, %w, %dy) {eps=1e-05} : f32[8,64]
  %gw = rms_norm_grad_weight(%dres, %w, %dy) {eps=1e-05} : f32[64]
  return %gi, %gw
)"),
       }) {
    std::string out = Fuse(body, /*expect_change=*/false);
    EXPECT_NE(out.find("rms_norm_grad_weight("), std::string::npos) << body << out;
    EXPECT_EQ(out.find("weight_grad="), std::string::npos) << body << out;
  }
  std::string out = Fuse(absl::StrCat(kGradParams, R"(
  %gw = rms_norm_grad_weight(%x, %w, %dy) {eps=1e-05} : f32[64]
  %gwb = broadcast(%gw) {dims=[1]} : f32[8,64]
  %dres2 = add(%dres, %gwb) : f32[8,64]
  %gi = rms_norm_grad_input(%x, %w, %dy) {eps=1e-05} : f32[8,64]
  %dx = add(%dres2, %gi) : f32[8,64]
  return %dx
)"));
  EXPECT_CHECKS(out, R"(
    CHECK:      %gw = rms_norm_grad_weight(%x, %w, %dy) {eps=1e-05} : f32[64]
    CHECK:      %dx = add_rms_norm_grad_input(%dres2, %x, %w, %dy) {eps=1e-05} : f32[8,64]
  )");
}

// No add before the norm (the first layer's, reading the embedding): the norm writes bf16
// itself; every convert of it goes (cse may not have merged them yet).
TEST(FuseResidualNorm, NormWithoutAddWritesNarrow) {
  std::string out = Fuse(R"(
  %table = parameter() {index=0} : f32[16,64]
  %ids = parameter() {index=1} : i32[8]
  %w = parameter() {index=2} : f32[64]
  %x = gather(%table, %ids) : f32[8,64]
  %y = rms_norm(%x, %w) {eps=1e-05} : f32[8,64]
  %a = convert(%y) : bf16[8,64]
  %b = convert(%y) : bf16[8,64]
  return %a, %b
)");
  EXPECT_CHECKS(out, R"(
    CHECK:      %y = rms_norm(%x, %w) {eps=1e-05, out_dtype=bf16} : bf16[8,64]
    CHECK-NEXT: return %y, %y
  )");
}

// Left alone: a broadcast operand (fuse-loops folds it into the add's kernel for free), a
// bf16 residual (the fused kernels keep the sum f32), a weight defined after the add (where
// the fused node would go), an input gradient with another use, one that is an output.
TEST(FuseResidualNorm, OnlyWhereLegal) {
  for (const std::string& body : {
           absl::StrCat(R"(
  %h = parameter() {index=0} : f32[8,64]
  %bias = parameter() {index=1} : f32[64]
  %w = parameter() {index=2} : f32[64]
  %bb = broadcast(%bias) {dims=[1]} : f32[8,64]
  %h2 = add(%h, %bb) : f32[8,64]
  %y = rms_norm(%h2, %w) {eps=1e-05} : f32[8,64]
  return %y
)"),
           std::string(R"(
  %h = parameter() {index=0} : bf16[8,64]
  %branch = parameter() {index=1} : bf16[8,64]
  %w = parameter() {index=2} : f32[64]
  %h2 = add(%h, %branch) : bf16[8,64]
  %y = rms_norm(%h2, %w) {eps=1e-05} : bf16[8,64]
  return %y
)"),
           absl::StrCat(kParams, R"(
  %h2 = add(%h, %branch) : f32[8,64]
  %w2 = neg(%w) : f32[64]
  %y = rms_norm(%h2, %w2) {eps=1e-05} : f32[8,64]
  return %y
)"),
           std::string(R"(
  %x = parameter() {index=0} : f32[8,64]
  %w = parameter() {index=1} : f32[64]
  %dy = parameter() {index=2} : f32[8,64]
  %gi = rms_norm_grad_input(%x, %w, %dy) {eps=1e-05} : f32[8,64]
  %dx = add(%x, %gi) : f32[8,64]
  %n = neg(%gi) : f32[8,64]
  return %dx, %n
)"),
           std::string(R"(
  %x = parameter() {index=0} : f32[8,64]
  %w = parameter() {index=1} : f32[64]
  %dy = parameter() {index=2} : f32[8,64]
  %gi = rms_norm_grad_input(%x, %w, %dy) {eps=1e-05} : f32[8,64]
  %dx = add(%x, %gi) : f32[8,64]
  return %dx, %gi
)"),
       }) {
    std::string out = Fuse(body, /*expect_change=*/false);
    EXPECT_EQ(out.find("add_"), std::string::npos) << body << out;
    EXPECT_NE(out.find(" = add("), std::string::npos) << body << out;
  }
}

// The fused ops round every intermediate the unfused ops stored: a sum that is not exact
// in f32 (1 + 2^-30 rounds to 1) gives the same y as the unfused add + norm. The reference
// backend keeps values in double, so without the rounding the fused y would differ.
TEST(FuseResidualNorm, SumIsRoundedToF32BeforeTheNorm) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(R"(module @m
func @main {
  %h = parameter() {index=0} : f32[1,2]
  %branch = parameter() {index=1} : f32[1,2]
  %w = parameter() {index=2} : f32[2]
  %sum, %y = add_rms_norm(%h, %branch, %w) {eps=0.0} : (f32[1,2], f32[1,2])
  %h2 = add(%h, %branch) : f32[1,2]
  %y2 = rms_norm(%h2, %w) {eps=0.0} : f32[1,2]
  return %sum, %y, %h2, %y2
})");
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<HostTensor> args = {HostTensor::FromValues({DType::kF32, {1, 2}}, {1, 3}),
                                        HostTensor::FromValues({DType::kF32, {1, 2}}, {std::ldexp(1.0, -30), 0}),
                                        HostTensor::FromValues({DType::kF32, {2}}, {1, 1})};
  absl::StatusOr<std::vector<HostTensor>> out = EvaluateFunction(*(*m)->functions()[0], args);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].values(), (*out)[2].values());
  EXPECT_EQ((*out)[0].values()[0], 1.0);
  EXPECT_EQ((*out)[1].values(), (*out)[3].values());
}

struct StepCounts {
  int64_t adds = 0, converts = 0;  // fusion bodies included
  int64_t fusions = 0;             // generated loop/reduction kernels
  int64_t nodes_that_run = 0;      // top-level nodes that launch a kernel or a GEMM
  int64_t bytes = 0;               // what those read and write, each operand and result once
  int64_t launches = 0;            // kernels and cuBLASLt calls, as codegen lowers the nodes for sm_90a
  int64_t add_norms = 0, grad_inputs_with_add = 0, narrow_norms = 0;
  int64_t weight_grads = 0;           // rms_norm_grad_weight nodes (their own kernel)
  int64_t merged_weight_grads = 0;    // input gradients {weight_grad=1}
  int64_t rms_grad_inputs = 0;        // rms_norm_grad_input nodes, either form
  int64_t layer_norm_grads = 0, layer_norm_grads_with_add = 0;  // the fused layer_norm backward
};

// A node of the step that runs something: not a parameter, constant, reshape (an alias),
// get_result (its node writes it) or splat.
bool Runs(const Node& n) {
  switch (n.opcode()) {
    case Opcode::kParameter:
    case Opcode::kConstant:
    case Opcode::kReshape:
    case Opcode::kGetResult:
      return false;
    default:
      return true;
  }
}

void CountInto(const Function& f, StepCounts& c, bool top) {
  for (const auto& n : f.nodes()) {
    const Opcode op = n->opcode();
    c.adds += op == Opcode::kAdd;
    c.converts += op == Opcode::kConvert;
    c.fusions += op == Opcode::kFusion;
    c.add_norms += op == Opcode::kAddRmsNorm || op == Opcode::kAddLayerNorm;
    c.grad_inputs_with_add += op == Opcode::kAddRmsNormGradInput;
    c.narrow_norms += (op == Opcode::kRmsNorm || op == Opcode::kLayerNorm) && n->attrs().Has("out_dtype");
    c.weight_grads += op == Opcode::kRmsNormGradWeight;
    c.merged_weight_grads += n->attrs().Has("weight_grad");
    c.rms_grad_inputs += op == Opcode::kRmsNormGradInput || op == Opcode::kAddRmsNormGradInput;
    c.layer_norm_grads += op == Opcode::kLayerNormGradInput || op == Opcode::kAddLayerNormGradInput;
    c.layer_norm_grads_with_add += op == Opcode::kAddLayerNormGradInput;
    if (top) {
      static const CodegenOptions sm90a{.target = *TargetForArch("sm_90a")};
      absl::StatusOr<LoweredNode> lowered = LowerNode(*n, sm90a);
      EXPECT_TRUE(lowered.ok()) << n->name() << ": " << lowered.status();
      if (lowered.ok() && lowered->kind == LoweringKind::kGemm) ++c.launches;
      if (lowered.ok() && lowered->kind == LoweringKind::kKernels) c.launches += lowered->kernels.size();
    }
    if (top && Runs(*n)) {
      ++c.nodes_that_run;
      for (const Node* operand : n->operands()) c.bytes += operand->type().num_bytes();
      for (const TensorType& t : n->result_types()) c.bytes += t.num_bytes();
    }
    if (n->body() != nullptr) CountInto(*n->body(), c, false);
  }
}

StepCounts CountStep(const Function& f) {
  StepCounts c;
  CountInto(f, c, true);
  return c;
}

std::unique_ptr<Module> CompileStep(absl::string_view preset, bool fuse, int64_t batch = 1, int64_t seq_len = 16) {
  ModelConfig c = *PresetConfig(preset);
  std::unique_ptr<Module> m =
      *BuildModelModule(c, {.batch = batch, .seq_len = seq_len, .precision = Precision::kBf16});
  CompileOptions options;
  options.capabilities = &CodegenCapabilities();  // flash attention where the kernels take it, as kiln train
  if (!fuse) options.disabled_passes = {std::string(FuseResidualNormPass::kName)};
  absl::StatusOr<TrainingCompile> tc = TrainingCompile::Create({}, options);
  EXPECT_TRUE(tc.ok()) << tc.status();
  absl::Status run = tc->Run(*m);
  EXPECT_TRUE(run.ok()) << run;
  return m;
}

void Print(absl::string_view preset, const StepCounts& b, const StepCounts& a) {
  std::printf("%s step: launches %lld -> %lld, nodes that run %lld -> %lld, bytes they move %.3f -> %.3f GiB, "
              "fusions %lld -> %lld, "
              "adds %lld -> %lld, converts %lld -> %lld; add+norm %lld, grad_input+add %lld, narrow norms %lld\n",
              std::string(preset).c_str(), static_cast<long long>(b.launches), static_cast<long long>(a.launches),
              static_cast<long long>(b.nodes_that_run),
              static_cast<long long>(a.nodes_that_run), b.bytes / 1073741824.0, a.bytes / 1073741824.0,
              static_cast<long long>(b.fusions), static_cast<long long>(a.fusions),
              static_cast<long long>(b.adds), static_cast<long long>(a.adds), static_cast<long long>(b.converts),
              static_cast<long long>(a.converts), static_cast<long long>(a.add_norms),
              static_cast<long long>(a.grad_inputs_with_add), static_cast<long long>(a.narrow_norms));
}

// Bit for bit, or for a step with layer_norm (whose fused backward never rounds the
// decomposition's intermediates) as `kiln check` compares it: f32 values kept in double on
// both sides at 1e-9, and in f32 within 1e-4 (a changed f32 rounding may move a bf16 GEMM
// operand downstream to its neighbour).
void ExpectNothingLeftAndSameValues(Module& before, Module& after, bool exact = true) {
  FuseResidualNormPass again;
  absl::StatusOr<bool> changed = again.Run(after);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_FALSE(*changed);
  if (exact) {
    absl::Status same = CheckMeaningPreserved(before, after);
    EXPECT_TRUE(same.ok()) << same;
    return;
  }
  DifferentialCheckOptions same_sums{.abs_tolerance = 1e-9, .rel_tolerance = 1e-9};
  same_sums.reference.f32_as_f64 = true;
  absl::Status same = CheckMeaningPreserved(before, after, same_sums);
  EXPECT_TRUE(same.ok()) << same;
  absl::Status f32 = CheckMeaningPreserved(before, after, {.abs_tolerance = 1e-4});
  EXPECT_TRUE(f32.ok()) << f32;
}

// llama-tiny's training step (2 layers) through the training compile, with and without the
// pass. Forward: every norm writes bf16 (the residual adds whose branch is a GEMM are that
// GEMM's C by then, elide-grad-zeroing's); backward: each layer's two residual-gradient adds
// fold into the input gradients, all but the first layer's first with the bf16 copy its
// GEMMs read. Same values, bit for bit.
TEST(FuseResidualNorm, LlamaTinyTrainingStep) {
  std::unique_ptr<Module> before = CompileStep("llama-tiny", false);
  std::unique_ptr<Module> after = CompileStep("llama-tiny", true);
  const StepCounts b = CountStep(*before->FindFunction("train_step"));
  const StepCounts a = CountStep(*after->FindFunction("train_step"));
  Print("llama-tiny", b, a);
  const int64_t layers = PresetConfig("llama-tiny")->n_layers;
  EXPECT_EQ(b.add_norms + b.grad_inputs_with_add + b.narrow_norms, 0);
  EXPECT_EQ(a.narrow_norms + a.add_norms, 2 * layers + 1);  // every norm, the final one too
  EXPECT_EQ(a.grad_inputs_with_add, 2 * layers);
  // Every norm's weight gradient, the final norm's included, is its input gradient's result.
  EXPECT_EQ(b.weight_grads, 2 * layers + 1);
  EXPECT_EQ(a.weight_grads, 0);
  EXPECT_EQ(a.merged_weight_grads, 2 * layers + 1);
  EXPECT_LT(a.nodes_that_run, b.nodes_that_run);
  EXPECT_LT(a.bytes, b.bytes);
  ExpectNothingLeftAndSameValues(*before, *after);
}

// gpt2-tiny: layer_norm's forward the same way; its backward (LayerNormVjp's decomposition:
// rms_norm's gradients of the centered row, dx centered again, db a reduce_sum) becomes one
// layer_norm_grad_input {weight_grad=1} per norm, every layer's two with the residual
// gradient's add (the final norm's dx is the last layer's second norm's residual gradient, so
// one of each pair takes the add). The fused step agrees with the unfused one to f32 rounding
// (the differential check on the reference backend: ExpectNothingLeftAndSameValues).
TEST(FuseResidualNorm, Gpt2TinyTrainingStep) {
  std::unique_ptr<Module> before = CompileStep("gpt2-tiny", false);
  std::unique_ptr<Module> after = CompileStep("gpt2-tiny", true);
  const StepCounts b = CountStep(*before->FindFunction("train_step"));
  const StepCounts a = CountStep(*after->FindFunction("train_step"));
  Print("gpt2-tiny", b, a);
  const int64_t layers = PresetConfig("gpt2-tiny")->n_layers;
  EXPECT_EQ(a.narrow_norms + a.add_norms, 2 * layers + 1);
  EXPECT_EQ(b.weight_grads, 2 * layers + 1);
  EXPECT_EQ(b.rms_grad_inputs, 2 * layers + 1);
  EXPECT_EQ(b.layer_norm_grads, 0);
  EXPECT_EQ(a.weight_grads, 0);
  EXPECT_EQ(a.rms_grad_inputs, 0);
  EXPECT_EQ(a.layer_norm_grads, 2 * layers + 1);
  EXPECT_EQ(a.layer_norm_grads_with_add, 2 * layers);
  EXPECT_EQ(a.merged_weight_grads, 2 * layers + 1);
  EXPECT_LT(a.launches, b.launches);
  EXPECT_LT(a.nodes_that_run, b.nodes_that_run);
  EXPECT_LT(a.bytes, b.bytes);
  ExpectNothingLeftAndSameValues(*before, *after, /*exact=*/false);
}

// gpt2-124M at its training shape (batch 16, seq 1024), IR only: the figures of the fused
// layer_norm backward (launches as codegen lowers the nodes for sm_90a, the bytes the nodes
// that run read and write), with and without the pass.
TEST(FuseResidualNorm, Gpt2StepFigures) {
  std::unique_ptr<Module> before = CompileStep("gpt2-124M", false, 16, 1024);
  std::unique_ptr<Module> after = CompileStep("gpt2-124M", true, 16, 1024);
  const StepCounts b = CountStep(*before->FindFunction("train_step"));
  const StepCounts a = CountStep(*after->FindFunction("train_step"));
  Print("gpt2-124M", b, a);
  const int64_t layers = PresetConfig("gpt2-124M")->n_layers;
  EXPECT_EQ(a.layer_norm_grads, 2 * layers + 1);
  EXPECT_EQ(a.layer_norm_grads_with_add, 2 * layers);
  EXPECT_EQ(a.rms_grad_inputs + a.weight_grads, 0);
  EXPECT_LT(a.launches, b.launches);
  EXPECT_LT(a.bytes, b.bytes);
}

// llama-S at the reference shape (batch 16, seq 1024: DESIGN.md), IR only: the figures the
// commit reports (nodes that launch a kernel or a GEMM, the bytes they read and write).
TEST(FuseResidualNorm, LlamaSStepFigures) {
  std::unique_ptr<Module> before = CompileStep("llama-S", false, 16, 1024);
  std::unique_ptr<Module> after = CompileStep("llama-S", true, 16, 1024);
  const StepCounts b = CountStep(*before->FindFunction("train_step"));
  const StepCounts a = CountStep(*after->FindFunction("train_step"));
  Print("llama-S", b, a);
  const int64_t layers = PresetConfig("llama-S")->n_layers;
  EXPECT_EQ(a.narrow_norms + a.add_norms, 2 * layers + 1);
  EXPECT_EQ(a.grad_inputs_with_add, 2 * layers);
  EXPECT_EQ(a.weight_grads, 0);
  EXPECT_EQ(a.merged_weight_grads, 2 * layers + 1);
  EXPECT_LT(a.launches, b.launches);
  EXPECT_LT(a.bytes, b.bytes);
}

}  // namespace
}  // namespace kiln
