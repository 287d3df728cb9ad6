// elide-grad-zeroing (passes/elide_grad_zeroing.h): gradient sums accumulate in their GEMMs
// (beta=1) and a 1/K scale goes into alpha. IR text in, FileCheck on the print, meaning checked
// on the reference backend (tests/testing/pass_test.h); the gemm's epilogue rule that makes it
// exact; the zero-initialised accumulator count; llama-tiny's training step with --accum 1
// and 2.
#include "passes/elide_grad_zeroing.h"

#include <cmath>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "frontends/llama.h"
#include "ir/reference_backend.h"
#include "ir/text_format.h"
#include "passes/training_compile.h"
#include "runtime/differential_check.h"
#include "tests/testing/filecheck.h"
#include "tests/testing/pass_test.h"

namespace kiln {
namespace {

std::string Elide(absl::string_view body, bool expect_change = true) {
  ElideGradZeroingPass pass;
  return testing::RunPassOnText(pass, absl::StrCat("module @m\nfunc @main {\n", body, "}\n"), expect_change);
}

#define EXPECT_CHECKS(out, checks) EXPECT_TRUE(testing::FileCheck(out, checks).ok()) << testing::FileCheck(out, checks)

constexpr absl::string_view kParams = R"(
  %x0 = parameter() {index=0} : bf16[16,32]
  %d0 = parameter() {index=1} : bf16[16,64]
  %x1 = parameter() {index=2} : bf16[16,32]
  %d1 = parameter() {index=3} : bf16[16,64]
)";
constexpr absl::string_view kAttrs =
    "{a_layout=km, alpha=1.0, b_layout=kn, batch=1, beta=0.0, epilogue=none, k=16, m=32, n=64}";

TEST(ElideGradZeroing, HeaderExample) {
  std::string out = Elide(absl::StrCat(kParams, "  %g0 = gemm(%x0, %d0) ", kAttrs, R"( : f32[32,64]
  %h = constant() {value=0.5} : f32[32,64]
  %s0 = mul(%g0, %h) : f32[32,64]
  %g1 = gemm(%x1, %d1) )", kAttrs, R"( : f32[32,64]
  %s1 = mul(%g1, %h) : f32[32,64]
  %sum = add(%s0, %s1) : f32[32,64]
  return %sum
)"));
  EXPECT_CHECKS(out, R"(
    CHECK:      %g0 = gemm(%x0, %d0) {a_layout=km, alpha=0.5, b_layout=kn, batch=1, beta=0.0, epilogue=none, k=16, m=32, n=64} : f32[32,64]
    CHECK-NEXT: %g1 = gemm(%x1, %d1, %g0) {a_layout=km, alpha=0.5, b_layout=kn, batch=1, beta=1.0, epilogue=none, k=16, m=32, n=64} : f32[32,64]
    CHECK-NEXT: return %g1
  )");
}

// add(gemm, x) and add(x, gemm) both accumulate into x; a chain of three contributions is
// one overwrite and two accumulations.
TEST(ElideGradZeroing, ContributionsAccumulateInTheirGemms) {
  std::string out = Elide(absl::StrCat(kParams, R"(  %r = parameter() {index=4} : f32[32,64]
  %g0 = gemm(%x0, %d0) )", kAttrs, R"( : f32[32,64]
  %g1 = gemm(%x1, %d1) )", kAttrs, R"( : f32[32,64]
  %g2 = gemm(%x1, %d0) )", kAttrs, R"( : f32[32,64]
  %a = add(%g0, %r) : f32[32,64]
  %b = add(%a, %g1) : f32[32,64]
  %c = add(%g2, %b) : f32[32,64]
  return %c
)"));
  EXPECT_CHECKS(out, R"(
    CHECK:      %g0 = gemm(%x0, %d0, %r) {a_layout=km, alpha=1.0, b_layout=kn, batch=1, beta=1.0, epilogue=none, k=16, m=32, n=64} : f32[32,64]
    CHECK-NEXT: %g1 = gemm(%x1, %d1, %g0) {a_layout=km, alpha=1.0, b_layout=kn, batch=1, beta=1.0, epilogue=none, k=16, m=32, n=64} : f32[32,64]
    CHECK-NEXT: %g2 = gemm(%x1, %d0, %g1) {a_layout=km, alpha=1.0, b_layout=kn, batch=1, beta=1.0, epilogue=none, k=16, m=32, n=64} : f32[32,64]
    CHECK-NEXT: return %g2
    CHECK-NOT:  add
  )");
}

// Left alone: a gemm with another use (or that is an output), a scale that is not a power
// of two (cuBLASLt's fused alpha acc + C would round differently), a gemm that already
// accumulates.
TEST(ElideGradZeroing, OnlyASoleUseGemmAndAPowerOfTwoScale) {
  const std::string g0 = absl::StrCat("  %g0 = gemm(%x0, %d0) ", std::string(kAttrs), " : f32[32,64]\n");
  const std::string r = "  %r = parameter() {index=4} : f32[32,64]\n";
  for (const std::string& body : {
           absl::StrCat(kParams, r, g0, "  %a = add(%g0, %r) : f32[32,64]\n  %n = neg(%g0) : f32[32,64]\n",
                        "  return %a, %n\n"),
           absl::StrCat(kParams, r, g0, "  %a = add(%g0, %r) : f32[32,64]\n  return %a, %g0\n"),
           absl::StrCat(kParams, g0, "  %t = constant() {value=0.3333333432674408} : f32[32,64]\n",
                        "  %s = mul(%g0, %t) : f32[32,64]\n  return %s\n"),
           absl::StrCat(kParams, r,
                        "  %g0 = gemm(%x0, %d0, %r) {a_layout=km, alpha=1.0, b_layout=kn, batch=1, beta=1.0, "
                        "epilogue=none, k=16, m=32, n=64} : f32[32,64]\n",
                        "  %a = add(%g0, %r) : f32[32,64]\n  return %a\n"),
       }) {
    std::string out = Elide(body, /*expect_change=*/false);
    EXPECT_EQ(out.find("beta=1.0} : f32[32,64]\n  %a"), std::string::npos) << out;
  }
}

// The rule that makes the pass exact (ir/op_table.h): the epilogue adds C to the f32
// accumulator, rounding each step to f32, as add(gemm, x) does. acc = 1 + 2^-25 + 2^-40 is
// 1 in f32; adding x = 2^-24 gives a tie, rounded to even: 1. The exact sum plus x, rounded
// once, would be 1 + 2^-23.
TEST(ElideGradZeroing, TheEpilogueAddsCToTheF32Accumulator) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(R"(module @m
func @main {
  %a = parameter() {index=0} : f32[1,3]
  %b = parameter() {index=1} : f32[1,3]
  %x = parameter() {index=2} : f32[1,1]
  %g = gemm(%a, %b) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=3, m=1, n=1} : f32[1,1]
  %added = add(%g, %x) : f32[1,1]
  %fused = gemm(%a, %b, %x) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=1.0, epilogue=none, k=3, m=1, n=1} : f32[1,1]
  return %added, %fused
})");
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<HostTensor> args = {
      HostTensor::FromValues({DType::kF32, {1, 3}}, {1, std::ldexp(1.0, -25), std::ldexp(1.0, -40)}),
      HostTensor::FromValues({DType::kF32, {1, 3}}, {1, 1, 1}),
      HostTensor::FromValues({DType::kF32, {1, 1}}, {std::ldexp(1.0, -24)})};
  absl::StatusOr<std::vector<HostTensor>> out = EvaluateFunction(*(*m)->functions()[0], args);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].values()[0], 1.0);
  EXPECT_EQ((*out)[1].values()[0], 1.0);
}

