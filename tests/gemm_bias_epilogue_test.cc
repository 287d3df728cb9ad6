// gemm-bias-epilogue (passes/gemm_bias_epilogue.h): add(gemm, broadcast(bias)) becomes a gemm
// whose epilogue adds the bias. IR text in, FileCheck on the print, meaning checked on the
// reference backend (tests/testing/pass_test.h); what is left alone and why; and GPT-2's
// step, where every projection's bias goes to its GEMM.
#include "passes/gemm_bias_epilogue.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "frontends/gpt2.h"
#include "frontends/model_config.h"
#include "runtime/differential_check.h"
#include "ir/text_format.h"
#include "passes/training_compile.h"
#include "tests/testing/filecheck.h"
#include "tests/testing/pass_test.h"

namespace kiln {
namespace {

std::string Fold(absl::string_view body, bool expect_change = true) {
  GemmBiasEpiloguePass pass;
  return testing::RunPassOnText(pass, absl::StrCat("module @m\nfunc @main {\n", body, "}\n"), expect_change);
}

#define EXPECT_CHECKS(out, checks) EXPECT_TRUE(testing::FileCheck(out, checks).ok()) << testing::FileCheck(out, checks)

constexpr absl::string_view kGemmAttrs =
    "{a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=none, k=32, m=16, n=48}";

TEST(GemmBiasEpilogue, HeaderExample) {
  const std::string out = Fold(absl::StrCat(R"(
  %x = parameter() {index=0} : bf16[2,8,32]
  %w = parameter() {index=1} : bf16[32,48]
  %b = parameter() {index=2} : f32[48]
  %y = gemm(%x, %w) )", kGemmAttrs, R"( : f32[2,8,48]
  %bb = broadcast(%b) {dims=[2]} : f32[2,8,48]
  %z = add(%y, %bb) : f32[2,8,48]
  %g = gelu(%z) : f32[2,8,48]
  return %g
)"));
  EXPECT_CHECKS(out, R"(
    CHECK:      %z = gemm(%x, %w, %b) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=bias, k=32, m=16, n=48} : f32[2,8,48]
    CHECK-NEXT: %g = gelu(%z)
    CHECK-NOT:  broadcast
    CHECK-NOT:  add
  )");
}

// The bias on the left, and a gemm accumulating into C (beta=1): the bias is added after C.
TEST(GemmBiasEpilogue, EitherOrderAndAfterC) {
  const std::string out = Fold(R"(
  %x = parameter() {index=0} : bf16[16,32]
  %w = parameter() {index=1} : bf16[32,48]
  %c = parameter() {index=2} : f32[16,48]
  %b = parameter() {index=3} : f32[48]
  %y = gemm(%x, %w, %c) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=1.0, epilogue=none, k=32, m=16, n=48} : f32[16,48]
  %bb = broadcast(%b) {dims=[1]} : f32[16,48]
  %z = add(%bb, %y) : f32[16,48]
  return %z
)");
  EXPECT_CHECKS(out, R"(
    CHECK: %z = gemm(%x, %w, %c, %b) {{.*}}beta=1.0, epilogue=bias
  )");
}

// Not a row bias, a gemm read twice, a bias of another dtype: each stays an add.
TEST(GemmBiasEpilogue, LeavesWhatIsNotARowBiasOfASoleUse) {
  for (const char* body : {
           // broadcast along the rows (a column bias [M]), not the columns
           R"(
  %x = parameter() {index=0} : bf16[16,32]
  %w = parameter() {index=1} : bf16[32,48]
  %b = parameter() {index=2} : f32[16]
  %y = gemm(%x, %w) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=none, k=32, m=16, n=48} : f32[16,48]
  %bb = broadcast(%b) {dims=[0]} : f32[16,48]
  %z = add(%y, %bb) : f32[16,48]
  return %z
)",
           // the gemm's own value is needed too
           R"(
  %x = parameter() {index=0} : bf16[16,32]
  %w = parameter() {index=1} : bf16[32,48]
  %b = parameter() {index=2} : f32[48]
  %y = gemm(%x, %w) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=none, k=32, m=16, n=48} : f32[16,48]
  %bb = broadcast(%b) {dims=[1]} : f32[16,48]
  %z = add(%y, %bb) : f32[16,48]
  return %z, %y
)",
           // a bf16 result: the add rounds f32(gemm) + bias, the epilogue would round once
           R"(
  %x = parameter() {index=0} : bf16[16,32]
  %w = parameter() {index=1} : bf16[32,48]
  %b = parameter() {index=2} : bf16[48]
  %y = gemm(%x, %w) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=none, k=32, m=16, n=48} : bf16[16,48]
  %bb = broadcast(%b) {dims=[1]} : bf16[16,48]
  %z = add(%y, %bb) : bf16[16,48]
  return %z
)"}) {
    SCOPED_TRACE(body);
    const std::string out = Fold(body, /*expect_change=*/false);
    EXPECT_CHECKS(out, "CHECK: add(");
  }
}

