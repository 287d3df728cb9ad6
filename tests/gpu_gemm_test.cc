// dot_general on cuBLASLt (runtime/cuda/gemm.h). Without a GPU: the layout analysis, which
// decides transposes, strides and copies. With one: every layout family against the CPU
// reference in f32 (pedantic), bf16 -> f32, bf16 -> bf16 and f16 -> f32. The tolerance is
// the worst case of f32 summation in any order, (K + 2)·2⁻²⁴·Σ|a||b| per element, plus one
// bf16 ulp of a narrow result; integer-valued operands must give exact results.
#include "runtime/cuda/gemm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "ir/builder.h"
#include "runtime/cuda/executable.h"
#include "runtime/reference_backend.h"
#include "tests/testing/gpu.h"

namespace kiln {
namespace {

CudaDevice* Device() { return testing::TestDevice(); }

struct DotCase {
  std::string name;
  std::vector<int64_t> a_dims, b_dims;
  DotDims dims;
};

// The layouts a transformer step produces, and the awkward ones.
std::vector<DotCase> DotCases() {
  return {
      {"x_times_w_transposed", {2, 3, 16}, {24, 16}, {{}, {}, {2}, {1}}},
      {"weight_gradient", {2, 3, 24}, {2, 3, 16}, {{}, {}, {0, 1}, {0, 1}}},
      {"attention_scores", {2, 3, 5, 8}, {2, 3, 5, 8}, {{0, 1}, {0, 1}, {3}, {3}}},
      {"attention_times_values", {2, 3, 5, 5}, {2, 3, 5, 8}, {{0, 1}, {0, 1}, {3}, {2}}},
      {"batch_dims_apart", {2, 5, 3, 8}, {2, 5, 3, 8}, {{0, 2}, {0, 2}, {3}, {3}}},
      {"contracting_orders_differ", {4, 3, 5}, {5, 3, 6}, {{}, {}, {1, 2}, {1, 0}}},
      {"both_transposed", {16, 4}, {6, 16}, {{}, {}, {0}, {1}}},
      {"lhs_batch_not_leading", {3, 2, 4}, {2, 4, 5}, {{1}, {0}, {2}, {1}}},
      {"batch_listed_in_reverse", {2, 3, 4, 5}, {3, 2, 5, 6}, {{1, 0}, {0, 1}, {3}, {2}}},
      {"unit_dims", {1, 4, 1, 8}, {8, 1, 3}, {{}, {}, {3}, {0}}},
      {"vector_dot", {16}, {16}, {{}, {}, {0}, {0}}},
      {"outer_product", {5}, {7}, {{}, {}, {}, {}}},
      {"large", {4, 128, 256}, {384, 256}, {{}, {}, {2}, {1}}},
      {"large_weight_gradient", {4, 128, 384}, {4, 128, 256}, {{}, {}, {0, 1}, {0, 1}}},
  };
}

// One dot_general node over fresh parameters, in `f`.
Node* BuildDot(Function& f, const DotCase& c, DType in, DType out) {
  Builder b(&f);
  Node* a = *b.Parameter("a", {in, c.a_dims});
  Node* x = *b.Parameter("b", {in, c.b_dims});
  absl::StatusOr<Node*> dot = b.Named("dot").DotGeneral(a, x, c.dims, out);
  EXPECT_TRUE(dot.ok()) << c.name << ": " << dot.status();
  EXPECT_TRUE(b.Return({*dot}).ok());
  return *dot;
}

TEST(GemmLayout, CommonTransformerLayoutsNeedNoCopies) {
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
      absl::StatusOr<GemmLayout> g = AnalyzeDotGeneral(*BuildDot(f, c, DType::kBF16, DType::kF32));
      ASSERT_TRUE(g.ok()) << g.status();
      EXPECT_EQ(std::vector<int64_t>({g->batch, g->m, g->n, g->k}), std::vector<int64_t>({e.batch, e.m, e.n, e.k})) << e.name;
      EXPECT_EQ(g->a_k_inner, e.a_k_inner) << e.name;
      EXPECT_EQ(g->b_k_inner, e.b_k_inner) << e.name;
      EXPECT_TRUE(g->a_permutation.empty() && g->b_permutation.empty()) << e.name;
    }
  }
}

TEST(GemmLayout, UngroupedOperandsAreTransposedFirst) {
  struct Expect { const char* name; std::vector<int64_t> a_perm, b_perm; };
  for (const Expect& e : {Expect{"batch_dims_apart", {0, 2, 1, 3}, {0, 2, 1, 3}},
                          Expect{"contracting_orders_differ", {0, 2, 1}, {}},  // a is smaller: a follows b's order
                          Expect{"lhs_batch_not_leading", {1, 0, 2}, {}},
                          Expect{"batch_listed_in_reverse", {1, 0, 2, 3}, {}}}) {
    for (const DotCase& c : DotCases()) {
      if (c.name != e.name) continue;
      Function f(c.name);
      absl::StatusOr<GemmLayout> g = AnalyzeDotGeneral(*BuildDot(f, c, DType::kF32, DType::kF32));
      ASSERT_TRUE(g.ok()) << g.status();
      EXPECT_EQ(g->a_permutation, e.a_perm) << e.name;
      EXPECT_EQ(g->b_permutation, e.b_perm) << e.name;
    }
  }
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
      absl::StatusOr<std::vector<HostTensor>> got = EvaluateOnGpu(f, args, *Device(), {.poison_arena = true});
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
    absl::StatusOr<std::vector<HostTensor>> got = EvaluateOnGpu(f, args, *Device(), {.poison_arena = true});
    ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
    EXPECT_EQ((*got)[0].values(), (*want)[0].values());
  }
}

TEST(GpuGemm, PlansCountTransposesAndWorkspace) {
  KILN_REQUIRE_GPU();
  for (const DotCase& c : DotCases()) {
    Function f(c.name);
    Node* dot = BuildDot(f, c, DType::kBF16, DType::kF32);
    absl::StatusOr<std::unique_ptr<GemmPlan>> plan = GemmPlan::Create(*dot, *Device(), {.arch = Device()->arch()}, nullptr);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const GemmLayout& g = (*plan)->layout();
    const int copies = !g.a_permutation.empty() + !g.b_permutation.empty();
    EXPECT_EQ((*plan)->transpose_kernels() > 0, copies > 0) << c.name;
    // Each transposed operand is held in scratch next to the workspace.
    int64_t copy_bytes = 0;
    if (!g.a_permutation.empty()) copy_bytes += dot->operand(0)->type().num_bytes();
    if (!g.b_permutation.empty()) copy_bytes += dot->operand(1)->type().num_bytes();
    EXPECT_GE((*plan)->scratch_bytes(), copy_bytes) << c.name;
  }
}

TEST(GpuGemm, UnsupportedDTypesFailNamingTheNode) {
  KILN_REQUIRE_GPU();
  Function f("int_dot");
  Node* dot = BuildDot(f, DotCases()[0], DType::kF8E4M3, DType::kF32);  // FP8 GEMMs are not planned yet
  absl::StatusOr<std::unique_ptr<GemmPlan>> plan = GemmPlan::Create(*dot, *Device(), {.arch = Device()->arch()}, nullptr);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(plan.status().message().find("%dot (dot_general)"), absl::string_view::npos) << plan.status();
}

}  // namespace
}  // namespace kiln
