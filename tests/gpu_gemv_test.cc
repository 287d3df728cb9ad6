// kernels/gemv.cuh's SmallMGemm on the GPU against the reference's gemm (ir/op_table.h):
// exactly, where the operands are small integers (every f32 sum is then exact, whatever its
// order); within the f32 accumulation bound, where they are random. Every geometry the
// lowering picks (m 1, 2-4, 5-8), each operand dtype, an f32 D, alpha, and N and K that
// leave the last warp and the last unrolled chunk group partly past the end. And the two
// kernels of a gemv_norm_gemv fusion (passes/fuse_norm_between_gemvs.h) against the reference's
// gemm, norm and gemm, run three times by one executable (the sums cleared by their last reader).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "codegen/lower_gemv.h"
#include "ir/builder.h"
#include "ir/fusion.h"
#include "ir/reference_backend.h"
#include "ir/text_format.h"

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
      if (n->opcode() == Opcode::kGemm) {
        EXPECT_EQ(codegen::SmallMGemmRefusal(*n, {}), "") << "runs on cuBLASLt";
      }
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


// A gemv_norm_gemv fusion as the pass makes it in a decode step: x = h wo^T + r (f32, the
// residual stream), A = rms_norm(x, wn) in bf16, and y = A w2^T (f32, as qkv) or, with `glu`,
// SwiGLU(A w2^T) in bf16 (as gate/up, w2 holding 2F rows). Returns x and y. The norm's weight
// is f32 (as the presets') in the plain cases and bf16 in the GLU ones (both RunNormedA forms).
struct NormCase {
  int64_t m, k, d, n;  // h is [m, k]; x [m, d]; w2 [n, d]
  bool glu;
};

std::string NormName(const NormCase& c) {
  return absl::StrCat("m ", c.m, " k ", c.k, " d ", c.d, " n ", c.n, c.glu ? " glu" : " plain");
}

std::string NormModuleText(const NormCase& c) {
  const std::string m = absl::StrCat(c.m), k = absl::StrCat(c.k), d = absl::StrCat(c.d), n = absl::StrCat(c.n);
  const std::string f = absl::StrCat(c.n / 2);
  const std::string wn_dtype = c.glu ? "bf16" : "f32";
  const std::string y_type = c.glu ? absl::StrCat("bf16[", m, ",", f, "]") : absl::StrCat("f32[", m, ",", n, "]");
  // The function's parameters, and the body's (the same, one level further in).
  auto params = [&](absl::string_view indent) {
    return absl::StrCat(indent, "%h = parameter() {index=0} : bf16[", m, ",", k, "]\n", indent,
                        "%wo = parameter() {index=1} : bf16[", d, ",", k, "]\n", indent,
                        "%r = parameter() {index=2} : f32[", m, ",", d, "]\n", indent,
                        "%wn = parameter() {index=3} : ", wn_dtype, "[", d, "]\n", indent,
                        "%w2 = parameter() {index=4} : bf16[", n, ",", d, "]\n");
  };
  std::string body = absl::StrCat(
      params("    "), "    %x = gemm(%h, %wo, %r) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=1.0, epilogue=none, k=",
      k, ", m=", m, ", n=", d, "} : f32[", m, ",", d, "]\n",
      "    %a = rms_norm(%x, %wn) {eps=1e-05, out_dtype=bf16} : bf16[", m, ",", d, "]\n");
  if (c.glu) {
    absl::StrAppend(&body, "    %gu = gemm(%a, %w2) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=", d,
                    ", m=", m, ", n=", n, "} : bf16[", m, ",", n, "]\n", "    %g = slice(%gu) {limit=[", m, ",", f,
                    "], start=[0,0], stride=[1,1]} : ", y_type, "\n", "    %u = slice(%gu) {limit=[", m, ",", n,
                    "], start=[0,", f, "], stride=[1,1]} : ", y_type, "\n", "    %s = sigmoid(%g) : ", y_type, "\n",
                    "    %t = mul(%g, %s) : ", y_type, "\n", "    %y = mul(%t, %u) : ", y_type, "\n");
  } else {
    absl::StrAppend(&body, "    %y = gemm(%a, %w2) {a_layout=mk, alpha=1.0, b_layout=nk, batch=1, beta=0.0, epilogue=none, k=", d,
                    ", m=", m, ", n=", n, "} : ", y_type, "\n");
  }
  return absl::StrCat("module @m\nfunc @main {\n", params("  "), "  %x, %y = fusion(%h, %wo, %r, %wn, %w2) {kind=gemv_norm_gemv} : (f32[",
                      m, ",", d, "], ", y_type, ") {\n", body, "    return %x, %y\n  }\n  return %x, %y\n}\n");
}