// The verifier's view of the new slot: a bias of the wrong length or dtype is an error.
TEST(GemmBiasEpilogue, TheBiasSlotIsChecked) {
  absl::StatusOr<std::unique_ptr<Module>> bad = ParseModule(R"(module @m
func @main {
  %x = parameter() {index=0} : bf16[16,32]
  %w = parameter() {index=1} : bf16[32,48]
  %b = parameter() {index=2} : f32[16]
  %y = gemm(%x, %w, %b) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=bias, k=32, m=16, n=48} : f32[16,48]
  return %y
})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("gemm bias f32[16] must be [n] = [48]"), std::string::npos) << bad.status();
  absl::StatusOr<std::unique_ptr<Module>> mixed = ParseModule(R"(module @m
func @main {
  %x = parameter() {index=0} : bf16[16,32]
  %w = parameter() {index=1} : bf16[32,48]
  %b = parameter() {index=2} : f32[48]
  %y = gemm(%x, %w, %b) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=bias, k=32, m=16, n=48} : bf16[16,48]
  return %y
})");
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("of the result's dtype bf16"), std::string::npos) << mixed.status();
  absl::StatusOr<std::unique_ptr<Module>> unknown = ParseModule(R"(module @m
func @main {
  %x = parameter() {index=0} : bf16[16,32]
  %w = parameter() {index=1} : bf16[32,48]
  %y = gemm(%x, %w) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=gelu, k=32, m=16, n=48} : f32[16,48]
  return %y
})");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("epilogue 'gelu' is not one kiln lowers (none, bias)"), std::string::npos)
      << unknown.status();
}

// GPT-2's training step, with the pass and without: the four biased projections of each
// layer (c_attn, attn c_proj, c_fc, mlp c_proj) take their biases in the epilogue, and the
// step computes the same values (the reference backend, the check kiln check runs).
TEST(GemmBiasEpilogue, Gpt2ProjectionsTakeTheirBiasesInTheEpilogue) {
  const ModelConfig c = *PresetConfig("gpt2-tiny");
  auto compile = [&](bool fold) {
    std::unique_ptr<Module> m = *BuildGpt2Module(c, {.batch = 1, .seq_len = 16, .precision = Precision::kBf16});
    CompileOptions options;
    if (!fold) options.disabled_passes = {std::string(GemmBiasEpiloguePass::kName)};
    absl::StatusOr<TrainingCompile> tc = TrainingCompile::Create({}, options);
    EXPECT_TRUE(tc.ok()) << tc.status();
    absl::Status run = tc->Run(*m);
    EXPECT_TRUE(run.ok()) << run;
    return m;
  };
  auto biased = [](const Module& m) {
    int64_t count = 0;
    for (const auto& n : m.FindFunction("train_step")->nodes()) {
      count += n->opcode() == Opcode::kGemm && *n->attrs().GetSymbol("epilogue") == "bias";
    }
    return count;
  };
  std::unique_ptr<Module> before = compile(false);
  std::unique_ptr<Module> after = compile(true);
  EXPECT_EQ(biased(*before), 0);
  EXPECT_EQ(biased(*after), 4 * c.n_layers);
  absl::Status same = CheckMeaningPreserved(*before, *after);
  EXPECT_TRUE(same.ok()) << same;
}

}  // namespace
}  // namespace kiln
