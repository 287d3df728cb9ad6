// kernels/gemv.cuh's SmallMGemm on the GPU against the reference's gemm (ir/op_table.h):
// exactly, where the operands are small integers (every f32 sum is then exact, whatever its
// order); within the f32 accumulation bound, where they are random. Every geometry the
// lowering picks (m 1, 2-4, 5-8), each operand dtype, an f32 D, alpha, and N and K that
// leave the last warp and the last unrolled chunk group partly past the end.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/lower_gemv.h"
#include "ir/builder.h"
#include "ir/reference_backend.h"

#ifdef KILN_WITH_CUDA
#include "frontends/gpu_compile.h"
#include "tests/testing/gpu.h"
#include "tests/testing/lowered_for_gpu.h"
#endif

namespace kiln {
namespace {

#ifdef KILN_WITH_CUDA

struct Case {
  int64_t m, n, k;
  DType ab, d;
  double alpha;
  double beta = 0;  // != 0: D = alpha A B + beta C
};

std::string Name(const Case& c) {
  return absl::StrCat("m ", c.m, " n ", c.n, " k ", c.k, " ", DTypeName(c.ab), " -> ", DTypeName(c.d), " alpha ",
                      c.alpha, " beta ", c.beta);
}

std::unique_ptr<Module> GemmModule(const Case& c) {
  auto module = std::make_unique<Module>("m");
  Builder b(module->AddFunction("f"));
  Node* a = *b.Parameter("a", {c.ab, {c.m, c.k}});
  Node* w = *b.Parameter("w", {c.ab, {c.n, c.k}});
  const TensorType out{c.d, {c.m, c.n}};
  std::vector<Node*> operands = {a, w};
  if (c.beta != 0) operands.push_back(*b.Parameter("c", out));
  Node* d = *b.Op(Opcode::kGemm, operands,
                  AttrMap{{"batch", int64_t{1}}, {"m", c.m}, {"n", c.n}, {"k", c.k}, {"a_layout", Symbol{"mk"}},
                          {"b_layout", Symbol{"nk"}}, {"alpha", c.alpha}, {"beta", c.beta}, {"epilogue", Symbol{"none"}}},
                  &out);
  EXPECT_TRUE(b.Return({d}).ok());
  return module;
}

HostTensor Values(TensorType type, uint64_t seed, bool integers) {
  std::mt19937_64 rng(seed);
  std::vector<double> v(static_cast<size_t>(type.num_elements()));
  for (double& x : v) {
    x = integers ? static_cast<double>(static_cast<int64_t>(rng() % 7) - 3)
                 : std::uniform_real_distribution<double>(-2.0, 2.0)(rng);
  }
  return HostTensor::FromValues(type, std::move(v));  // rounds to the dtype
}

// One ulp of `dtype` at |v| (for the D rounding two f32 sums a few ulps apart may straddle).
double UlpOf(DType dtype, double v) {
  const int mantissa = dtype == DType::kBF16 ? 7 : dtype == DType::kF16 ? 10 : 23;
  return std::ldexp(1.0, std::ilogb(std::max(std::abs(v), 1e-30)) - mantissa);
}

TEST(GpuGemv, SmallMGemmMatchesTheReference) {
  KILN_REQUIRE_GPU();
  const std::vector<Case> cases = {
      {1, 2048, 5632, DType::kBF16, DType::kBF16, 1.0},  // llama-M's down projection at batch 1
      {1, 300, 2560, DType::kBF16, DType::kF32, 0.5},    // a second, partial group of unrolled chunks
      {3, 37, 64, DType::kBF16, DType::kF32, 1.0},
      {4, 40, 2048, DType::kF16, DType::kF16, 1.0},
      {8, 1030, 2048, DType::kBF16, DType::kBF16, 1.0},  // 4 rows a warp: the last warp has 2 past N
      {5, 9, 16, DType::kF32, DType::kF32, 2.0},
      {1, 2048, 2048, DType::kBF16, DType::kF32, 1.0, 1.0},  // the o projection adding into the residual
      {8, 2048, 5632, DType::kBF16, DType::kF32, 1.0, 1.0},  // the down projection at batch 8
      {2, 33, 64, DType::kF16, DType::kF16, 0.5, -2.0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(Name(c));
    std::unique_ptr<Module> module = GemmModule(c);
    const Function& f = *module->functions()[0];
    std::unique_ptr<Module> lowered = testing::LoweredForGpu(f);
    for (const auto& n : lowered->functions()[0]->nodes()) {
      if (n->opcode() == Opcode::kGemm) EXPECT_EQ(codegen::SmallMGemmRefusal(*n, {}), "") << "runs on cuBLASLt";
    }
    for (bool integers : {true, false}) {
      std::vector<HostTensor> args = {Values({c.ab, {c.m, c.k}}, 11, integers), Values({c.ab, {c.n, c.k}}, 12, integers)};
      if (c.beta != 0) args.push_back(Values({c.d, {c.m, c.n}}, 13, integers));
      absl::StatusOr<std::vector<HostTensor>> want = EvaluateFunction(f, args);
      ASSERT_TRUE(want.ok()) << want.status();
      absl::StatusOr<std::vector<HostTensor>> got =
          EvaluateOnGpu(*lowered->functions()[0], args, *testing::TestDevice(), {.poison_arena = true});
      ASSERT_TRUE(got.ok()) << got.status();
      const HostTensor &g = (*got)[0], &w = (*want)[0];
      int64_t bad = 0;
      double worst = 0;
      for (int64_t i = 0; i < c.m; ++i) {
        for (int64_t j = 0; j < c.n; ++j) {
          const int64_t at = i * c.n + j;
          double bound = 0;
          if (!integers) {
            // Both sides sum K f32 products in some order: each within K * 2^-24 * sum |a b|
            // of the exact sum; then D's rounding, which may go either way between them.
            double abs_sum = 0;
            for (int64_t x = 0; x < c.k; ++x) abs_sum += std::abs(args[0][i * c.k + x] * args[1][j * c.k + x]);
            // With C, the f32 sum t + beta C rounds once more on each side.
            const double cterm = c.beta != 0 ? std::abs(c.beta * args[2][at]) : 0.0;
            bound = 2.0 * static_cast<double>(c.k) * 0x1p-24 * std::abs(c.alpha) * abs_sum +
                    0x1p-23 * (std::abs(w[at]) + cterm) + UlpOf(c.d, w[at]);
          }
          const double diff = std::abs(g[at] - w[at]);
          worst = std::max(worst, diff);
          if (!(diff <= bound)) {
            if (bad++ < 5) ADD_FAILURE() << (integers ? "integers" : "random") << ": D[" << i << ", " << j << "] = " << g[at] << ", reference " << w[at] << " (bound " << bound << ")";
          }
        }
      }
      EXPECT_EQ(bad, 0);
      std::printf("[ %s, %s ] max |gpu - reference| %.3g\n", Name(c).c_str(), integers ? "integers" : "random", worst);
    }
  }
}

#else
TEST(GpuGemv, NeedsTheCudaToolkit) { GTEST_SKIP() << "built without the CUDA toolkit"; }
#endif

}  // namespace
}  // namespace kiln