// The f32 accumulation bound of a K-term dot product on both sides (as above), and D's rounding.
double DotBound(int64_t k, double abs_sum, double want, DType d) {
  return 2.0 * static_cast<double>(k) * 0x1p-24 * abs_sum + 0x1p-23 * std::abs(want) + UlpOf(d, want);
}

double Silu(double g) { return g / (1.0 + std::exp(-g)); }

TEST(GpuGemv, NormBetweenGemvsMatchesTheReference) {
  const std::vector<NormCase> cases = {
      {1, 5632, 2048, 4096, false},  // llama-M: down, the next layer's norm and its qkv
      {1, 2048, 2048, 11264, true},  // llama-M: o, the norm and the gate/up GEMV with its SwiGLU
      {3, 320, 264, 136, false},     // rows past the last warp's, a partial chunk group
      {8, 256, 512, 200, true},
  };
  for (const NormCase& c : cases) {
    SCOPED_TRACE(NormName(c));
    // The CPU half: the text parses, the verifier takes the fusion, its body matches the form.
    absl::StatusOr<std::unique_ptr<Module>> module = ParseModule(NormModuleText(c));
    ASSERT_TRUE(module.ok()) << module.status() << "\n" << NormModuleText(c);
    const Function& f = *(*module)->functions()[0];
    const Node* fusion = f.outputs()[0]->operand(0);
    ASSERT_EQ(fusion->opcode(), Opcode::kFusion);
    absl::StatusOr<GemvNormGemvOps> ops = MatchGemvNormGemv(*fusion->body());
    ASSERT_TRUE(ops.ok()) << ops.status();
    EXPECT_EQ(ops->glu.out != nullptr, c.glu);
  }
  KILN_REQUIRE_GPU();
  for (const NormCase& c : cases) {
    SCOPED_TRACE(NormName(c));
    std::unique_ptr<Module> module = *ParseModule(NormModuleText(c));
    const Function& f = *module->functions()[0];
    const std::vector<HostTensor> args = {
        Values({DType::kBF16, {c.m, c.k}}, 21, false), Values({DType::kBF16, {c.d, c.k}}, 22, false),
        Values({DType::kF32, {c.m, c.d}}, 23, false), Values({c.glu ? DType::kBF16 : DType::kF32, {c.d}}, 24, false),
        Values({DType::kBF16, {c.n, c.d}}, 25, false)};
    absl::StatusOr<std::vector<HostTensor>> want = EvaluateFunction(f, args);
    ASSERT_TRUE(want.ok()) << want.status();

    absl::StatusOr<std::unique_ptr<CudaExecutable>> exe =
        CompileForGpu(f, *testing::TestDevice(), {.poison_arena = true});
    ASSERT_TRUE(exe.ok()) << exe.status();
    for (size_t i = 0; i < args.size(); ++i) ASSERT_TRUE((*exe)->SetInput(static_cast<int64_t>(i), args[i]).ok());
    std::vector<HostTensor> first;
    for (int run = 0; run < 3; ++run) {
      ASSERT_TRUE((*exe)->Run().ok());
      std::vector<HostTensor> got;
      for (int i = 0; i < 2; ++i) {
        absl::StatusOr<HostTensor> out = (*exe)->Output(i);
        ASSERT_TRUE(out.ok()) << out.status();
        got.push_back(*std::move(out));
      }
      if (run > 0) {
        // The sums each run adds up were cleared by the last block to read them.
        for (int i = 0; i < 2; ++i) {
          int64_t differ = 0;
          for (int64_t e = 0; e < got[i].type().num_elements(); ++e) differ += got[i][e] != first[i][e];
          EXPECT_EQ(differ, 0) << "run " << run << ", output " << i << ": not the first run's bits";
        }
        continue;
      }
      first = got;
      const HostTensor &h = args[0], &wo = args[1], &r = args[2], &wn = args[3], &w2 = args[4];
      const HostTensor &x = (*want)[0], &y = (*want)[1];
      // x, as the gemm test bounds it (the C term rounding once more on each side).
      int64_t bad = 0;
      double worst_x = 0, worst_y = 0;
      std::vector<double> a(static_cast<size_t>(c.d));
      for (int64_t i = 0; i < c.m; ++i) {
        double squares = 0;
        for (int64_t j = 0; j < c.d; ++j) {
          double abs_sum = 0;
          for (int64_t t = 0; t < c.k; ++t) abs_sum += std::abs(h[i * c.k + t] * wo[j * c.k + t]);
          const int64_t at = i * c.d + j;
          const double bound = DotBound(c.k, abs_sum, x[at], DType::kF32) + 0x1p-23 * std::abs(r[at]);
          const double diff = std::abs(got[0][at] - x[at]);
          worst_x = std::max(worst_x, diff);
          if (!(diff <= bound) && bad++ < 5) ADD_FAILURE() << "x[" << i << ", " << j << "] = " << got[0][at] << ", reference " << x[at] << " (bound " << bound << ")";
          squares += x[at] * x[at];
        }
        // The norm's rows, unrounded: the reference rounds A to bf16 and the GPU does not (it
        // scales its sums by r), so each element of A may be up to one bf16 ulp away (and r,
        // from an integer sum of squares of x within its bound, a little more).
        const double rms = 1.0 / std::sqrt(squares / static_cast<double>(c.d) + 1e-5);
        for (int64_t j = 0; j < c.d; ++j) a[j] = x[i * c.d + j] * rms * wn[j];
        const int64_t width = c.glu ? c.n / 2 : c.n;
        for (int64_t j = 0; j < width; ++j) {
          // The second gemm's rows j (and j + F, up, with the SwiGLU): value, and bound.
          auto dot = [&](int64_t row, double* bound) {
            double v = 0, abs_sum = 0, ulps = 0;
            for (int64_t t = 0; t < c.d; ++t) {
              v += a[t] * w2[row * c.d + t];
              abs_sum += std::abs(a[t] * w2[row * c.d + t]);
              ulps += std::abs(w2[row * c.d + t]) * UlpOf(DType::kBF16, a[t]);
            }
            *bound = DotBound(c.d, abs_sum, v, c.glu ? DType::kBF16 : DType::kF32) + ulps;
            return v;
          };
          const int64_t at = i * width + j;
          double bound = 0;
          if (!c.glu) {
            dot(j, &bound);
          } else {
            double bg = 0, bu = 0;
            const double g = dot(j, &bg), u = dot(j + width, &bu);
            const double s = 1.0 / (1.0 + std::exp(-g));
            // silu' is within [-0.1, 1.1]; each of the SwiGLU's three bf16 ops rounds on each side.
            bound = 1.1 * (std::abs(u) + bu) * bg + (std::abs(Silu(g)) + 1.1 * bg) * bu +
                    2.0 * (UlpOf(DType::kBF16, s) * std::abs(g * u) + UlpOf(DType::kBF16, g * s) * std::abs(u) +
                           UlpOf(DType::kBF16, y[at]));
          }
          const double diff = std::abs(got[1][at] - y[at]);
          worst_y = std::max(worst_y, diff);
          if (!(diff <= bound) && bad++ < 5) ADD_FAILURE() << "y[" << i << ", " << j << "] = " << got[1][at] << ", reference " << y[at] << " (bound " << bound << ")";
        }
      }
      EXPECT_EQ(bad, 0);
      std::printf("[ %s ] max |gpu - reference|: x %.3g, y %.3g\n", NormName(c).c_str(), worst_x, worst_y);
    }
  }
}

#else
TEST(GpuGemv, NeedsTheCudaToolkit) { GTEST_SKIP() << "built without the CUDA toolkit"; }
#endif

}  // namespace
}  // namespace kiln