TEST(ElideGradZeroing, CountsZeroInitialisedAccumulators) {
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(absl::StrCat("module @m\nfunc @main {\n", kParams, R"(
  %z = constant() {value=0.0} : f32[]
  %zb = broadcast(%z) {dims=[]} : f32[32,64]
  %nz = constant() {value=-0.0} : f32[32,64]
  %g0 = gemm(%x0, %d0) )", kAttrs, R"( : f32[32,64]
  %a = add(%zb, %g0) : f32[32,64]
  %b = add(%a, %nz) : f32[32,64]
  %c = gemm(%x1, %d1, %zb) {a_layout=km, alpha=1.0, b_layout=kn, batch=1, beta=1.0, epilogue=none, k=16, m=32, n=64} : f32[32,64]
  %d = add(%b, %c) : f32[32,64]
  return %d
}
)"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(CountZeroInitialisedAccumulators(**m), 3);
}

struct StepCounts {
  int64_t adds = 0;             // fusion bodies included
  int64_t accumulating_gemms = 0;
  int64_t gemms = 0;
  int64_t fusions = 0;
};

void CountInto(const Function& f, StepCounts& c) {
  for (const auto& n : f.nodes()) {
    c.adds += n->opcode() == Opcode::kAdd;
    c.fusions += n->opcode() == Opcode::kFusion;
    if (n->opcode() == Opcode::kGemm) {
      ++c.gemms;
      c.accumulating_gemms += *n->attrs().GetFloat("beta") != 0.0;
    }
    if (n->body() != nullptr) CountInto(*n->body(), c);
  }
}

