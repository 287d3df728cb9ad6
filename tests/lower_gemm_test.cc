// lower-gemm (passes/lower_gemm.h): the layout analysis that decides each gemm's sizes,
// layouts and transposes, and the rewrite itself, which the reference backend shows exact.
#include "passes/lower_gemm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ir/text_format.h"
#include "ir/verifier.h"
#include "ir/reference_backend.h"
#include "tests/testing/dot_cases.h"

namespace kiln {
namespace {

using testing::BuildDot;
using testing::DotCase;
using testing::DotCases;

TEST(LowerGemm, CommonTransformerLayoutsNeedNoCopies) {
  struct Expect { const char* name; int64_t batch, m, n, k; bool a_k_inner, b_k_inner; };
  for (const Expect& e : {Expect{"x_times_w_transposed", 1, 6, 24, 16, true, true},
                          Expect{"weight_gradient", 1, 24, 16, 6, false, false},
                          Expect{"attention_scores", 6, 5, 5, 8, true, true},
                          Expect{"attention_times_values", 6, 5, 8, 5, true, false},
                          Expect{"both_transposed", 1, 4, 6, 16, false, true},
                          Expect{"unit_dims", 1, 4, 3, 8, true, false},
                          Expect{"outer_product", 1, 5, 7, 1, true, true}}) {
    for (const DotCase& c : DotCases()) {
      if (c.name != e.name) continue;
      Function f(c.name);
      absl::StatusOr<GemmShape> g = AnalyzeDotGeneral(*BuildDot(f, c, DType::kBF16, DType::kF32));
      ASSERT_TRUE(g.ok()) << g.status();
      EXPECT_EQ(std::vector<int64_t>({g->batch, g->m, g->n, g->k}), std::vector<int64_t>({e.batch, e.m, e.n, e.k})) << e.name;
      EXPECT_EQ(g->a_k_inner, e.a_k_inner) << e.name;
      EXPECT_EQ(g->b_k_inner, e.b_k_inner) << e.name;
      EXPECT_TRUE(g->a_permutation.empty() && g->b_permutation.empty()) << e.name;
    }
  }
}

TEST(LowerGemm, UngroupedOperandsAreTransposedFirst) {
  struct Expect { const char* name; std::vector<int64_t> a_perm, b_perm; };
  for (const Expect& e : {Expect{"batch_dims_apart", {0, 2, 1, 3}, {0, 2, 1, 3}},
                          Expect{"contracting_orders_differ", {0, 2, 1}, {}},  // a is smaller: a follows b's order
                          Expect{"lhs_batch_not_leading", {1, 0, 2}, {}},
                          Expect{"batch_listed_in_reverse", {1, 0, 2, 3}, {}}}) {
    for (const DotCase& c : DotCases()) {
      if (c.name != e.name) continue;
      Function f(c.name);
      absl::StatusOr<GemmShape> g = AnalyzeDotGeneral(*BuildDot(f, c, DType::kF32, DType::kF32));
      ASSERT_TRUE(g.ok()) << g.status();
      EXPECT_EQ(g->a_permutation, e.a_perm) << e.name;
      EXPECT_EQ(g->b_permutation, e.b_perm) << e.name;
    }
  }
}

// Every layout family: the gemm (and its transposes) computes exactly the dot_general's
// values on the reference backend, in every dtype pair the GPU runs (fp8 operands through the
// gemm's unit scales).
TEST(LowerGemm, EveryLayoutKeepsTheValuesExactly) {
  for (const DotCase& c : DotCases()) {
    for (auto [in, out] : {std::pair{DType::kF32, DType::kF32}, std::pair{DType::kBF16, DType::kF32},
                           std::pair{DType::kBF16, DType::kBF16}, std::pair{DType::kF8E4M3, DType::kBF16},
                           std::pair{DType::kF8E5M2, DType::kF32}}) {
      SCOPED_TRACE(absl::StrCat(c.name, " ", DTypeName(in), " -> ", DTypeName(out)));
      Module m("m");
      Function& f = *m.AddFunction("f");
      BuildDot(f, c, in, out);
      const std::vector<HostTensor> args = {HostTensor::Random(f.parameters()[0]->type(), 1),
                                            HostTensor::Random(f.parameters()[1]->type(), 2)};
      absl::StatusOr<std::vector<HostTensor>> before = EvaluateFunction(f, args);
      ASSERT_TRUE(before.ok()) << before.status();
      absl::StatusOr<bool> changed = LowerGemmPass().RunOnFunction(f);
      ASSERT_TRUE(changed.ok()) << changed.status();
      EXPECT_TRUE(*changed);
      ASSERT_TRUE(VerifyFunction(f).ok()) << VerifyFunction(f) << PrintFunction(f);
      EXPECT_EQ(f.FindNode("dot")->opcode(), Opcode::kGemm);  // it keeps the dot_general's name
      absl::StatusOr<std::vector<HostTensor>> after = EvaluateFunction(f, args);
      ASSERT_TRUE(after.ok()) << after.status();
      EXPECT_EQ((*after)[0].values(), (*before)[0].values());
      // Round trip: the gemm's text form parses back.
      absl::StatusOr<std::unique_ptr<Module>> parsed = ParseModule(PrintModule(m));
      ASSERT_TRUE(parsed.ok()) << parsed.status();
    }
  }
}

TEST(LowerGemm, TheGemmLineSaysWhatCublasLtNeeds) {
  Module m("m");
  Function& f = *m.AddFunction("f");
  BuildDot(f, DotCases()[0], DType::kBF16, DType::kF32);  // x [2,3,16] · w [24,16]ᵀ
  ASSERT_TRUE(LowerGemmPass().RunOnFunction(f).ok());
  EXPECT_THAT(PrintFunction(f),
              ::testing::HasSubstr("%dot = gemm(%a, %b) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, "
                                   "epilogue=none, k=16, m=6, n=24} : f32[2,3,24]"));
  // An operand that does not fit gets an explicit transpose, which the gemm reads.
  Module awkward("m");
  Function& g = *awkward.AddFunction("g");
  BuildDot(g, DotCases()[4], DType::kF32, DType::kF32);  // batch_dims_apart
  ASSERT_TRUE(LowerGemmPass().RunOnFunction(g).ok());
  EXPECT_THAT(PrintFunction(g), ::testing::HasSubstr("%dot.lhs.transposed = transpose(%a) {perm=[0,2,1,3]}"));
  EXPECT_THAT(PrintFunction(g), ::testing::HasSubstr("%dot = gemm(%dot.lhs.transposed, %dot.rhs.transposed)"));
}

// fp8 operands take the gemm's FP8 slots (ir/op_table.h): scaled=1 with one constant 1 for
// its three scales, which the verifier accepts and which changes no value (above). No
// transpose is made for FP8's sake: a weight gradient stays km, kn (the plan refuses it).
TEST(LowerGemm, Fp8OperandsGetUnitScales) {
  Module m("m");
  Function& f = *m.AddFunction("f");
  BuildDot(f, DotCases()[0], DType::kF8E4M3, DType::kBF16);  // x [2,3,16] · w [24,16]ᵀ
  ASSERT_TRUE(LowerGemmPass().RunOnFunction(f).ok());
  ASSERT_TRUE(VerifyFunction(f).ok()) << VerifyFunction(f) << PrintFunction(f);
  EXPECT_THAT(PrintFunction(f), ::testing::HasSubstr("%dot.unit_scale = constant() {value=1.0} : f32[]"));
  EXPECT_THAT(PrintFunction(f),
              ::testing::HasSubstr("%dot = gemm(%a, %b, %dot.unit_scale, %dot.unit_scale, %dot.unit_scale) "
                                   "{a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=16, "
                                   "m=6, n=24, scaled=1} : bf16[2,3,24]"));
  Module wg("m");
  Function& g = *wg.AddFunction("g");
  BuildDot(g, DotCases()[1], DType::kF8E5M2, DType::kF32);  // weight_gradient
  ASSERT_TRUE(LowerGemmPass().RunOnFunction(g).ok());
  ASSERT_TRUE(VerifyFunction(g).ok()) << VerifyFunction(g) << PrintFunction(g);
  EXPECT_THAT(PrintFunction(g), ::testing::HasSubstr("a_layout=km"));
  EXPECT_THAT(PrintFunction(g), ::testing::Not(::testing::HasSubstr("transpose")));
}

TEST(LowerGemm, TheVerifierChecksAGemmsSizesAgainstItsOperands) {
  const char* text = R"(module @m

func @f {
  %a = parameter() {index=0} : bf16[6,16]
  %b = parameter() {index=1} : bf16[24,16]
  %d = gemm(%a, %b) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=16, m=6, n=25} : f32[6,24]
  return %d
}
)";
  absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(text);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), ::testing::HasSubstr("must hold batch*m*k = 96 and batch*n*k = 400 elements"));
}

}  // namespace
}  // namespace kiln
