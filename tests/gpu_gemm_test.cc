// gemm on cuBLASLt (runtime/cuda/gemm.h): every dot_general layout family, lowered by
// lower-gemm (whose layout analysis tests/lower_gemm_test.cc checks without a GPU), against
// the CPU reference of the dot_general in f32 (pedantic), bf16 -> f32, bf16 -> bf16 and
// f16 -> f32. The tolerance is
// the worst case of f32 summation in any order, (K + 2)·2⁻²⁴·Σ|a||b| per element, plus one
// bf16 ulp of a narrow result; integer-valued operands must give exact results.
#include "runtime/cuda/gemm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "ir/builder.h"
#include "frontends/gpu_compile.h"
#include "codegen/compile_program.h"
#include "runtime/cuda/executable.h"
#include "ir/reference_backend.h"
#include "ir/text_format.h"
#include "passes/lower_gemm.h"
#include "tests/testing/dot_cases.h"
#include "tests/testing/gpu.h"
#include "tests/testing/lowered_for_gpu.h"

namespace kiln {
namespace {

using testing::BuildDot;
using testing::DotCase;
using testing::DotCases;

CudaDevice* Device() { return testing::TestDevice(); }

// The dot_general's function run on the GPU as every compile runs it: lowered to a gemm.
absl::StatusOr<std::vector<HostTensor>> GemmOnGpu(const Function& f, const std::vector<HostTensor>& args) {
  return EvaluateOnGpu(*testing::LoweredForGpu(f)->functions()[0], args, *Device(), {.poison_arena = true});
}

// The gemm node of a lowered one-dot function.
const Node* GemmOf(const Function& f) {
  for (const auto& n : f.nodes()) {
    if (n->opcode() == Opcode::kGemm) return n.get();
  }
  return nullptr;
}

// Σ|a||b| per output element: the reference's dot of the absolute values.
HostTensor AbsDot(const Function& f, const std::vector<HostTensor>& args) {
  std::vector<HostTensor> abs_args;
  for (const HostTensor& t : args) {
    HostTensor a = t;
    for (double& v : a.mutable_values()) v = std::abs(v);
    abs_args.push_back(std::move(a));
  }
  ReferenceOptions exact;
  exact.f32_as_f64 = true;
  absl::StatusOr<std::vector<HostTensor>> r = EvaluateFunction(f, abs_args, exact);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? (*r)[0] : HostTensor();
}

struct GemmDTypes {
  DType in, out;
};

TEST(GpuGemm, EveryLayoutMatchesTheReference) {
  KILN_REQUIRE_GPU();
  for (const DotCase& c : DotCases()) {
    for (GemmDTypes p : {GemmDTypes{DType::kF32, DType::kF32}, GemmDTypes{DType::kBF16, DType::kF32},
                        GemmDTypes{DType::kBF16, DType::kBF16}, GemmDTypes{DType::kF16, DType::kF32}}) {
      SCOPED_TRACE(absl::StrCat(c.name, " ", DTypeName(p.in), " -> ", DTypeName(p.out)));
      Function f(c.name);
      BuildDot(f, c, p.in, p.out);
      std::vector<HostTensor> args = {HostTensor::Random(f.parameters()[0]->type(), 1),
                                      HostTensor::Random(f.parameters()[1]->type(), 2)};
      absl::StatusOr<std::vector<HostTensor>> want = EvaluateFunction(f, args);
      ASSERT_TRUE(want.ok()) << want.status();
      absl::StatusOr<std::vector<HostTensor>> got = GemmOnGpu(f, args);
      ASSERT_TRUE(got.ok()) << got.status();
      const HostTensor bound = AbsDot(f, args);
      int64_t k = 1;
      for (int64_t d : c.dims.lhs_contract) k *= c.a_dims[d];
      const double narrow = p.out == DType::kF32 ? 0 : 0x1p-7;  // one bf16 ulp: f32 sums may straddle a rounding boundary
      int64_t bad = 0;
      for (int64_t i = 0; i < bound.num_elements(); ++i) {
        const double w = (*want)[0][i], g = (*got)[0][i];
        const double allowed = (k + 2) * 0x1p-24 * bound[i] + narrow * std::abs(w);
        if (!(std::abs(g - w) <= allowed) && ++bad <= 3) {
          ADD_FAILURE() << "[" << i << "] gpu " << g << " reference " << w << " allowed " << allowed;
        }
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

TEST(GpuGemm, IntegerValuedOperandsAreExact) {
  KILN_REQUIRE_GPU();
  for (const DotCase& c : DotCases()) {
    SCOPED_TRACE(c.name);
    Function f(c.name);
    BuildDot(f, c, DType::kBF16, DType::kF32);
    std::vector<HostTensor> args;
    for (uint64_t seed : {3, 4}) {
      HostTensor t = HostTensor::Random(f.parameters()[args.size()]->type(), seed, -3, 3);
      for (double& v : t.mutable_values()) v = std::round(v);  // small integers: every sum is exact
      args.push_back(std::move(t));
    }
    absl::StatusOr<std::vector<HostTensor>> want = EvaluateFunction(f, args);
    absl::StatusOr<std::vector<HostTensor>> got = GemmOnGpu(f, args);
    ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
    EXPECT_EQ((*got)[0].values(), (*want)[0].values());
  }
}

// epilogue=bias (passes/gemm_bias_epilogue.h) on cuBLASLt's CUBLASLT_EPILOGUE_BIAS, with and
// without C, f32 and bf16 results: integer-valued operands and bias make every sum exact,
// so the GPU must equal the reference's definition bit for bit.
TEST(GpuGemm, BiasEpilogueMatchesTheDefinitionExactly) {
  KILN_REQUIRE_GPU();
  struct Case {
    const char* name;
    const char* out;
    const char* bias;
    bool with_c;
  };
  // (An f32 bias for a bf16 result is refused by cuBLASLt 13.0 on the H200,
  // CUBLAS_STATUS_INVALID_VALUE, so the op takes the result's dtype only.)
  for (const Case& c : {Case{"f32", "f32", "f32", false}, Case{"f32_after_c", "f32", "f32", true},
                        Case{"bf16", "bf16", "bf16", false}}) {
    SCOPED_TRACE(c.name);
    const std::string text = absl::StrCat(R"(module @m
func @main {
  %x = parameter() {index=0} : bf16[64,32]
  %w = parameter() {index=1} : bf16[32,48]
  %b = parameter() {index=2} : )", c.bias, R"([48]
)", c.with_c ? absl::StrCat("  %c = parameter() {index=3} : ", c.out, "[64,48]\n") : "",
                                          "  %y = gemm(%x, %w, ", c.with_c ? "%c, " : "",
                                          "%b) {a_layout=mk, alpha=1.0, b_layout=kn, batch=1, beta=",
                                          c.with_c ? "1.0" : "0.0", ", epilogue=bias, k=32, m=64, n=48} : ", c.out,
                                          R"([64,48]
  return %y
})");
    absl::StatusOr<std::unique_ptr<Module>> m = ParseModule(text);
    ASSERT_TRUE(m.ok()) << m.status();
    const Function& f = *(*m)->functions()[0];
    std::vector<HostTensor> args;
    for (const Node* p : f.parameters()) {
      HostTensor t = HostTensor::Random(p->type(), 10 + args.size(), -3, 3);
      for (double& v : t.mutable_values()) v = std::round(v);
      args.push_back(std::move(t));
    }
    absl::StatusOr<std::vector<HostTensor>> want = EvaluateFunction(f, args);
    ASSERT_TRUE(want.ok()) << want.status();
    absl::StatusOr<std::vector<HostTensor>> got = EvaluateOnGpu(f, args, *Device(), {.poison_arena = true});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ((*got)[0].values(), (*want)[0].values());
  }
}

// The description codegen makes reads the gemm node alone: its sizes and layouts are the
// lowering's, and the plan's workspace stays within what the memory plan reserves.
TEST(GpuGemm, PlansReadTheGemmNode) {
  KILN_REQUIRE_GPU();
  for (const DotCase& c : DotCases()) {
    SCOPED_TRACE(c.name);
    Function f(c.name);
    Node* dot = BuildDot(f, c, DType::kBF16, DType::kF32);
    absl::StatusOr<GemmShape> shape = AnalyzeDotGeneral(*dot);
    ASSERT_TRUE(shape.ok()) << shape.status();
    const std::unique_ptr<Module> lowered = testing::LoweredForGpu(f);
    const Node* gemm = GemmOf(*lowered->functions()[0]);
    ASSERT_NE(gemm, nullptr);
    absl::StatusOr<GemmDescription> g = GemmDescriptionOf(*gemm);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(std::vector<int64_t>({g->batch, g->m, g->n, g->k}),
              std::vector<int64_t>({shape->batch, shape->m, shape->n, shape->k}));
    EXPECT_EQ(g->a_k_inner, shape->a_k_inner);
    EXPECT_EQ(g->b_k_inner, shape->b_k_inner);
    absl::StatusOr<std::unique_ptr<GemmPlan>> plan = GemmPlan::Create(*g, *Device());
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_LE((*plan)->workspace_bytes(), g->max_workspace_bytes);
  }
}

TEST(GpuGemm, UnsupportedDTypesAndUnloweredDotsFailNamingTheNode) {
  Function f("fp8_dot");
  Node* dot = BuildDot(f, DotCases()[0], DType::kF8E4M3, DType::kF32);  // FP8 GEMMs are not planned yet
  absl::StatusOr<GemmDescription> unlowered = GemmDescriptionOf(*dot);
  ASSERT_FALSE(unlowered.ok());
  EXPECT_NE(unlowered.status().message().find("the lower-gemm pass"), absl::string_view::npos) << unlowered.status();
  const std::unique_ptr<Module> lowered = testing::LoweredForGpu(f);
  absl::StatusOr<GemmDescription> fp8 = GemmDescriptionOf(*GemmOf(*lowered->functions()[0]));
  ASSERT_FALSE(fp8.ok());
  EXPECT_EQ(fp8.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(fp8.status().message().find("%dot (gemm)"), absl::string_view::npos) << fp8.status();
}

}  // namespace
}  // namespace kiln