// llama-tiny's training step with --accum 1 and 2, with and without the pass: no sum starts
// from zero, the GEMMs of micro-batch 1 accumulate into micro-batch 0's gradients (and
// backward sums of GEMM results accumulate too), with fewer adds and the same values.
TEST(ElideGradZeroing, LlamaTinyTrainingStep) {
  for (int64_t accum : {1, 2}) {
    auto compile = [accum](bool elide) {
      ModelConfig c = *PresetConfig("llama-tiny");
      std::unique_ptr<Module> m = *BuildLlamaModule(c, {.batch = 1, .seq_len = 16, .precision = Precision::kBf16});
      CompileOptions options;
      // fuse-residual-norm off in both: without elide-grad-zeroing it would take the forward
      // residual adds (into add_rms_norm) that elide-grad-zeroing folds into their GEMMs, and
      // the adds counted here would no longer be this pass's alone. merge-sibling-gemms off
      // in both: it merges the accumulating gemms this test counts.
      options.disabled_passes = {"fuse-residual-norm", "merge-sibling-gemms"};
      if (!elide) options.disabled_passes.push_back(std::string(ElideGradZeroingPass::kName));
      TrainingStepOptions step;
      step.accum_steps = accum;
      absl::StatusOr<TrainingCompile> tc = TrainingCompile::Create(step, options);
      EXPECT_TRUE(tc.ok()) << tc.status();
      absl::Status run = tc->Run(*m);
      EXPECT_TRUE(run.ok()) << run;
      return m;
    };
    std::unique_ptr<Module> before = compile(false);
    std::unique_ptr<Module> after = compile(true);
    StepCounts b, a;
    CountInto(*before->FindFunction("train_step"), b);
    CountInto(*after->FindFunction("train_step"), a);
    std::printf("llama-tiny step, accum %lld: adds %lld -> %lld, accumulating gemms %lld -> %lld (of %lld), "
                "fusions %lld -> %lld\n",
                static_cast<long long>(accum), static_cast<long long>(b.adds), static_cast<long long>(a.adds),
                static_cast<long long>(b.accumulating_gemms), static_cast<long long>(a.accumulating_gemms),
                static_cast<long long>(a.gemms), static_cast<long long>(b.fusions), static_cast<long long>(a.fusions));
    EXPECT_EQ(CountZeroInitialisedAccumulators(*before), 0) << "accum " << accum;
    EXPECT_EQ(CountZeroInitialisedAccumulators(*after), 0) << "accum " << accum;
    EXPECT_EQ(b.accumulating_gemms, 0);
    EXPECT_GT(a.accumulating_gemms, 0);
    EXPECT_EQ(a.adds, b.adds - a.accumulating_gemms) << "accum " << accum;
    EXPECT_EQ(a.gemms, b.gemms);
    absl::Status same = CheckMeaningPreserved(*before, *after);
    EXPECT_TRUE(same.ok()) << "accum " << accum << ": " << same;
  }
}

}  // namespace
}  // namespace kiln
